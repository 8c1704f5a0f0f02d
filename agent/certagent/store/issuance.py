"""What on-demand issuance keeps in the store: small roles a fleet of agents shares.

ACME issuance (:mod:`certagent.service.issuance`) needs, besides certificates: one
ACME account for the fleet, one order per name at a time (a lease with a fencing
token), the challenge answers every node must serve while the CA validates, the
names a platform registered, and the fleet's shared backoff and limits.  A store
offers them through :meth:`certagent.store.base.Store.issuance`: the Redis store
for a fleet, the directory store for its one node.

Every call is O(1) in the number of stored certificates unless its docstring says
otherwise.  Times are Unix seconds (``time.time()``); every method raises
:class:`~certagent.errors.StoreUnavailable` when the store cannot be reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from certagent.certs.pem import CertBundle
from certagent.store.renewals import Renewals
from certagent.store.values import CertRecord

__all__ = [
    "ACME_MANAGED",
    "AccountStore",
    "AcmeAccount",
    "ChallengeBoard",
    "ChallengeKind",
    "DomainRegistry",
    "Issuance",
    "IssueLimits",
    "IssueLocks",
    "Lease",
    "NameState",
    "PublishedChallenge",
    "Registration",
]

#: ``CertRecord.managed`` of a certificate the agent obtained from an ACME CA.
ACME_MANAGED = "acme"

ChallengeKind = Literal["http-01", "tls-alpn-01"]


@dataclass(frozen=True)
class Lease:
    """One node's right to order a certificate for ``name`` until ``expires_at``.

    ``token`` is a fencing token: it grows with every lease the store hands out,
    for any name.  A write carrying a lease that is no longer the name's current
    one (it expired and another node took the name) is refused with
    :class:`~certagent.errors.LeaseLost`, so a node that stalled cannot publish a
    stale result.
    """

    name: str
    node: str
    token: int
    expires_at: float


@dataclass(frozen=True)
class AcmeAccount:
    """The fleet's account at one CA (one per directory URL).

    ``key_pem`` is the account's private key, decrypted (stored encrypted with the
    data key where the store encrypts keys); ``url`` is the account URL the CA gave
    (the JWS ``kid``), None while the key exists but is not registered.
    """

    directory: str
    key_pem: bytes = field(repr=False)
    url: str | None
    contact: tuple[str, ...]
    updated_at: datetime


@dataclass(frozen=True)
class PublishedChallenge:
    """A challenge answer that every node serves until ``expires_at``.

    ``token`` (base64url, validated) names it: the HTTP-01 path's last part, and
    the TLS-ALPN-01 challenge's id.  ``key_authorization`` is ``token.thumbprint``
    (RFC 8555 §8.1): the HTTP-01 body, and what a node hashes into its own
    TLS-ALPN-01 certificate (RFC 8737; each node makes that certificate and its
    throwaway key itself: no key material goes through the store).
    """

    kind: ChallengeKind
    name: str
    token: str
    key_authorization: str
    expires_at: float


@dataclass(frozen=True)
class Registration:
    """A name a platform registered (``certagent domain add``, ``POST /v1/domains``).

    ``issue``: asked to be issued at once rather than on its first connection.
    """

    name: str
    added_at: datetime
    issue: bool = False


@dataclass(frozen=True)
class NameState:
    """Why a name is backing off: ``failures`` in a row, no new order before ``not_before``."""

    failures: int
    not_before: float
    last_error: str


class AccountStore(Protocol):
    """The fleet's ACME account, so that every node orders as one account."""

    async def load_account(self, directory: str) -> AcmeAccount | None:
        """The account for the CA at ``directory``, or None if there is none yet.

        Raises KeyDecryptError if its key was encrypted with a data key this node
        does not hold.
        """
        ...

    async def save_account(self, account: AcmeAccount, *, previous_url: str | None) -> AcmeAccount:
        """Store ``account`` if the stored one's URL is still ``previous_url``; return the stored.

        Compare-and-set: when two nodes register at once (or both see the CA
        forget the account), the first write wins and the second gets the first's
        account back, so the fleet ends with one.  ``previous_url=None`` with no
        stored account creates it.
        """
        ...


