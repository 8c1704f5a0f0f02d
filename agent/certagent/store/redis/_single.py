"""Writes on one Redis (plain or Sentinel): each one atomic, a MULTI/EXEC or a Lua script.

* **add** (one record): WATCH the fingerprint key, the record's key and the
  store's format, check neither is taken and the record is encoded in the active
  format (:mod:`certagent.store.formats`), then one MULTI/EXEC writes the shared
  chain, the record (format 2: one string, :mod:`._packed`; format 1: a hash),
  ``fp:``, the name sets, ``ids``, ``expiry`` and the ``put`` event;
* **bulk adds**: :data:`ADD_SCRIPT` does the same checks and writes for one
  record inside Redis, 200 scripts pipelined per round trip; a user who may
  not run scripts (``NOPERM``, logged once) gets one MULTI/EXEC per record;
* **replace**, **delete**, an OCSP response, a re-encrypted key: WATCH what the
  write depends on, then one MULTI/EXEC.  A record of either layout is read as
  such; a replace writes it in the active format, an update keeps its layout.

A WATCHed key that changes makes EXEC fail: the write is read again and
retried, :data:`~certagent.store.redis._writer.ATTEMPTS` times at most.  Every
write costs O(names of the record) commands in 2-4 round trips.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import redis.asyncio
import redis.exceptions

from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import NotFound, StoreCorrupt, StoreError
from certagent.store.base import AddAlone, CertRecord, IdTaken, PreparedRecord, WireRecord
from certagent.store.records import make_record
from certagent.store.redis._addscript import (
    ADD_SCRIPT,
    ADD_SHA,
    ADDED,
    FIXED_KEYS,
    FORMAT_MOVED,
    ID_TAKEN,
    STORED,
    WRONG_TYPE,
    AddCall,
    script_args,
    script_keys,
)
from certagent.store.redis._chains import chain_of
from certagent.store.redis._fleet import active_layout
from certagent.store.redis._layout import (
    F_CHAIN,
    F_KEY,
    F_NAMES,
    F_OCSP,
    Keys,
    to_bytes,
    to_text,
)
from certagent.store.redis._packed import chain_digest, is_packed
from certagent.store.redis._records import (
    EventKind,
    decode_record,
    encode_as,
    encode_event,
    expiry_score,
    parse_names,
)
from certagent.store.redis._renewals import SCHEDULE, UNSCHEDULE
from certagent.store.redis._rows import Row, read_one
from certagent.store.redis._writer import (
    ATTEMPTS,
    AddOutcome,
    Fence,
    FormatMoved,
    Stored,
    WireOutcome,
    duplicate,
)

__all__ = ["SingleNodeWriter"]

_Outcome = TypeVar("_Outcome", AddOutcome, WireOutcome)
log = logging.getLogger(__name__)


class SingleNodeWriter:
    """A :class:`~certagent.store.redis._writer.RecordWriter` for one Redis (or Sentinel's)."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: Keys, shown: str, maxlen: int, version: str
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._maxlen = maxlen
        self._version = version
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
                self._no_scripts(exc)
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

        async def send(todo: list[int]) -> list[object]:
            async with self._client.pipeline(transaction=False) as pipe:
                for i in todo:
                    keys = script_keys(self._keys, records[i])
                    args = script_args(records[i], self._maxlen)
                    pipe.evalsha(self._sha or ADD_SHA, len(keys), *keys, *args)
                return list(await pipe.execute(raise_on_error=False))

        return await self._scripted(
            len(records), send, lambda i, reply: self._script_result(records[i], reply)
        )

    async def _scripted(
        self,
        count: int,
        send: Callable[[list[int]], Awaitable[list[object]]],
        result: Callable[[int, object], _Outcome],
    ) -> list[_Outcome | StoreError]:
        """Run ``count`` add-script calls (``send`` the ones numbered, get their replies);
        those the server lost the script for (NOSCRIPT) go again once it is reloaded."""
        results: list[_Outcome | StoreError | None] = [None] * count
        todo = list(range(count))
        for _ in range(2):  # a second pass after NOSCRIPT (the server lost its scripts)
            replies = await send(todo)
            lost: list[int] = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis.exceptions.NoScriptError):
                    lost.append(i)
                else:
                    results[i] = result(i, reply)
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
        reply = self._checked_reply(record, reply)
        if isinstance(reply, StoreError):
            return reply
        if reply[0] == ADDED:
            log.debug(
                "stored certificate %s for %s (sha256 %s) in %s",
                record.id,
                " ".join(record.names),
                record.fingerprint_sha256,
                self._url,
            )
            return record
        if reply[0] == STORED and len(reply) == 2:
            owner = to_text(reply[1])
            if owner == record.id:  # redis-py sent the batch again after a lost reply
                return record
            return Stored(owner)
        if reply[0] == ID_TAKEN:
            return IdTaken(prepared)
        if reply[0] == FORMAT_MOVED and len(reply) == 2:
            return self._moved(reply[1])
        return StoreError(f"{self._url}: the add script gave an unexpected reply")

    def _moved(self, active: object) -> FormatMoved:
        """The format an add script found active (StoreFormatError if unknown here)."""
        return FormatMoved(active_layout(active, self._url, self._version))

    def _checked_reply(
        self, record: CertRecord | WireRecord, reply: object
    ) -> list[Any] | StoreError:
        """The add script's reply as a list, or the error it means (a Redis error, a
        key of another type, a malformed reply): what both add paths refuse alike."""
        if isinstance(reply, redis.exceptions.ResponseError):
            return self._failed(record, f"failed: {reply}")
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            return StoreError(f"{self._url}: the add script gave an unexpected reply")
        if reply[0] == WRONG_TYPE and len(reply) == 3:
            return self._failed(
                record,
                f"{to_text(reply[1])} is a {to_text(reply[2])}, not what certagent writes"
                " there (written by something else?); nothing was written",
            )
        return reply

    def add_call(self) -> AddCall | None:
        """What packs a record's add for :meth:`add_wire`; None once scripts were refused."""
        return AddCall(self._keys, self._maxlen) if self._scripts_allowed else None

    async def add_wire(self, records: Sequence[WireRecord]) -> list[WireOutcome]:
        """:meth:`add_batch` for calls packed ahead (:class:`~._addscript.AddCall`): bytes out.

        The calls go out as they are, on one connection of the client's pool,
        in one write, and their replies are read in order: no packing, no
        pipeline object.  NOSCRIPT: the script is loaded and those records sent
        again.  A user who may not run scripts gets :class:`AddAlone` for every
        record (add each through :meth:`add`; logged once).  Connection errors
        escape: records of this call may then be stored or not, each entirely
        or not at all.
        """
        if self._scripts_allowed and records:
            try:
                return await self._wire_by_script(records)
            except redis.exceptions.NoPermissionError as exc:
                self._no_scripts(exc)
        return [AddAlone(r, "scripts are not allowed for this user") for r in records]

    async def _wire_by_script(self, records: Sequence[WireRecord]) -> list[WireOutcome]:
        if self._sha != ADD_SHA:
            self._sha = to_text(await self._client.script_load(ADD_SCRIPT))

        def result(i: int, reply: object) -> WireOutcome:
            if isinstance(reply, redis.exceptions.NoPermissionError):
                raise reply  # every call is refused alike: none was run
            return self._wire_result(records[i], reply)

        return await self._scripted(
            len(records), lambda todo: self._send_packed([records[i].command for i in todo]), result
        )

    async def _send_packed(self, commands: list[bytes]) -> list[object]:
        """Send RESP-packed ``commands`` in one write; their replies (an error: its exception)."""
        pool = self._client.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(commands)
            replies: list[object] = []
            # one deadline for the batch's replies (a TimeoutError, an OSError: unavailable),
            # not one per reply: asyncio's timeout per read was ≈15 % of this process's CPU
            async with asyncio.timeout(conn.socket_timeout):
                for _ in commands:
                    try:
                        replies.append(await conn.read_response(True, timeout=math.inf))
                    except redis.exceptions.ResponseError as exc:
                        replies.append(exc)
        except BaseException:
            await conn.disconnect()  # replies may be left unread: never reuse it
            raise
        finally:
            await pool.release(conn)
        return replies

    def _no_scripts(self, exc: Exception) -> None:
        log.warning(
            "%s: scripts are not allowed for this user (%s); bulk adds now take one"
            " MULTI/EXEC round trip per record: grant +evalsha +script|load for one"
            " round trip per batch",
            self._url,
            exc,
        )
        self._scripts_allowed = False

    def _wire_result(self, record: WireRecord, reply: object) -> WireOutcome:
        reply = self._checked_reply(record, reply)
        if isinstance(reply, StoreError):
            return reply
        if reply[0] == ADDED:
            return record
        if reply[0] == STORED and len(reply) == 2:
            return Stored(to_text(reply[1]))
        if reply[0] == ID_TAKEN:
            return IdTaken(record)
        if reply[0] == FORMAT_MOVED and len(reply) == 2:
            return self._moved(reply[1])
        return StoreError(f"{self._url}: the add script gave an unexpected reply")

    async def _by_transaction(
        self, prepared: PreparedRecord, fence: Fence | None = None
    ) -> AddOutcome:
        """One record in WATCH/MULTI/EXEC; retried while a WATCHed key changes."""
        record = prepared.record
        keys = script_keys(self._keys, prepared)
        fp_key, cert_key, ids_key, expiry_key, _, chain_key, format_key = keys[:FIXED_KEYS]
        watched = [fp_key, cert_key, format_key]
        if fence is not None:
            watched.append(fence.key)
        for _ in range(ATTEMPTS):
            try:
                async with self._client.pipeline(transaction=True) as pipe:
                    await pipe.watch(*watched)
                    if fence is not None:
                        holder = to_bytes(await pipe.get(fence.key))
                        if holder != fence.value.encode("ascii"):
                            return fence.lost(holder)
                    active = self._moved(await pipe.hget(format_key, "format"))
                    if active.active != prepared.layout:
                        return active
                    owner = to_bytes(await pipe.get(fp_key))
                    if owner is not None:
                        return Stored(owner.decode("ascii", "replace"))
                    if await pipe.exists(cert_key):
                        return IdTaken(prepared)
                    pipe.multi()  # type: ignore[no-untyped-call]
                    if prepared.shared:
                        pipe.set(chain_key, prepared.shared)
                    if prepared.fields:
                        pipe.hset(cert_key, items=list(prepared.fields))
                    else:
                        pipe.set(cert_key, prepared.payload)
                    pipe.set(fp_key, record.id)
                    for name_key in keys[FIXED_KEYS:]:
                        pipe.sadd(name_key, record.id)
                    pipe.zadd(ids_key, {record.id: 0})
                    pipe.zadd(expiry_key, {record.id: prepared.expiry})
                    self._event(pipe, "put", record.id, record.names)
                    if fence is not None and fence.renew is not None:
                        renew = fence.renew
                        pipe.eval(
                            SCHEDULE,
                            2,
                            self._keys.renewals(),
                            self._keys.renewal_entries(),
                            renew.name,
                            renew.score,
                            renew.member,
                        )
                    await pipe.execute()
                return record
            except redis.exceptions.WatchError:
                continue
        return self._failed(record, "the record kept changing; gave up")

    # --- replace, delete --------------------------------------------------------------

    async def replace(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime, layout: int
    ) -> CertRecord:
        """In the format the transaction finds active (``layout`` is the caller's view)."""
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
        format_key = self._keys.store_format()
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key, new_fp_key, format_key)
            layout = self._moved(await pipe.hget(format_key, "format")).active
            old = self._existing(cert_id, await self._read(pipe, cert_key))
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
            encoded = encode_as(layout, ring, record, bundle)
            pipe.multi()  # type: ignore[no-untyped-call]
            if encoded.chain:
                pipe.set(self._keys.chain(chain_digest(encoded.chain)), encoded.chain)
            if encoded.fields:  # format 1: the record is a hash (whatever it was)
                pipe.delete(cert_key)
                pipe.hset(cert_key, items=list(encoded.fields))
            else:
                pipe.set(cert_key, encoded.payload)  # a hash becomes a string
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
        """WATCH the record, its ``fp:`` and the renewal entries; one MULTI/EXEC.

        Names with a renewal entry get :data:`~certagent.store.redis._renewals.UNSCHEDULE`
        in the MULTI, after the SREMs: it drops the entries of the names whose
        set is then empty (no record holds them any more).  A delete of a
        record none of whose names is scheduled runs no script.
        """
        cert_key = self._keys.cert(cert_id)
        entries_key = self._keys.renewal_entries()
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            old = self._existing(cert_id, await self._read(pipe, cert_key))
            fp_key = self._keys.fingerprint(old.fingerprint_sha256)
            await pipe.watch(fp_key, entries_key)
            owned = to_bytes(await pipe.get(fp_key)) == cert_id.encode("ascii")
            names = list(dict.fromkeys(old.names))
            entries = await pipe.hmget(entries_key, names)
            scheduled = [n for n, e in zip(names, entries, strict=True) if e is not None]
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.delete(cert_key)
            if owned:
                pipe.delete(fp_key)
            for name in old.names:
                pipe.srem(self._keys.name(name), cert_id)
            pipe.zrem(self._keys.ids(), cert_id)
            pipe.zrem(self._keys.expiry(), cert_id)
            self._event(pipe, "delete", cert_id, old.names)
            if scheduled:
                pipe.eval(
                    UNSCHEDULE,
                    2 + len(scheduled),
                    self._keys.renewals(),
                    entries_key,
                    *(self._keys.name(n) for n in scheduled),
                    "",
                    *scheduled,
                )
            await pipe.execute()
        return old

    # --- single-field updates ---------------------------------------------------------

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` against the record's chain, then store it with a ``put`` event, atomically.

        WATCH on the record: a record replaced meanwhile (another leaf) makes this
        fail rather than keep a response for a certificate it is not about.
        """
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            row = await self._read(pipe, cert_key, [F_CHAIN])
            if row is None:
                raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
            chain = await chain_of(self._client, self._keys, self._url, cert_id, row)
            facts = check_for_chain(chain, der, now)
            pipe.multi()  # type: ignore[no-untyped-call]
            if row.packed is not None:
                pipe.set(cert_key, row.packed.with_fields(O=der))
            else:
                pipe.hset(cert_key, F_OCSP, der)
            self._event(pipe, "put", cert_id, list(parse_names(row.meta[F_NAMES])))
            try:
                await pipe.execute()
            except redis.exceptions.WatchError as exc:
                raise StoreError(
                    f"{self._url}: certificate {cert_id} changed while its OCSP response was"
                    " stored; check the response against the new certificate and try again"
                ) from exc
        return facts

    async def set_key(self, cert_id: str, token: bytes, fresh: bytes) -> bool:
        """A hash's ``key`` field, or (``token`` a layout-2 record) the whole record."""
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key)
            if is_packed(token):
                try:
                    held = to_bytes(await pipe.get(cert_key))
                except redis.exceptions.ResponseError:
                    return False  # a hash now: not what was read
            else:
                held = to_bytes(await pipe.hget(cert_key, F_KEY))
            if held != token:
                return False  # replaced or deleted meanwhile: that write used the current key
            pipe.multi()  # type: ignore[no-untyped-call]
            if is_packed(token):
                pipe.set(cert_key, fresh)
            else:
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

    async def _read(self, pipe: Any, cert_key: str, extra: Sequence[str] = ()) -> Row | None:
        try:
            return await read_one(pipe, cert_key, extra)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: {cert_key} is not a record: {exc}") from exc

    def _existing(self, cert_id: str, row: Row | None) -> CertRecord:
        if row is None:
            raise NotFound(f"{self._url}: no certificate {cert_id!r}")
        try:
            return decode_record(cert_id, row.meta)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} has bad metadata: {exc}") from exc

    def _failed(self, record: CertRecord | WireRecord, why: str) -> StoreError:
        return StoreError(f"{self._url}: add {record.fingerprint_sha256[:16]}: {why}")

    def _gave_up(self, action: str, what: str) -> StoreError:
        return StoreError(f"{self._url}: {action} {what}: the record kept changing; gave up")
