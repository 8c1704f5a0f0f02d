"""Writes on one Redis (plain or Sentinel): each one atomic, a MULTI/EXEC or a Lua script.

* **add** (one record): WATCH the fingerprint key and the record's hash, check
  neither is taken, then one MULTI/EXEC writes the hash, ``fp:``, the name
  sets, ``ids``, ``expiry`` and the ``put`` event;
* **bulk adds**: :data:`ADD_SCRIPT` does the same checks and writes for one
  record inside Redis, 200 scripts pipelined per round trip; a user who may
  not run scripts (``NOPERM``, logged once) gets one MULTI/EXEC per record;
* **replace**, **delete**, an OCSP response, a re-encrypted key: WATCH what the
  write depends on, then one MULTI/EXEC.

A WATCHed key that changes makes EXEC fail: the write is read again and
retried, :data:`~certagent.store.redis._writer.ATTEMPTS` times at most.  Every
write costs O(names of the record) commands in 2-4 round trips.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import redis.asyncio
import redis.exceptions

from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import NotFound, StoreCorrupt, StoreError
from certagent.store.base import CertRecord, IdTaken, PreparedRecord
from certagent.store.records import make_record
from certagent.store.redis._layout import (
    F_CHAIN,
    F_KEY,
    F_NAMES,
    F_OCSP,
    META_FIELDS,
    Keys,
    to_bytes,
    to_text,
)
from certagent.store.redis._records import (
    EventKind,
    decode_record,
    encode_event,
    encode_record,
    expiry_score,
    fields_of,
    meta_fields,
    parse_names,
)
from certagent.store.redis._writer import ATTEMPTS, AddOutcome, Fence, Stored, duplicate

__all__ = ["ADD_SCRIPT", "SingleNodeWriter", "script_keys"]

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
    return [
        record.id,
        repr(prepared.expiry),  # as redis-py encodes the score of a single add's ZADD
        str(events_maxlen),
        " ".join(dict.fromkeys(record.names)),
        prepared.payload,
    ]


class SingleNodeWriter:
    """A :class:`~certagent.store.redis._writer.RecordWriter` for one Redis (or Sentinel's)."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str, maxlen: int) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._maxlen = maxlen
        self._sha: str | None = None
        self._scripts_allowed = True

    # --- add --------------------------------------------------------------------------

    async def add(self, prepared: PreparedRecord, fence: Fence | None = None) -> AddOutcome:
        """One WATCH/MULTI/EXEC; Redis errors escape (the store translates them).

        With ``fence``, its lease key is WATCHed and read with the others: the
        add commits only if the lease still holds our value at EXEC (a lease
        that expires or is taken after the read aborts the EXEC, Redis >= 6.0.9).
        """
        return await self._by_transaction(prepared, fence)

    async def add_batch(self, records: Sequence[PreparedRecord]) -> list[AddOutcome]:
        """One :data:`ADD_SCRIPT` per record, pipelined; a Redis error fails its record only."""
        if not records:
            return []
        if self._scripts_allowed:
            try:
                return await self._by_script(records)
            except redis.exceptions.NoPermissionError as exc:
                log.warning(
                    "%s: scripts are not allowed for this user (%s); bulk adds now take one"
                    " MULTI/EXEC round trip per record: grant +evalsha +script|load for one"
                    " round trip per batch",
                    self._url,
                    exc,
                )
                self._scripts_allowed = False
        results: list[AddOutcome] = []
        for prepared in records:
            try:
                results.append(await self._by_transaction(prepared))
            except redis.exceptions.ResponseError as exc:
                results.append(self._failed(prepared.record, f"failed: {exc}"))
        return results

    async def _by_script(self, records: Sequence[PreparedRecord]) -> list[AddOutcome]:
        if self._sha is None:
            self._sha = to_text(await self._client.script_load(ADD_SCRIPT))
        results: list[AddOutcome | None] = [None] * len(records)
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
                    results[i] = self._script_result(records[i], reply)
            if not lost:
                break
            self._sha = to_text(await self._client.script_load(ADD_SCRIPT))
            todo = lost
        return [
            r if r is not None else StoreError(f"{self._url}: add script kept disappearing")
            for r in results
        ]

    def _script_result(self, prepared: PreparedRecord, reply: object) -> AddOutcome:
        record = prepared.record
        if isinstance(reply, redis.exceptions.NoPermissionError):
            raise reply  # the whole pipeline was refused: fall back to transactions
        if isinstance(reply, redis.exceptions.ResponseError):
            return self._failed(record, f"failed: {reply}")
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            return StoreError(f"{self._url}: the add script gave an unexpected reply")
        if reply[0] == _ADDED:
            log.debug(
                "stored certificate %s for %s (sha256 %s) in %s",
                record.id,
                " ".join(record.names),
                record.fingerprint_sha256,
                self._url,
            )
            return record
        if reply[0] == _STORED and len(reply) == 2:
            owner = to_text(reply[1])
            if owner == record.id:  # redis-py sent the batch again after a lost reply
                return record
            return Stored(owner)
        if reply[0] == _ID_TAKEN:
            return IdTaken(prepared)
        if reply[0] == _WRONG_TYPE and len(reply) == 3:
            return self._failed(
                record,
                f"{to_text(reply[1])} is a {to_text(reply[2])}, not what certagent writes"
                " there (written by something else?); nothing was written",
            )
        return StoreError(f"{self._url}: the add script gave an unexpected reply")

    async def _by_transaction(
        self, prepared: PreparedRecord, fence: Fence | None = None
    ) -> AddOutcome:
        """One record in WATCH/MULTI/EXEC; retried while a WATCHed key changes."""
        record = prepared.record
        keys = script_keys(self._keys, record)
        fp_key, cert_key, ids_key, expiry_key = keys[:4]
        watched = [fp_key, cert_key] if fence is None else [fp_key, cert_key, fence.key]
        for _ in range(ATTEMPTS):
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    await pipe.watch(*watched)
                    if fence is not None:
                        holder = to_bytes(await pipe.get(fence.key))
                        if holder != fence.value.encode("ascii"):
                            return fence.lost(holder)
                    owner = to_bytes(await pipe.get(fp_key))
                    if owner is not None:
                        return Stored(owner.decode("ascii", "replace"))
                    if await pipe.exists(cert_key):
                        return IdTaken(prepared)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(cert_key, mapping=fields_of(prepared))
                    pipe.set(fp_key, record.id)
                    for name_key in keys[5:]:
                        pipe.sadd(name_key, record.id)
                    pipe.zadd(ids_key, {record.id: 0})
                    pipe.zadd(expiry_key, {record.id: prepared.expiry})
                    self._event(pipe, "put", record.id, record.names)
                    await pipe.execute()
                return record
            except redis.exceptions.WatchError:
                continue
        return self._failed(record, "the record kept changing; gave up")

    # --- replace, delete --------------------------------------------------------------

    async def replace(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime
    ) -> CertRecord:
        for _ in range(ATTEMPTS):
            try:
                return await self._replace_once(ring, cert_id, bundle, now)
            except redis.exceptions.WatchError:
                continue
        raise self._gave_up("replace", cert_id)

    async def _replace_once(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime
    ) -> CertRecord:
        cert_key = self._keys.cert(cert_id)
        new_fp_key = self._keys.fingerprint(bundle.fingerprint_sha256)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key, new_fp_key)
            old = self._existing(cert_id, await pipe.hmget(cert_key, list(META_FIELDS)))
            owner = to_bytes(await pipe.get(new_fp_key))
            if owner is not None and owner != cert_id.encode("ascii"):
                raise duplicate(
                    bundle.fingerprint_sha256,
                    owner.decode("ascii", "replace"),
                    "delete that record first",
                )
            stale_fp_key: str | None = None
            if old.fingerprint_sha256 != bundle.fingerprint_sha256:
                old_fp_key = self._keys.fingerprint(old.fingerprint_sha256)
                await pipe.watch(old_fp_key)
                if to_bytes(await pipe.get(old_fp_key)) == cert_id.encode("ascii"):
                    stale_fp_key = old_fp_key
            record = make_record(cert_id, bundle, version=old.version + 1, updated_at=now)
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.delete(cert_key)
            pipe.hset(cert_key, mapping=encode_record(ring, record, bundle))
            if stale_fp_key is not None:
                pipe.delete(stale_fp_key)
            pipe.set(new_fp_key, cert_id)
            for name in old.names:
                if name not in bundle.names:
                    pipe.srem(self._keys.name(name), cert_id)
            for name in bundle.names:
                pipe.sadd(self._keys.name(name), cert_id)
            pipe.zadd(self._keys.ids(), {cert_id: 0})
            pipe.zadd(self._keys.expiry(), {cert_id: expiry_score(bundle.not_after)})
            self._event(pipe, "put", cert_id, [*bundle.names, *old.names])
            await pipe.execute()
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        for _ in range(ATTEMPTS):
            try:
                return await self._delete_once(cert_id)
            except redis.exceptions.WatchError:
                continue
        raise self._gave_up("delete", cert_id)

    async def _delete_once(self, cert_id: str) -> CertRecord:
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            old = self._existing(cert_id, await pipe.hmget(cert_key, list(META_FIELDS)))
            fp_key = self._keys.fingerprint(old.fingerprint_sha256)
            await pipe.watch(fp_key)
            owned = to_bytes(await pipe.get(fp_key)) == cert_id.encode("ascii")
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.delete(cert_key)
            if owned:
                pipe.delete(fp_key)
            for name in old.names:
                pipe.srem(self._keys.name(name), cert_id)
            pipe.zrem(self._keys.ids(), cert_id)
            pipe.zrem(self._keys.expiry(), cert_id)
            self._event(pipe, "delete", cert_id, old.names)
            await pipe.execute()
        return old

    # --- single-field updates ---------------------------------------------------------

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` against the record's chain, then HSET it with a ``put`` event, atomically.

        WATCH on the record: a record replaced meanwhile (another leaf) makes this
        fail rather than keep a response for a certificate it is not about.
        """
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            chain, names = (to_bytes(v) for v in await pipe.hmget(cert_key, [F_CHAIN, F_NAMES]))
            if chain is None:
                raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
            facts = check_for_chain(chain, der, now)
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hset(cert_key, F_OCSP, der)
            self._event(pipe, "put", cert_id, list(parse_names(names)))
            try:
                await pipe.execute()
            except redis.exceptions.WatchError as exc:
                raise StoreError(
                    f"{self._url}: certificate {cert_id} changed while its OCSP response was"
                    " stored; check the response against the new certificate and try again"
                ) from exc
        return facts

    async def set_key(self, cert_id: str, token: bytes, fresh: bytes) -> bool:
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            if to_bytes(await pipe.hget(cert_key, F_KEY)) != token:
                return False  # replaced or deleted meanwhile: that write used the current key
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hset(cert_key, F_KEY, fresh)
            try:
                await pipe.execute()
            except redis.exceptions.WatchError:
                return False
        return True

    # --- helpers ----------------------------------------------------------------------

    def _event(self, pipe: Any, kind: EventKind, cert_id: str, names: Sequence[str]) -> None:
        pipe.xadd(
            self._keys.events(),
            encode_event(kind, cert_id, names),
            maxlen=self._maxlen,
            approximate=True,
        )

    def _existing(self, cert_id: str, row: object) -> CertRecord:
        fields = meta_fields(row)
        if fields is None:
            raise NotFound(f"{self._url}: no certificate {cert_id!r}")
        try:
            return decode_record(cert_id, fields)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} has bad metadata: {exc}") from exc

    def _failed(self, record: CertRecord, why: str) -> StoreError:
        return StoreError(f"{self._url}: add {record.fingerprint_sha256[:16]}: {why}")

    def _gave_up(self, action: str, what: str) -> StoreError:
        return StoreError(f"{self._url}: {action} {what}: the record kept changing; gave up")
