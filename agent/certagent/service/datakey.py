"""The data key and the fleet: agents say which keys they hold, writers use one of them.

Private keys in a Redis store are encrypted with the current data key of the
writer's key file (:mod:`certagent.certs.keycrypt`).  An agent whose key file
lacks that key cannot load the record: it would answer "unknown" and HAProxy
serve the default certificate.  So:

* at start, :func:`check_data_key` refuses a key file that cannot decrypt the
  records already stored;
* while it runs, an agent announces the key ids it holds (:class:`Announcer`,
  a beat every :data:`BEAT` s that lapses after :data:`TTL` s);
* before writing, the CLI and the REST API check that every agent that
  announced itself holds the writer's current key (:class:`FleetKeys`): one
  read of O(agents) per write, or per ``cert import``; otherwise
  :class:`~certagent.errors.ForeignDataKey`, naming both keys, and nothing
  is written.  With no agent running, a writer whose key file lacks a key the
  stored records use is refused the same way (a sample of them: two reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from certagent.certs.keycrypt import KeyRing, held_ids
from certagent.certs.pem import CertBundle
from certagent.config import Settings
from certagent.errors import AgentError, ConfigError, ForeignDataKey, StoreError
from certagent.store.base import CertRecord, DataKeys, Store, Writer
from certagent.store.view import StoreView

__all__ = [
    "BEAT",
    "TTL",
    "Announcer",
    "FleetKeys",
    "KeyCheckedWriter",
    "check_data_key",
    "foreign_key",
    "key_checked",
]

log = logging.getLogger(__name__)

#: Seconds between two announcements of the keys an agent holds.
BEAT = 20.0
#: Seconds an announcement lasts: a stopped agent's goes at once, a killed one's after this.
TTL = 3 * BEAT
#: Agents named in a refusal at most.
_NAMED = 5


async def check_data_key(store: Store, settings: Settings) -> None:
    """ConfigError naming the missing data key if the store uses one its key ring lacks.

    Samples 32 random records and the ticket-key ring (O(1) whatever the
    store's size).  A store that cannot be reached now is only logged: the
    check needs an answer, and the agent must still start to serve what HAProxy
    holds.  Nothing to check for a store that keeps no encrypted keys (a
    directory: :meth:`~certagent.store.base.Store.data_keys` is None).
    """
    keys = store.data_keys()
    if keys is None:
        return
    ring = keys.keyring
    try:
        used = await keys.key_ids_in_use()
    except StoreError as exc:
        log.warning("cannot check the data key against %s yet: %s", store.describe(), exc)
        return
    known = set(ring.kids) if ring is not None else set()
    missing = sorted(used - known)
    if not missing:
        return
    where = settings.key_file or "(no key_file configured)"
    raise ConfigError(
        f"the store {store.describe()} holds private keys encrypted with data key"
        f" {', '.join(missing)}, which {where} lacks (it has {', '.join(sorted(known)) or 'none'}):"
        " this node was probably made with its own `certagent init`. Copy the fleet's data key"
        f" file over {where} (or move it away and re-run `certagent init DIR ... --data-key"
        " FLEET_KEY_FILE --force`), then start again. Keep that file safe: losing it loses"
        " every private key in the store."
    )


# --- the writer's side ------------------------------------------------------------------------


def foreign_key(
    ring: KeyRing, key_file: str, holders: dict[str, frozenset[str]], used: Iterable[str] = ()
) -> ForeignDataKey | None:
    """Why a record encrypted with ``ring``'s current key would be unreadable; None if it would not.

    ``holders``: running agent -> what it announced
    (:func:`~certagent.certs.keycrypt.held_ids`: a kid, or ``kid=fingerprint``
    for a hand-named one, so two different keys both named ``k1`` do not
    pass for one).  With no agent, ``used`` (the kids of stored records)
    stands in: a key file lacking one of them is not the fleet's.  Pure.
    """
    mine = held_ids(ring)[0]
    where = key_file or "this key file"
    if holders:
        lacking = sorted(node for node, held in holders.items() if mine not in held)
        if not lacking:
            return None
        fleet = tuple(sorted(frozenset.intersection(*holders.values())))
        named = ", ".join(lacking[:_NAMED]) + (
            f" and {len(lacking) - _NAMED} more" if len(lacking) > _NAMED else ""
        )
        theirs = (
            f"data key {', '.join(map(_shown, fleet))}"
            if fleet
            else "no data key in common (see each agent's in `certagent status`)"
        )
        return ForeignDataKey(
            f"refusing to store: {where} encrypts with data key {_shown(mine)}, which"
            f" {len(lacking)} of the fleet's {len(holders)} running agents ({named}) do not"
            f" hold; they hold {theirs}, and could not serve this certificate. Use the fleet's"
            " key file (--config with the key_file the agents use, or CERTAGENT_KEY_FILE=FILE)"
            f"; or, to move the fleet to {_shown(mine)}, add its line to every agent's key file,"
            " restart them, then run `certagent keys rotate`. Nothing was stored.",
            mine,
            fleet,
        )
    missing = tuple(sorted(set(used) - set(ring.kids)))
    if not missing:
        return None
    return ForeignDataKey(
        f"refusing to store: {where} encrypts with data key {_shown(mine)} and lacks data key"
        f" {', '.join(missing)}, which the stored records use: it is not the fleet's key file,"
        " and the agents could not serve this certificate. Use the fleet's key file (--config"
        " with the key_file the agents use, or CERTAGENT_KEY_FILE=FILE); or, to move the fleet"
        " to a new key, add its line first to the fleet's key file and run `certagent keys"
        " rotate`. Nothing was stored.",
        mine,
        missing,
    )


def _shown(held: str) -> str:
    """``k1=k3fa9c1e2b7d0`` -> ``k1 (fingerprint k3fa9c1e2b7d0)``; a fingerprint kid as it is."""
    kid, _, fingerprint = held.partition("=")
    return f"{kid} (fingerprint {fingerprint})" if fingerprint else kid


class FleetKeys:
    """Whether the fleet can read what this writer encrypts: :func:`foreign_key` on the store."""

    def __init__(self, keys: DataKeys, key_file: str) -> None:
        self._keys = keys
        self._key_file = key_file

    async def check(self) -> None:
        """ForeignDataKey if a record written now would be unreadable to the fleet.

        One read of O(agents); with no agent announced, two more (a sample of
        32 records).  A writer without a key ring is left to the store (it
        refuses to encrypt, naming key_file).
        """
        ring = self._keys.keyring
        if ring is None:
            return
        holders = await self._keys.fleet_key_ids()
        used = await self._keys.key_ids_in_use() if not holders else set()
        refusal = foreign_key(ring, self._key_file, holders, used)
        if refusal is not None:
            raise refusal


class KeyCheckedWriter:
    """A :class:`~certagent.store.base.Writer` that runs :meth:`FleetKeys.check` before each put.

    The agent's REST API writes through it; a refusal is logged (the agent's
    key file is the one to fix) as well as answered.
    """

    def __init__(self, writer: Writer, fleet: FleetKeys) -> None:
        self._writer = writer
        self._fleet = fleet

    async def _check(self) -> None:
        try:
            await self._fleet.check()
        except ForeignDataKey as exc:
            log.warning("an upload through the REST API: %s", exc)
            raise

    async def put(self, bundle: CertBundle) -> str:
        await self._check()
        return await self._writer.put(bundle)

    async def add(self, bundle: CertBundle) -> CertRecord:
        await self._check()
        return await self._writer.add(bundle)

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        await self._check()
        return await self._writer.replace(cert_id, bundle)

    async def delete(self, cert_id: str) -> CertRecord:
        return await self._writer.delete(cert_id)


def key_checked(store: Store, key_file: str) -> Store:
    """``store`` whose writes are refused if the fleet could not read them (the REST API's).

    The store itself if it keeps keys unencrypted (a directory).
    """
    keys = store.data_keys()
    if keys is None:
        return store
    return StoreView(store, writer=KeyCheckedWriter(store, FleetKeys(keys, key_file)))


# --- the agent's side -------------------------------------------------------------------------


class Announcer:
    """Tells the store which data keys this agent holds, every :data:`BEAT` s while it runs.

    Its :meth:`status` is this agent's side of ``certagent status``: the keys it
    holds, and the records it met that it could not decrypt.
    """

    def __init__(self, keys: DataKeys, node: str) -> None:
        self._keys = keys
        self.node = node
        ring = keys.keyring
        #: what it announces: :func:`~certagent.certs.keycrypt.held_ids`, current first
        self.key_ids: tuple[str, ...] = held_ids(ring) if ring is not None else ()

    async def announce(self) -> bool:
        """One announcement; False (and a warning) if the store did not take it."""
        try:
            await self._keys.announce(self.node, self.key_ids, TTL)
        except (AgentError, ValueError) as exc:
            log.warning("cannot announce the data keys this agent holds: %s", exc)
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Announce until ``stop`` (then :meth:`withdraw`)."""
        if not self.key_ids:
            return
        announced = False
        while not stop.is_set():
            if await self.announce() and not announced:
                announced = True
                log.info(
                    "announced data key%s %s as node %s",
                    "s" if len(self.key_ids) > 1 else "",
                    " ".join(self.key_ids),
                    self.node,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), BEAT)

    async def withdraw(self) -> None:
        """This agent stops: writers stop checking against its keys (a killed one's lapse)."""
        if not self.key_ids:
            return
        try:
            await self._keys.withdraw(self.node)
        except (AgentError, ValueError) as exc:
            log.warning(
                "cannot withdraw this agent's data keys (they lapse within %.0f s): %s", TTL, exc
            )

    def status(self) -> dict[str, Any]:
        """The keys held, and the records met that did not decrypt (bounded): O(1)."""
        return {
            "node": self.node,
            "key_ids": list(self.key_ids),
            "undecryptable": self._keys.unreadable().snapshot(),
        }
