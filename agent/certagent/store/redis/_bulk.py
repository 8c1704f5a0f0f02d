"""Bulk adds to the Redis store: many new records per round trip, each one atomic.

A record is encoded apart from the write (:class:`RecordEncoder`, pure, picklable:
the import runs it in worker processes next to validation), then written by
:func:`write_records`: :data:`ADD_SCRIPT` once per record, ``EVALSHA`` pipelined
``len(records)`` at a time, so a batch costs one round trip.  One script run
adds one record exactly as :meth:`RedisStore.add <certagent.store.redis.RedisStore.add>`
does in its MULTI/EXEC: the hash, the fingerprint index, the name sets, both
sorted sets and the ``put`` event, or nothing at all if the leaf is already
stored (the ``fp:`` key).  Redis runs a script alone, so no reader sees part of
a record, and duplicates inside one batch are found like any others: the
scripts run in pipeline order.

A script's writes are not rolled back when one of its commands fails, so the
script checks the type of every key it will write before writing any.  A user
who may not run scripts (``NOPERM``) gets the same writes as WATCH/MULTI/EXEC
transactions, one round trip each (logged once).

Every key name comes from :class:`~certagent.store._redis_layout.Keys`
(:func:`script_keys`), and all of them are passed as ``KEYS``.

Cost: O(records) commands per call, one round trip per call (two the first
time, to load the script); each script run is O(names of its record + log N)
in Redis for N stored certificates (sorted-set inserts).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import redis.asyncio
import redis.exceptions
from redis.typing import EncodableT, FieldT

from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.errors import DuplicateCertificate, StoreError
from certagent.store._redis_conn import redis_errors
from certagent.store._redis_layout import (
    Keys,
    encode_event,
    encode_record,
    expiry_score,
    to_bytes,
    to_text,
)
from certagent.store.base import CertRecord, make_record

if TYPE_CHECKING:
    from certagent.store._redis_cluster import ClusterWrites

__all__ = [
    "ADD_SCRIPT",
    "AddResult",
    "BulkAdds",
    "BulkResult",
    "IdTaken",
    "PreparedRecord",
    "RecordEncoder",
    "script_keys",
]

log = logging.getLogger(__name__)

#: Adds one record (EVALSHA).  KEYS: 1 the fingerprint key, 2 the record's hash, 3 the
#: ``ids`` and 4 ``expiry`` sorted sets, 5 the events stream, 6.. the record's name sets.
#: ARGV: 1 the id, 2 the expiry score, 3 the stream's MAXLEN, 4 the event's names, 5 the
#: hash's fields and values joined by NUL bytes (one argument instead of 22: packing each
#: argument costs the importer more than splitting costs Redis).  Reply: ``{1}`` added;
#: ``{0, id}`` the leaf is already stored as ``id``; ``{2}`` the id is taken (draw another);
#: ``{3, key, type}`` a key holds the wrong type (nothing was written).
ADD_SCRIPT = """
local id = ARGV[1]
local function wrong(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= want then return {3, key, kind} end
end
local bad = wrong(KEYS[1], 'string') or wrong(KEYS[2], 'hash') or wrong(KEYS[3], 'zset')
  or wrong(KEYS[4], 'zset') or wrong(KEYS[5], 'stream')
if bad then return bad end
for i = 6, #KEYS do
  bad = wrong(KEYS[i], 'set')
  if bad then return bad end
end
local owner = redis.call('GET', KEYS[1])
if owner then return {0, owner} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {2} end
local fields, payload, start = {}, ARGV[5], 1
while true do
  local stop = string.find(payload, '\\0', start, true)
  if not stop then
    fields[#fields + 1] = string.sub(payload, start)
    break
  end
  fields[#fields + 1] = string.sub(payload, start, stop - 1)
  start = stop + 1
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('SET', KEYS[1], id)
for i = 6, #KEYS do redis.call('SADD', KEYS[i], id) end
redis.call('ZADD', KEYS[3], 0, id)
redis.call('ZADD', KEYS[4], ARGV[2], id)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*',
  'kind', 'put', 'id', id, 'names', ARGV[4])
return {1}
"""

_ADDED, _STORED, _ID_TAKEN, _WRONG_TYPE = 1, 0, 2, 3
_ATTEMPTS = 5


@dataclass(frozen=True)
class PreparedRecord:
    """A new record ready to write: its metadata and its encoded hash (the key encrypted).

    The hash holds the encrypted key only: safe to pass between processes and
    to keep in memory, and ``repr()`` leaves it out anyway.
    """

    record: CertRecord
    #: The hash's fields and values, joined by NUL bytes (none of them holds one).
    payload: bytes = field(repr=False)
    expiry: float

    def fields(self) -> dict[FieldT, EncodableT]:
        """The hash's fields and values (for HSET)."""
        parts = self.payload.split(b"\0")
        return dict(zip(parts[::2], parts[1::2], strict=True))


@dataclass(frozen=True)
class RecordEncoder:
    """Encodes new records for :func:`write_records`: pure, no I/O; picklable.

    ``ring`` is the store's key ring (its data keys: keep the encoder in the
    process that opened the key file and in the workers it starts).
    """

    ring: KeyRing

    def __repr__(self) -> str:
        return f"RecordEncoder(current={self.ring.current!r})"

    def prepare(self, bundle: CertBundle, updated_at: datetime) -> PreparedRecord:
        """``bundle`` under a new random id, version 1, its key encrypted for that id."""
        record = make_record(secrets.token_hex(8), bundle, version=1, updated_at=updated_at)
        encoded = encode_record(self.ring, record, bundle)
        parts: list[bytes] = []
        for name, value in encoded.items():
            parts += (_as_bytes(name), _as_bytes(value))
        if any(b"\0" in part for part in parts):
            raise StoreError(f"record {record.id}: a field holds a NUL byte")
        return PreparedRecord(
            record=record,
            payload=b"\0".join(parts),
            expiry=expiry_score(bundle.not_after),
        )


@dataclass(frozen=True)
class IdTaken:
    """The record's random id was already in use (1 in 2**64 per record): prepare it again."""

    prepared: PreparedRecord


#: One result per record written, in order.
BulkResult = CertRecord | DuplicateCertificate | IdTaken | StoreError
#: One result per bundle of :meth:`RedisStore.add_many <certagent.store.redis.RedisStore.add_many>`.
AddResult = CertRecord | DuplicateCertificate | StoreError


def script_keys(keys: Keys, record: CertRecord) -> list[str]:
    """The KEYS of :data:`ADD_SCRIPT` for ``record``, in its order."""
    return [
        keys.fingerprint(record.fingerprint_sha256),
        keys.cert(record.id),
        keys.ids(),
        keys.expiry(),
        keys.events(),
        *(keys.name(name) for name in record.names),
    ]


def _script_args(prepared: PreparedRecord, events_maxlen: int) -> list[bytes | str]:
    record = prepared.record
    args: list[bytes | str] = [
        record.id,
        repr(prepared.expiry),  # as redis-py encodes the score of a single add's ZADD
        str(events_maxlen),
        " ".join(dict.fromkeys(record.names)),
        prepared.payload,
    ]
    return args


class BulkAdds:
    """:attr:`RedisStore.bulk <certagent.store.redis.RedisStore.bulk>`: many adds per round trip.

    Holds the script's state for one store.  Redis errors become the agent's
    (StoreUnavailable, StoreError) here, as in the store's other methods.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        maxlen: int,
        ring_for: Callable[[str], KeyRing],
        now: Callable[[], datetime],
        *,
        cluster: ClusterWrites | None = None,
    ) -> None:
        self._client = client
        self._cluster = cluster
        self._keys = keys
        self.shown = shown
        self._maxlen = maxlen
        self._ring_for = ring_for
        self._now = now
        self._sha: str | None = None
        self._scripts_allowed = True

    def encoder(self) -> RecordEncoder:
        """Encodes new records for :meth:`add_prepared`; ConfigError without a key file."""
        return RecordEncoder(self._ring_for("store certificates"))

    async def add_many(self, bundles: Sequence[CertBundle]) -> list[AddResult]:
        """Add new records (validated by the caller) in one round trip.

        One result per bundle, in order: its record, DuplicateCertificate if the
        leaf is stored already (or earlier in ``bundles``), or StoreError if it
        cannot be written.  Each record is written as ``RedisStore.add`` writes
        one, atomically, its ``put`` event with it.  Raises StoreUnavailable if
        Redis cannot be reached: records of this call may then be stored or
        not, each entirely or not at all.  An id found taken is drawn again.
        """
        encoder = self.encoder()
        results: list[BulkResult] = list(
            await self.add_prepared([encoder.prepare(bundle, self._now()) for bundle in bundles])
        )
        for _ in range(_ATTEMPTS):
            again = [i for i, result in enumerate(results) if isinstance(result, IdTaken)]
            if not again:
                break
            redone = await self.add_prepared(
                [encoder.prepare(bundles[i], self._now()) for i in again]
            )
            for i, result in zip(again, redone, strict=True):
                results[i] = result
        return [
            StoreError(f"{self.shown}: add: every id drawn was taken; gave up")
            if isinstance(result, IdTaken)
            else result
            for result in results
        ]

    async def add_prepared(self, records: Sequence[PreparedRecord]) -> list[BulkResult]:
        """:meth:`add_many` for records from :meth:`encoder`; IdTaken: prepare that one again."""
        with redis_errors(self.shown, "add"):
            return await self.write(records)

    async def write(self, records: Sequence[PreparedRecord]) -> list[BulkResult]:
        """Add ``records`` in order, one atomic script each; one result per record.

        Raises redis-py's connection errors as they are (the store translates
        them): records of this call may then have been written or not, each
        entirely or not at all.
        """
        if not records:
            return []
        if self._cluster is not None:  # ordered steps, a few round trips per batch
            return self._cluster.bulk_results(records, await self._cluster.add(records))
        if self._scripts_allowed:
            try:
                return await self._by_script(records)
            except redis.exceptions.NoPermissionError as exc:
                log.warning(
                    "%s: scripts are not allowed for this user (%s); bulk adds now take one"
                    " MULTI/EXEC round trip per record: grant +evalsha +script|load for one"
                    " round trip per batch",
                    self.shown,
                    exc,
                )
                self._scripts_allowed = False
        return [await self._by_transaction(prepared) for prepared in records]

    async def _by_script(self, records: Sequence[PreparedRecord]) -> list[BulkResult]:
        if self._sha is None:
            self._sha = to_text(await self._client.script_load(ADD_SCRIPT))
        results: list[BulkResult | None] = [None] * len(records)
        todo = list(range(len(records)))
        for _ in range(2):  # a second pass after NOSCRIPT (the server lost its scripts)
            async with self._client.pipeline(transaction=False) as pipe:
                for i in todo:
                    keys = script_keys(self._keys, records[i].record)
                    args = _script_args(records[i], self._maxlen)
                    pipe.evalsha(self._sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
            lost: list[int] = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    lost.append(i)
                else:
                    results[i] = self._result(records[i], reply)
            if not lost:
                break
            self._sha = to_text(await self._client.script_load(ADD_SCRIPT))
            todo = lost
        return [
            r if r is not None else StoreError(f"{self.shown}: add script kept disappearing")
            for r in results
        ]

    def _result(self, prepared: PreparedRecord, reply: object) -> BulkResult:
        record = prepared.record
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise reply  # the whole pipeline was refused: fall back to transactions
        if isinstance(reply, redis.exceptions.ResponseError):
            return self._failed(record, f"failed: {reply}")
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            return StoreError(f"{self.shown}: the add script gave an unexpected reply")
        if reply[0] == _ADDED:
            log.debug(
                "stored certificate %s for %s (sha256 %s) in %s",
                record.id,
                " ".join(record.names),
                record.fingerprint_sha256,
                self.shown,
            )
            return record
        if reply[0] == _STORED and len(reply) == 2:
            owner = to_text(reply[1])
            if owner == record.id:  # redis-py sent the batch again after a lost reply
                return record
            return _duplicate(record, owner)
        if reply[0] == _ID_TAKEN:
            return IdTaken(prepared)
        if reply[0] == _WRONG_TYPE and len(reply) == 3:
            return self._failed(
                record,
                f"{to_text(reply[1])} is a {to_text(reply[2])}, not what certagent writes"
                " there (written by something else?); nothing was written",
            )
        return StoreError(f"{self.shown}: the add script gave an unexpected reply")

    async def _by_transaction(self, prepared: PreparedRecord) -> BulkResult:
        """One record in WATCH/MULTI/EXEC, for users who may not run scripts."""
        record = prepared.record
        keys = script_keys(self._keys, record)
        fp_key, cert_key, ids_key, expiry_key, events_key = keys[:5]
        for _ in range(_ATTEMPTS):
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    await pipe.watch(fp_key, cert_key)
                    owner = to_bytes(await pipe.get(fp_key))
                    if owner is not None:
                        return _duplicate(record, owner.decode("ascii", "replace"))
                    if await pipe.exists(cert_key):
                        return IdTaken(prepared)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(cert_key, mapping=prepared.fields())
                    pipe.set(fp_key, record.id)
                    for name_key in keys[5:]:
                        pipe.sadd(name_key, record.id)
                    pipe.zadd(ids_key, {record.id: 0})
                    pipe.zadd(expiry_key, {record.id: prepared.expiry})
                    event = encode_event("put", record.id, record.names)
                    pipe.xadd(events_key, event, maxlen=self._maxlen, approximate=True)
                    await pipe.execute()
                return record
            except redis.exceptions.WatchError:
                continue
            except redis.exceptions.ResponseError as exc:
                return self._failed(record, f"failed: {exc}")
        return self._failed(record, "the record kept changing; gave up")

    def _failed(self, record: CertRecord, why: str) -> StoreError:
        return StoreError(f"{self.shown}: add {record.fingerprint_sha256[:16]}: {why}")


def _duplicate(record: CertRecord, owner: str) -> DuplicateCertificate:
    return DuplicateCertificate(
        f"this certificate (sha256 {record.fingerprint_sha256}) is already stored"
        f" as {owner}; replace or delete that record instead"
    )


def _as_bytes(value: object) -> bytes:
    raw = to_bytes(value)
    if raw is None:
        raise TypeError(f"hash field value of type {type(value).__name__}")
    return raw
