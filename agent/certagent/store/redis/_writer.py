"""How a RedisStore writes: one interface, two strategies, picked once when the store is made.

* :class:`~certagent.store.redis._single.SingleNodeWriter` -- one Redis, plain or
  Sentinel: every write is one MULTI/EXEC (WATCHing what it read first) or one
  Lua script;
* :class:`~certagent.store.redis._cluster.ClusterWriter` -- a Redis Cluster, where
  a record's keys live in several slots: ordered, idempotent one-slot steps.

Both write the same records and events (:mod:`certagent.store.redis._records`),
so a reader cannot tell them apart.  redis-py's connection errors escape a
writer (the store translates them, :func:`~certagent.store.redis._connection.redis_errors`);
the agent's own errors (NotFound, DuplicateCertificate, StoreError) are raised
as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.errors import DuplicateCertificate, LeaseLost, StoreError
from certagent.store.base import AddAlone, CertRecord, IdTaken, PreparedRecord, WireRecord
from certagent.store.issuance import Lease
from certagent.store.issuing import lease_lost
from certagent.store.redis._addscript import AddCall
from certagent.store.redis._renewals import Scheduled

__all__ = [
    "ATTEMPTS",
    "AddOutcome",
    "Fence",
    "FormatMoved",
    "RecordWriter",
    "Stored",
    "WireOutcome",
    "WireWriter",
    "duplicate",
]

#: Attempts of a write whose keys keep changing under it (or whose random id is taken).
ATTEMPTS = 5


@dataclass(frozen=True)
class Stored:
    """The leaf is already stored, as record ``owner``."""

    owner: str


@dataclass(frozen=True)
class FormatMoved:
    """The record was encoded in a store format that is no longer the active one
    (``fleet finalize`` ran meanwhile): nothing was written; encode it in ``active``."""

    active: int


@dataclass(frozen=True)
class Fence:
    """An add that may commit only while ``key`` (a lease, on ``{global}``) holds ``value``.

    :meth:`~certagent.store.issuance.IssueLocks.add_issued`: a writer checks it
    atomically with the add's commit point and gives :meth:`lost` (a LeaseLost,
    which is a StoreError) instead of writing.  ``renew``: a schedule entry the
    same commit writes (``add_issued(..., renew_at=...)``), so a lost lease
    schedules nothing either.
    """

    key: str
    value: str
    lease: Lease
    renew: Scheduled | None = None

    def lost(self, holder: bytes | str | None) -> LeaseLost:
        """The outcome when ``key`` holds ``holder`` instead (None: nothing)."""
        return lease_lost(self.lease, holder)


#: What adding one prepared record gave.
AddOutcome = CertRecord | Stored | IdTaken | FormatMoved | StoreError
#: What adding one record packed ahead gave (the record itself: added).
WireOutcome = WireRecord | Stored | IdTaken | AddAlone | FormatMoved | StoreError


class RecordWriter(Protocol):
    """Every write of a :class:`~certagent.store.redis.RedisStore`; ids validated by the store."""

    async def add(self, prepared: PreparedRecord, fence: Fence | None = None) -> AddOutcome:
        """Add one new record (``RedisStore.add``): its record, Stored, IdTaken, FormatMoved
        (one Redis: the store's format is no longer ``prepared.layout``) or StoreError.

        With ``fence``, only if the fence holds when the record becomes visible
        (``fence.lost(...)`` otherwise, nothing a reader sees left behind).
        """
        ...

    async def add_batch(self, records: Sequence[PreparedRecord]) -> list[AddOutcome]:
        """Add many new records in few round trips (bulk adds); one outcome each, in order.

        Each record is written entirely or not at all, with its ``put`` event.
        """
        ...

    async def replace(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime, layout: int
    ) -> CertRecord:
        """Record ``cert_id`` now holds ``bundle``: id kept, version + 1, a ``put`` event.

        Written in store format ``layout``, the store's active one (one Redis checks
        it in the write's transaction and takes the one it finds).  NotFound if there
        is no such record; DuplicateCertificate if another record holds that leaf.
        """
        ...

    async def delete(self, cert_id: str) -> CertRecord:
        """Remove record ``cert_id``, its names and index entries, with a ``delete`` event."""
        ...

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` against the record's chain, keep it with the record, a ``put`` event.

        StoreError if the record was replaced meanwhile (the response may be
        about the old certificate).
        """
        ...

    async def set_key(self, cert_id: str, token: bytes, fresh: bytes) -> bool:
        """Swap a record's encrypted key for ``fresh`` if it still holds ``token``.

        For ``certagent keys rotate``: the record's version and the change feed
        are left alone (the certificate did not change).  False if the record
        changed (or went) meanwhile.
        """
        ...


class WireWriter(Protocol):
    """A writer that also takes writes packed ahead (:class:`~._single.SingleNodeWriter`)."""

    def add_call(self) -> AddCall | None:
        """What packs a record's add for :meth:`add_wire`; None: use ``add_batch``."""
        ...

    async def add_wire(self, records: Sequence[WireRecord]) -> list[WireOutcome]:
        """Add records packed by :meth:`add_call`'s ``AddCall``; one outcome each, in order."""
        ...


def duplicate(
    sha256: str, owner: str, advice: str = "replace or delete that record instead"
) -> DuplicateCertificate:
    return DuplicateCertificate(
        f"this certificate (sha256 {sha256}) is already stored as {owner}; {advice}"
    )