class IssueLocks(Protocol):
    """One order per name across the fleet: leases with an expiry and a fencing token."""

    async def acquire(self, name: str, node: str, ttl: float) -> Lease | None:
        """A lease on ``name`` for ``ttl`` seconds, or None while another node holds one."""
        ...

    async def renew(self, lease: Lease, ttl: float) -> Lease | None:
        """Extend ``lease`` to ``ttl`` seconds from now; None if it is no longer held."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give ``lease`` up (a no-op if it already lapsed or is another's)."""
        ...

    async def add_issued(
        self,
        bundle: CertBundle,
        lease: Lease,
        *,
        managed: str = ACME_MANAGED,
        renew_at: float | None = None,
    ) -> CertRecord:
        """Store an issued certificate through the normal write path, fenced by ``lease``.

        The same write as :meth:`~certagent.store.base.Writer.add` (key encrypted,
        change feed, indexes), the record marked ``managed``, but refused with
        LeaseLost, writing nothing that any reader sees, unless ``lease`` is still
        the name's current lease at the moment of the write.  DuplicateCertificate
        as for ``add``.

        With ``renew_at``, the same write also schedules ``lease.name``
        (:class:`~certagent.store.renewals.Renewals`: ``renew_at`` and the new
        certificate's ``not_after``), so a write refused with LeaseLost schedules
        nothing either.
        """
        ...


class ChallengeBoard(Protocol):
    """Challenge answers every node serves, and which nodes are serving them.

    Publishing and withdrawing each append a ``challenge`` change to the feed
    (``Change.id`` = the token, ``names`` = the name being validated), so every
    node adds or removes the answer at once; a node that starts reads
    :meth:`current`.
    """

    async def publish(self, challenge: PublishedChallenge) -> None: ...

    async def withdraw(self, token: str) -> None:
        """Remove the challenge ``token`` (a no-op if it is gone)."""
        ...

    async def get(self, token: str) -> PublishedChallenge | None:
        """The live challenge ``token``, or None (gone or expired)."""
        ...

    async def current(self) -> tuple[PublishedChallenge, ...]:
        """Every live challenge: O(live challenges), bounded by the issuance concurrency."""
        ...

    async def ack(self, token: str, node: str) -> None:
        """``node`` serves the answer for ``token`` now."""
        ...

    async def acks(self, token: str) -> frozenset[str]:
        """The nodes that said they serve ``token``."""
        ...

    async def beat(self, node: str, ttl: float) -> None:
        """``node`` is alive for ``ttl`` more seconds (it answers challenges)."""
        ...

    async def live_nodes(self) -> frozenset[str]:
        """Nodes whose last beat has not lapsed: O(nodes)."""
        ...


class DomainRegistry(Protocol):
    """Names a platform allows, registered through the CLI or the REST API.

    :meth:`register` and :meth:`unregister` append a ``domain`` change to the
    feed (``names`` = the name), so every node's permission cache follows.
    """

    async def register(self, name: str, *, issue: bool = False) -> Registration:
        """Register validated ``name`` (again: updates ``issue``, keeps ``added_at``)."""
        ...

    async def unregister(self, name: str) -> bool:
        """Forget ``name``; False if it was not registered."""
        ...

    async def registration(self, name: str) -> Registration | None: ...

    async def registrations(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[Registration, ...]:
        """Registered names in name order after ``after``, at most ``limit``: O(log N + limit)."""
        ...


class IssueLimits(Protocol):
    """The fleet's shared brakes: per-name backoff, a CA-wide pause, a cap on open orders."""

    async def name_state(self, name: str) -> NameState | None:
        """The backoff of ``name``, or None if its last order did not fail."""
        ...

    async def record_failure(self, name: str, error: str, not_before: float) -> NameState:
        """One more failure of ``name``: no new order before ``not_before``.

        The state lapses on its own some time after ``not_before`` (it is not kept
        for names that stopped being asked for).
        """
        ...

    async def clear_failures(self, name: str) -> None: ...

    async def paused_until(self) -> float:
        """Until when the CA asked the fleet to wait (429/503 ``Retry-After``); 0 if not."""
        ...

    async def pause(self, until: float) -> None:
        """The CA asked to wait until ``until``: keeps the later of this and any pause."""
        ...

    async def take_order_slot(self, name: str, cap: int, ttl: float) -> bool:
        """One of the fleet's ``cap`` open-order slots for ``name`` for ``ttl`` s, if free.

        Slots of holders that died lapse after their ``ttl``.  O(log cap).
        """
        ...

    async def free_order_slot(self, name: str) -> None: ...


@dataclass(frozen=True)
class Issuance:
    """The issuance roles of one store (:meth:`~certagent.store.base.Store.issuance`).

    ``shared``: True when several agents can share these (Redis); False for a
    store that is one node's own (a directory), where issuance works for that
    node only.  ``renewals``: the renewal schedule and budget
    (:mod:`certagent.store.renewals`).
    """

    accounts: AccountStore
    locks: IssueLocks
    challenges: ChallengeBoard
    domains: DomainRegistry
    limits: IssueLimits
    renewals: Renewals
    shared: bool
