"""Bulk adds to the Redis store: many new records per round trip, each one atomic.

A record is encoded apart from the write
(:class:`~certagent.store.redis._records.RecordEncoder`, pure, picklable: the
import runs it in worker processes next to validation), then written by the
store's writer, many at a time:

* one Redis (:class:`~certagent.store.redis._single.SingleNodeWriter`):
  :data:`~certagent.store.redis._single.ADD_SCRIPT` once per record, ``EVALSHA``
  pipelined ``len(records)`` at a time, so a batch costs one round trip.  One
  script run adds one record exactly as :meth:`RedisStore.add
  <certagent.store.redis.RedisStore.add>` does in its MULTI/EXEC: the chain, the record, the
  fingerprint index, the name sets, both sorted sets and the ``put`` event, or
  nothing at all if the leaf is already stored (the ``fp:`` key).  Redis runs a
  script alone, so no reader sees part of a record, and duplicates inside one
  batch are found like any others: the scripts run in pipeline order.  For
  the import, the worker processes pack each record's ``EVALSHA`` whole
  (:class:`~certagent.store.redis._addscript.AddCall`, hiredis) and
  :meth:`BulkAdds.add_wire` sends the bytes as they are.  A
  script's writes are not rolled back when one of its commands fails, so the
  script checks the type of every key it will write before writing any.  A
  user who may not run scripts (``NOPERM``) gets the same writes as
  WATCH/MULTI/EXEC transactions, one round trip each (logged once).
* a Redis Cluster (:class:`~certagent.store.redis._cluster.ClusterWriter`): the
  ordered steps of an add, each step one cluster pipeline for the whole batch.

Cost: O(records) commands per call, one round trip per call on one Redis (two
the first time, to load the script), about five on a cluster; each record is
O(names of its record + log N) in Redis for N stored certificates (sorted-set
inserts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.errors import StoreError
from certagent.store.base import (
    AddAlone,
    AddResult,
    BulkResult,
    IdTaken,
    PreparedRecord,
    WireRecord,
    WireResult,
)
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._records import RecordEncoder
from certagent.store.redis._writer import (
    ATTEMPTS,
    FormatMoved,
    RecordWriter,
    Stored,
    WireWriter,
    duplicate,
)

__all__ = ["BulkAdds"]


class BulkAdds:
    """:meth:`RedisStore.bulk <certagent.store.redis.RedisStore.bulk>`: many adds per round trip.

    A :class:`~certagent.store.base.BulkWriter`.  Redis errors become the
    agent's (StoreUnavailable, StoreError) here, as in the store's other methods.
    """

    def __init__(
        self,
        writer: RecordWriter,
        shown: str,
        ring_for: Callable[[str], KeyRing],
        now: Callable[[], datetime],
        layout: Callable[[], Awaitable[int]],  # the store's active format (cached on one Redis)
        *,
        wire: WireWriter | None = None,
    ) -> None:
        self._writer = writer
        self._wire = wire
        self.shown = shown
        self._ring_for = ring_for
        self._now = now
        self._layout = layout

    async def encoder(self) -> RecordEncoder:
        """Encodes new records for :meth:`add_prepared` (and, one Redis, :meth:`add_wire`)
        in the store's active format (packed ahead only in format 2).

        ConfigError without a key file; StoreFormatError at a format this release does
        not know.
        """
        ring = self._ring_for("store certificates")
        layout = await self._layout()
        call = self._wire.add_call() if self._wire is not None and layout == 2 else None
        return RecordEncoder(ring, call, layout)

    async def add_many(self, bundles: Sequence[CertBundle]) -> list[AddResult]:
        """Add new records (validated by the caller) in one round trip.

        One result per bundle, in order: its record, DuplicateCertificate if the
        leaf is stored already (or earlier in ``bundles``), or StoreError if it
        cannot be written.  Each record is written as ``RedisStore.add`` writes
        one, atomically, its ``put`` event with it.  Raises StoreUnavailable if
        Redis cannot be reached: records of this call may then be stored or
        not, each entirely or not at all.  An id found taken is drawn again; a
        record encoded in a format the store has left (``fleet finalize`` ran) is
        encoded again in the new one.
        """
        encoder = await self.encoder()
        todo = list(range(len(bundles)))
        results: list[BulkResult | FormatMoved | None] = [None] * len(bundles)
        for _ in range(ATTEMPTS):
            prepared = [encoder.prepare(bundles[i], self._now()) for i in todo]
            with redis_errors(self.shown, "add"):
                outcomes = await self._writer.add_batch(prepared)
            for i, record, outcome in zip(todo, prepared, outcomes, strict=True):
                results[i] = (
                    duplicate(record.record.fingerprint_sha256, outcome.owner)
                    if isinstance(outcome, Stored)
                    else outcome
                )
            todo = [i for i in todo if isinstance(results[i], IdTaken | FormatMoved)]
            moved = [r for i in todo if isinstance(r := results[i], FormatMoved)]
            if not todo:
                break
            if moved:
                encoder = RecordEncoder(encoder.ring, None, moved[-1].active)
        return [
            StoreError(f"{self.shown}: add: every id drawn was taken; gave up")
            if isinstance(result, IdTaken) or result is None
            else _moved(self.shown, result)
            if isinstance(result, FormatMoved)
            else result
            for result in results
        ]

    async def add_prepared(self, records: Sequence[PreparedRecord]) -> list[BulkResult]:
        """:meth:`add_many` for records from :meth:`encoder`; IdTaken: prepare that one again."""
        with redis_errors(self.shown, "add"):
            outcomes = await self._writer.add_batch(records)
        return [
            duplicate(prepared.record.fingerprint_sha256, outcome.owner)
            if isinstance(outcome, Stored)
            else _moved(self.shown, outcome)
            if isinstance(outcome, FormatMoved)
            else outcome
            for prepared, outcome in zip(records, outcomes, strict=True)
        ]

    async def add_wire(self, records: Sequence[WireRecord]) -> list[WireResult]:
        """:meth:`add_prepared` for :meth:`RecordEncoder.encode`'s packed records.

        AddAlone: add that one with ``RedisStore.add`` (this writer cannot send it).
        """
        if self._wire is None:
            return [AddAlone(r, "this store takes no packed writes") for r in records]
        with redis_errors(self.shown, "add"):
            outcomes = await self._wire.add_wire(records)
        return [
            _wire_duplicate(record, outcome.owner)
            if isinstance(outcome, Stored)
            else _moved(self.shown, outcome)
            if isinstance(outcome, FormatMoved)
            else outcome
            for record, outcome in zip(records, outcomes, strict=True)
        ]


def _moved(shown: str, outcome: FormatMoved) -> StoreError:
    """A record of a batch encoded before ``fleet finalize`` moved the store's format."""
    return StoreError(
        f"{shown}: the store moved to format {outcome.active} (fleet finalize) while this"
        " batch was encoded; nothing was written for it: add it again (an import run again"
        " skips what is stored)"
    )


def _wire_duplicate(record: WireRecord, owner: str) -> WireResult:
    if owner == record.id:  # the same write arrived twice: it is ours
        return record
    return duplicate(record.fingerprint_sha256, owner)
