"""On-demand issuance assembled: the pieces ``acme_directory`` switches on, and their events.

:func:`build` makes, from the settings, the permission policy, the fleet's ACME
account, the challenge solver and responder, HAProxy's challenge slots and the
:class:`~certagent.service.issuer.Issuer`.  :class:`OnDemand` is what the daemon
holds: it routes the change feed's ``put``/``challenge``/``domain`` changes to
them and sets HAProxy's challenge slots up on each new runtime session.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from dataclasses import dataclass, field

from certagent.acme import TLS_ALPN_01, ExternalAccountBinding
from certagent.acme.csr import key_types
from certagent.api.body import upload_policy
from certagent.config import Settings
from certagent.errors import AgentError, ConfigError
from certagent.runtime.challenges import CHALLENGE_PREFIX, ChallengeSlots
from certagent.runtime.client import RuntimeClient
from certagent.runtime.loader import Loader
from certagent.service.acmeaccount import AccountKeeper, AccountSettings
from certagent.service.budget import BudgetSettings, IssueBudget
from certagent.service.challenges import ChallengeResponder, FleetSolver
from certagent.service.flood import LookupBudget
from certagent.service.issuer import Issuer, IssuerSettings
from certagent.service.permission import Permission, parse_suffixes
from certagent.service.renewer import renewer_settings
from certagent.store.base import Change, Store
from certagent.store.factory import read_secret

log = logging.getLogger(__name__)


def node_name(settings: Settings) -> str:
    """This agent's name in the fleet: ``acme_node``, or host name + a hash of its socket."""
    if settings.acme_node:
        return settings.acme_node
    digest = hashlib.sha256(settings.agent_socket.encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}"


@dataclass
class OnDemand:
    issuer: Issuer
    responder: ChallengeResponder
    slots: ChallengeSlots
    budget: IssueBudget | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def on_change(self, change: Change) -> None:
        """A change from the feed: new certificates wake waiters; challenges; registrations."""
        if change.kind == "put":
            self.issuer.stored(change.names)
        elif change.kind == "challenge":
            await self.responder.changed(change.id)
        elif change.kind == "domain":
            for name in change.names:
                self.issuer.permission.forget(name)
                registration = await self.issuer.issuance.domains.registration(name)
                if registration is not None and registration.issue:
                    self.issuer.request(name)

    async def session(self, client: RuntimeClient) -> None:
        """A new HAProxy session (start, reload, reconnect): slots anew, answers again."""
        await self.slots.setup(client)
        self.responder.forget_served()
        task = asyncio.create_task(self._resync(), name="challenges-resync")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resync(self) -> None:
        try:
            await self.responder.sync()
        except AgentError as exc:
            log.warning("answering live challenges on the new HAProxy session: %s", exc)

    def status(self) -> dict[str, object]:
        out = {**self.issuer.status(), "challenges": self.responder.status()}
        if self.budget is not None:
            out["budget"] = self.budget.status()
        return out

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.issuer.close()


def build(settings: Settings, store: Store, loader: Loader, lookups: LookupBudget) -> OnDemand:
    """The issuance pieces of ``settings`` (``acme_directory`` set); ConfigError if unusable."""
    issuance = store.issuance()
    if issuance is None:
        raise ConfigError(f"the store {store.describe()} cannot keep what issuance needs")
    if CHALLENGE_PREFIX.startswith(settings.slot_prefix):
        raise ConfigError(
            f"slot_prefix {settings.slot_prefix!r} would also name the challenge slots"
            f" ({CHALLENGE_PREFIX}N.pem): use a longer one, e.g. /certagent/slot-"
        )
    node = node_name(settings)
    permission = Permission(
        suffixes=parse_suffixes(settings.acme_allow_suffixes),
        registry=issuance.domains if settings.acme_registered else None,
        ask_url=settings.acme_ask,
        ask_timeout=settings.acme_ask_timeout,
        ask_rate=settings.acme_ask_rate,
        allow_ttl=settings.acme_allow_ttl,
        deny_ttl=settings.acme_deny_ttl,
        store_budget=lookups,
    )
    eab = None
    if settings.acme_eab_kid:
        hmac = read_secret(settings.acme_eab_hmac_file, "ACME external account binding key")
        eab = ExternalAccountBinding.from_b64(settings.acme_eab_kid, hmac)
    accounts = AccountKeeper(
        AccountSettings(
            directory=settings.acme_directory,
            contact=(settings.acme_email,) if settings.acme_email else (),
            ca_file=settings.acme_ca_file or None,
            eab=eab,
        ),
        issuance.accounts,
        issuance.locks,
        node,
    )
    solver = FleetSolver(issuance.challenges, challenge_types=(settings.acme_challenge,))
    budget = IssueBudget(issuance.renewals, BudgetSettings.from_settings(settings))
    issuer = Issuer(
        issuance,
        store,
        permission,
        accounts,
        solver,
        node,
        IssuerSettings(
            key_types=key_types(settings.acme_key_types),
            profile=settings.acme_profile or None,
            concurrency=settings.acme_concurrency,
            order_timeout=settings.acme_order_timeout,
            backoff_min=settings.acme_backoff_min,
            backoff_max=settings.acme_backoff_max,
            policy=upload_policy(settings),
            renew=renewer_settings(settings).policy,
        ),
        budget=budget,
    )
    slots = ChallengeSlots(
        loader,
        map_file=settings.challenge_map,
        crt_list=settings.crt_list,
        slots=settings.challenge_slots if settings.acme_challenge == TLS_ALPN_01 else 0,
    )
    responder = ChallengeResponder(issuance.challenges, slots, node)
    log.info(
        "on-demand issuance from %s as %s: %s challenges, permission by %s",
        settings.acme_directory,
        node,
        settings.acme_challenge,
        "; ".join(permission.describe()),
    )
    return OnDemand(issuer, responder, slots, budget)
