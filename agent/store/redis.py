"""Certificates in Redis, private keys encrypted at rest.

Key layout (``prefix`` defaults to ``certagent:``; all values are bytes)::

    {prefix}cert:{id}     HASH    chain               leaf + chain certificates, PEM, leaf first
                                  key                 the private key: keycrypt token (aad = id)
                                  names               the certificate's names, space-separated
                                  fingerprint_sha1    uppercase hex (as HAProxy prints it)
                                  fingerprint_sha256  lowercase hex
                                  serial              uppercase hex
                                  key_type            ECDSA-P256, RSA-2048, ...
                                  not_before          ISO 8601 UTC, e.g. 2025-01-31T12:00:00Z
                                  not_after           ISO 8601 UTC
                                  version             1 on add, + 1 on every replace
                                  updated_at          ISO 8601 UTC
    {prefix}name:{name}   SET     ids of the records with that name (an ECDSA and an RSA one)
    {prefix}fp:{sha256}   STRING  id of the record holding that leaf (duplicate check)
    {prefix}ids           ZSET    every id, score 0: id order and cursors (ZRANGEBYLEX)
    {prefix}expiry        ZSET    every id, scored by notAfter (Unix seconds)
    {prefix}events        STREAM  one entry per write: kind (put|delete), id, names

``id`` is 16 random hex digits given by :meth:`RedisStore.add` and kept by
:meth:`RedisStore.replace`.  ``name`` is a validated lowercase hostname or a
wildcard written as is (``*.example.com``).  Every write (add, replace,
delete) changes the record, its name sets, the fingerprint index, both
sorted sets and appends its event in one MULTI/EXEC, WATCHing the keys it
read first (the record and the fingerprint keys), and retries if one of them
changed meanwhile.  An event's ``names`` are the record's names before and
after the write.  The stream is trimmed to about ``events_maxlen`` entries
(``XADD MAXLEN ~``).

A lookup for ``a.example.com`` is one round trip: LOOKUP_SCRIPT (EVALSHA)
reads ``name:a.example.com``, else ``name:*.example.com``, and the ``chain`` and
``key`` of every record of the first set with a valid id.  A user who may not
run scripts gets the same in two pipelined round trips.  Keys are decrypted
with the :class:`~agent.keycrypt.KeyRing` (the ``key_file`` setting); without
one a store can list records but neither look them up nor write them
(ConfigError).

:meth:`RedisStore.changes` reads the stream and XINFO STREAM in one MULTI/EXEC
and raises ChangesLost if events after the caller's position may have been
trimmed (see :func:`~agent.store._redis_layout.entries_lost`).  When there is
nothing to read it waits in ``XREAD BLOCK`` on a client of its own, whose
socket timeout exceeds the longest block (:data:`MAX_BLOCK`), then reads again.

Key names, field encoding and stream positions live in
:mod:`agent.store._redis_layout`, whose :class:`Keys` is the only place that
builds key names.  docs/store.md describes the same layout for operators.
"""

from __future__ import annotations

import builtins
import logging
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from agent import hostname, keycrypt
from agent.errors import (
    ChangesLost,
    ConfigError,
    DuplicateCertificate,
    KeyDecryptError,
    NotFound,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from agent.keycrypt import KeyRing
from agent.pem import CertBundle
from agent.store._redis_layout import (
    DEFAULT_PREFIX,
    F_CHAIN,
    F_KEY,
    LOOKUP_SCRIPT,
    META_FIELDS,
    ZERO,
    Keys,
    StreamId,
    StreamInfo,
    decode_change,
    decode_record,
    encode_event,
    encode_record,
    entries_lost,
    expiry_score,
    meta_fields,
    parse_stream_id,
    to_bytes,
    to_text,
    valid_id,
)
from agent.store.base import (
    CertRecord,
    Change,
    Page,
    StoredCertificate,
    best_first,
    candidate_names,
    check_record,
    decode_cursor,
    encode_cursor,
    make_record,
    redact_url,
)

__all__ = [
    "DEFAULT_EVENTS_MAXLEN",
    "DEFAULT_PREFIX",
    "MAX_BLOCK",
    "Keys",
    "RedisStore",
]

log = logging.getLogger(__name__)

#: About this many events stay in the stream (``XADD MAXLEN ~``).
DEFAULT_EVENTS_MAXLEN = 100_000
#: The longest one :meth:`RedisStore.changes` call blocks in Redis, in seconds.
MAX_BLOCK = 30.0

_WRITE_ATTEMPTS = 5
_CHANGES_BATCH = 1000
_SCAN_BATCH = 500


def _now() -> datetime:
    """The clock, to the second as stored; tests replace this function."""
    return datetime.now(UTC).replace(microsecond=0)


# Connections per pool; more concurrent commands wait (up to the timeout) for one.
MAX_CONNECTIONS = 32


class RedisStore:
    """A :class:`~agent.store.base.Store` on Redis (``redis://``, ``rediss://``, ``unix://``)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        keyring: KeyRing | None = None,
        timeout: float = 2.0,
        health_check_interval: float = 15.0,
        events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
    ) -> None:
        if events_maxlen < 1:
            raise ConfigError("events_maxlen must be at least 1")
        self._url = redact_url(url)
        self._keys = Keys(prefix)
        self._ring = keyring
        self._events_maxlen = events_maxlen
        self._client = self._connect(url, timeout, timeout, health_check_interval)
        # the lazy path's lookup in one round trip; None once the server refused scripts
        self._lookup_script: AsyncScript | None = self._client.register_script(LOOKUP_SCRIPT)
        # XREAD BLOCK holds its connection for up to MAX_BLOCK: give it its own pool,
        # whose socket timeout outlasts the block.
        self._blocking = self._connect(url, MAX_BLOCK + timeout, timeout, health_check_interval)

    def _connect(
        self, url: str, read_timeout: float, connect_timeout: float, health_check: float
    ) -> redis.asyncio.Redis:
        try:
            # A storm of new hosts makes hundreds of lookups at once: they wait for one
            # of MAX_CONNECTIONS connections instead of failing with "Too many connections".
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                url,
                max_connections=MAX_CONNECTIONS,
                timeout=connect_timeout,
                decode_responses=False,
                socket_timeout=read_timeout,
                socket_connect_timeout=connect_timeout,
                health_check_interval=health_check,
                # One immediate retry covers a pooled connection the server closed;
                # redis-py's default (10 retries with backoff) would stall the lazy path.
                retry=Retry(NoBackoff(), 1),
            )
            return redis.asyncio.Redis.from_pool(pool)
        except ValueError as exc:
            raise ConfigError(f"invalid Redis URL {self._url!r}: {exc}") from exc

    @property
    def keys(self) -> Keys:
        return self._keys

    def describe(self) -> str:
        return self._url

    async def ping(self) -> None:
        with self._errors("ping"):
            await self._client.ping()

    async def close(self) -> None:
        with self._errors("close"):
            await self._client.aclose()
            await self._blocking.aclose()

    # --- reads ----------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        found = await self.lookup_all(hostname)
        return found[0] if found else None

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        names = candidate_names(hostname)
        with self._errors("lookup"):
            if self._lookup_script is not None:
                try:
                    chosen = await self._lookup_in_one_trip(self._lookup_script, names)
                except redis.exceptions.NoPermissionError as exc:
                    log.warning(
                        "%s: scripts are not allowed for this user (%s); lookups now take"
                        " two round trips: grant +evalsha +script|load for one",
                        self._url,
                        exc,
                    )
                    self._lookup_script = None
                    chosen = await self._lookup_in_two_trips(names)
            else:
                chosen = await self._lookup_in_two_trips(names)
        if chosen is None:
            return ()
        indexed_as, rows = chosen
        found = (self._open(names[0], indexed_as, cert_id, row) for cert_id, row in rows)
        return best_first(stored for stored in found if stored is not None)

    async def _lookup_in_one_trip(
        self, script: AsyncScript, names: Sequence[str]
    ) -> tuple[str, builtins.list[tuple[str, object]]] | None:
        """:data:`LOOKUP_SCRIPT`: the first name set with a valid id, and its records."""
        reply = await script(
            keys=[self._keys.name(name) for name in names],
            args=[self._keys.cert(""), F_CHAIN, F_KEY],
        )
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            raise StoreError(f"{self._url}: lookup script gave an unexpected reply")
        examined, rest = reply[1 : 1 + reply[0]], reply[1 + reply[0] :]
        for name, members in zip(names, examined, strict=False):
            if isinstance(members, bytes):  # the error text of SMEMBERS
                members = redis.exceptions.ResponseError(to_text(members))
            ids = self._index_ids(name, set(members) if isinstance(members, list) else members)
            if not ids:
                continue
            script_rows = dict(zip(map(to_text, rest[0]), rest[1], strict=True)) if rest else {}
            rows: builtins.list[tuple[str, object]] = []
            for cert_id in ids:
                row = script_rows.get(cert_id)
                if isinstance(row, bytes):  # the error text of HMGET
                    row = redis.exceptions.ResponseError(to_text(row))
                rows.append((cert_id, row))
            return name, rows
        return None

    async def _lookup_in_two_trips(
        self, names: Sequence[str]
    ) -> tuple[str, builtins.list[tuple[str, object]]] | None:
        """Without scripts: the name sets in one pipeline, then the records in another."""
        async with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.smembers(self._keys.name(name))
            sets = await pipe.execute(raise_on_error=False)
        for name, members in zip(names, sets, strict=True):
            ids = self._index_ids(name, members)
            if ids:
                async with self._client.pipeline(transaction=False) as pipe:
                    for cert_id in ids:
                        pipe.hmget(self._keys.cert(cert_id), [F_CHAIN, F_KEY])
                    rows = await pipe.execute(raise_on_error=False)
                return name, list(zip(ids, rows, strict=True))
        return None

    def _index_ids(self, name: str, members: object) -> builtins.list[str]:
        """The valid ids of one ``name:`` set reply, sorted; warns about anything else."""
        if isinstance(members, redis.exceptions.ResponseError):
            if not _wrong_type(members):
                raise members
            log.warning(
                "ignoring %s in %s: it is not a set (written by an older certagent?)",
                self._keys.name(name),
                self._url,
            )
            return []
        ids: builtins.list[str] = []
        for raw in members if isinstance(members, set) else ():
            cert_id = to_text(raw)
            if valid_id(cert_id):
                ids.append(cert_id)
            else:
                log.warning(
                    "ignoring %r in %s of %s: not a record id",
                    cert_id[:70],
                    self._keys.name(name),
                    self._url,
                )
        return sorted(ids)

    def _open(
        self, name: str, indexed_as: str, cert_id: str, row: object
    ) -> StoredCertificate | None:
        """Decrypt and check one record found for ``name``; None (and a warning) if unusable."""
        if isinstance(row, redis.exceptions.ResponseError):
            if not _wrong_type(row):
                raise StoreError(f"{self._url}: lookup failed: {row}") from row
            row = [None, None]
        chain, token = (to_bytes(v) for v in row) if isinstance(row, list) else (None, None)
        if chain is None or token is None:
            log.warning(
                "ignoring store record for %s: %s: %s lists %r, which is not a record",
                name,
                self._url,
                self._keys.name(indexed_as),
                cert_id,
            )
            return None
        ring = self._ring_for("read certificates")
        try:
            key = keycrypt.decrypt(ring, token, cert_id.encode("ascii"))
        except KeyDecryptError as exc:
            log.warning(
                "ignoring store record for %s: %s: record %r: %s", name, self._url, cert_id, exc
            )
            return None
        return check_record(self._url, cert_id, name, chain, key)

    async def get(self, cert_id: str) -> CertRecord | None:
        if not valid_id(cert_id):
            return None
        with self._errors("get"):
            row = await self._client.hmget(self._keys.cert(cert_id), list(META_FIELDS))
        fields = meta_fields(row)
        if fields is None:
            return None
        return self._record(cert_id, fields)

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = decode_cursor(cursor) if cursor is not None else None
        pattern = hostname.normalise_pattern(name) if name is not None else None
        before = expiry_score(expiring_before) if expiring_before is not None else None
        with self._errors("list"):
            ids = await self._list_ids(pattern, before, after, limit + 1)
            async with self._client.pipeline(transaction=False) as pipe:
                for cert_id in ids[:limit]:
                    pipe.hmget(self._keys.cert(cert_id), list(META_FIELDS))
                rows = await pipe.execute()
        records: builtins.list[CertRecord] = []
        for cert_id, row in zip(ids, rows, strict=False):
            fields = meta_fields(row)
            if fields is None:
                continue  # deleted since the index was read
            try:
                records.append(self._record(cert_id, fields))
            except StoreCorrupt as exc:
                log.warning("listing %s: %s", self._url, exc)
        more = len(ids) > limit
        return Page(tuple(records), encode_cursor(ids[limit - 1]) if more else None)

    async def _list_ids(
        self, pattern: str | None, before: float | None, after: str | None, count: int
    ) -> builtins.list[str]:
        """Up to ``count`` matching ids after ``after``, in id order."""
        if pattern is None and before is None:
            low = f"({after}" if after is not None else "-"
            by_id = await self._client.zrangebylex(self._keys.ids(), low, "+", start=0, num=count)
            return [i for i in map(to_text, by_id) if valid_id(i)]
        if pattern is not None:
            members = await self._client.smembers(self._keys.name(pattern))
            ids = sorted(i for i in map(to_text, members) if valid_id(i))
            if before is not None and ids:
                scores = await self._client.zmscore(self._keys.expiry(), ids)
                ids = [
                    i for i, s in zip(ids, scores, strict=True) if s is not None and s < before
                ]
        else:
            raw = await self._client.zrangebyscore(self._keys.expiry(), "-inf", f"({before}")
            ids = sorted(i for i in map(to_text, raw) if valid_id(i))
        if after is not None:
            ids = [i for i in ids if i > after]
        return ids[:count]

    # --- writes ---------------------------------------------------------------------

    async def put(self, bundle: CertBundle) -> str:
        ring = self._ring_for("store certificates")
        with self._errors("put"):
            for _ in range(_WRITE_ATTEMPTS):
                try:
                    result = await self._add_once(ring, bundle)
                except redis.exceptions.WatchError:
                    continue
                if isinstance(result, str):
                    return result  # already stored
                return result.id
        raise self._gave_up("put", bundle.fingerprint_sha256[:16])

    async def add(self, bundle: CertBundle) -> CertRecord:
        ring = self._ring_for("store certificates")
        with self._errors("add"):
            for _ in range(_WRITE_ATTEMPTS):
                try:
                    result = await self._add_once(ring, bundle)
                except redis.exceptions.WatchError:
                    continue
                break
            else:
                raise self._gave_up("add", bundle.fingerprint_sha256[:16])
        if isinstance(result, str):
            raise DuplicateCertificate(
                f"this certificate (sha256 {bundle.fingerprint_sha256}) is already stored"
                f" as {result}; replace or delete that record instead"
            )
        return result

    async def _add_once(self, ring: KeyRing, bundle: CertBundle) -> CertRecord | str:
        """Add ``bundle`` under a new id; or return the id already holding it."""
        fp_key = self._keys.fingerprint(bundle.fingerprint_sha256)
        cert_id = secrets.token_hex(8)
        cert_key = self._keys.cert(cert_id)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(fp_key, cert_key)
            owner = to_bytes(await pipe.get(fp_key))
            if owner is not None:
                return owner.decode("ascii", "replace")
            if await pipe.exists(cert_key):
                raise redis.exceptions.WatchError("id collision")  # draw another id
            record = make_record(cert_id, bundle, version=1, updated_at=_now())
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hset(cert_key, mapping=encode_record(ring, record, bundle))
            pipe.set(fp_key, cert_id)
            for name in bundle.names:
                pipe.sadd(self._keys.name(name), cert_id)
            self._index(pipe, cert_id, bundle)
            self._event(pipe, "put", cert_id, bundle.names)
            await pipe.execute()
        log.info(
            "stored certificate %s for %s (sha256 %s) in %s",
            cert_id,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._url,
        )
        return record

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        ring = self._ring_for("store certificates")
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        with self._errors("replace"):
            for _ in range(_WRITE_ATTEMPTS):
                try:
                    return await self._replace_once(ring, cert_id, bundle)
                except redis.exceptions.WatchError:
                    continue
        raise self._gave_up("replace", cert_id)

    async def _replace_once(self, ring: KeyRing, cert_id: str, bundle: CertBundle) -> CertRecord:
        cert_key = self._keys.cert(cert_id)
        new_fp_key = self._keys.fingerprint(bundle.fingerprint_sha256)
        async with self._client.pipeline(transaction=True) as pipe:
            await pipe.watch(cert_key, new_fp_key)
            old = self._existing(cert_id, await pipe.hmget(cert_key, list(META_FIELDS)))
            owner = to_bytes(await pipe.get(new_fp_key))
            if owner is not None and owner != cert_id.encode("ascii"):
                raise DuplicateCertificate(
                    f"this certificate (sha256 {bundle.fingerprint_sha256}) is already stored"
                    f" as {owner.decode('ascii', 'replace')}; delete that record first"
                )
            stale_fp_key: str | None = None
            if old.fingerprint_sha256 != bundle.fingerprint_sha256:
                old_fp_key = self._keys.fingerprint(old.fingerprint_sha256)
                await pipe.watch(old_fp_key)
                if to_bytes(await pipe.get(old_fp_key)) == cert_id.encode("ascii"):
                    stale_fp_key = old_fp_key
            record = make_record(cert_id, bundle, version=old.version + 1, updated_at=_now())
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
            self._index(pipe, cert_id, bundle)
            self._event(pipe, "put", cert_id, [*bundle.names, *old.names])
            await pipe.execute()
        log.info(
            "replaced certificate %s (version %d) for %s (sha256 %s) in %s",
            cert_id,
            record.version,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._url,
        )
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        with self._errors("delete"):
            for _ in range(_WRITE_ATTEMPTS):
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
        log.info("deleted certificate %s for %s from %s", cert_id, " ".join(old.names), self._url)
        return old

    async def rotate_keys(self) -> int:
        """Re-encrypt every key not made with the ring's current data key; return how many.

        Each record is rewritten on its own (WATCH/MULTI/EXEC on its hash): its
        ``version`` and the change feed are left alone, as the certificate did
        not change.  A key that cannot be decrypted is logged and left as is.
        """
        ring = self._ring_for("rotate keys")
        rotated = 0
        low = "-"
        with self._errors("rotate keys"):
            while True:
                raw = await self._client.zrangebylex(
                    self._keys.ids(), low, "+", start=0, num=_SCAN_BATCH
                )
                if not raw:
                    break
                ids = [to_text(i) for i in raw]
                low = f"({ids[-1]}"
                ids = [i for i in ids if valid_id(i)]
                async with self._client.pipeline(transaction=False) as pipe:
                    for cert_id in ids:
                        pipe.hget(self._keys.cert(cert_id), F_KEY)
                    tokens = await pipe.execute(raise_on_error=False)
                for cert_id, token in zip(ids, tokens, strict=True):
                    if isinstance(token, bytes) and await self._rotate_one(ring, cert_id, token):
                        rotated += 1
        log.info("re-encrypted %d keys with data key %r in %s", rotated, ring.current, self._url)
        return rotated

    async def _rotate_one(self, ring: KeyRing, cert_id: str, token: bytes) -> bool:
        aad = cert_id.encode("ascii")
        try:
            if not keycrypt.needs_rotation(ring, token):
                return False
            fresh = keycrypt.reencrypt(ring, token, aad)
        except KeyDecryptError as exc:
            log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, self._url, exc)
            return False
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

    # --- change feed ----------------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        stream = self._keys.events()
        with self._errors("changes"):
            if after is None:
                try:
                    info = await self._client.xinfo_stream(stream)
                except redis.exceptions.ResponseError as exc:
                    if "no such key" not in str(exc).lower():
                        raise
                    return (), ZERO
                return (), to_text(info["last-generated-id"])
            position = parse_stream_id(after)
            if position is None:
                raise ChangesLost(f"{self._url}: {after[:40]!r} is not a change-feed position")
            found = await self._read_after(after, position)
            block = min(timeout, MAX_BLOCK)
            if found[0] or block <= 0:
                return found
            woken = await self._blocking.xread(
                {stream: after}, count=1, block=max(1, int(block * 1000))
            )
            if not woken:
                return (), after
            # The blocking read only wakes us: read again with the loss check, atomically.
            return await self._read_after(after, position)

    async def _read_after(
        self, after: str, position: StreamId
    ) -> tuple[tuple[Change, ...], str]:
        """The events after ``after`` (one batch) and the stream's state, in one MULTI/EXEC."""
        stream = self._keys.events()
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.xinfo_stream(stream)
            pipe.xread({stream: after}, count=_CHANGES_BATCH)
            raw_info, raw_entries = await pipe.execute(raise_on_error=False)
        if isinstance(raw_entries, Exception):
            raise raw_entries
        info = self._stream_info(raw_info)
        if entries_lost(position, info):
            raise ChangesLost(
                f"{self._url}: the change feed no longer holds the events after {after}"
            )
        entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]] = (
            raw_entries[0][1] if raw_entries else ()
        )
        if not entries:
            return (), after
        changes = [c for c in (self._change(i, f) for i, f in entries) if c is not None]
        return tuple(changes), to_text(entries[-1][0])

    def _change(self, entry_id: bytes, fields: Mapping[bytes, bytes]) -> Change | None:
        change = decode_change(fields)
        if change is None:
            log.warning("ignoring event %s in %s: not a change", to_text(entry_id), self._url)
        return change

    # --- helpers --------------------------------------------------------------------

    def _ring_for(self, action: str) -> KeyRing:
        if self._ring is None:
            raise ConfigError(
                f"{self._url}: cannot {action}: the Redis store encrypts private keys;"
                " configure key_file (create one with `certagent keys generate k1`)"
            )
        return self._ring

    def _index(self, pipe: Any, cert_id: str, bundle: CertBundle) -> None:
        pipe.zadd(self._keys.ids(), {cert_id: 0})
        pipe.zadd(self._keys.expiry(), {cert_id: expiry_score(bundle.not_after)})

    def _event(
        self, pipe: Any, kind: Literal["put", "delete"], cert_id: str, names: Sequence[str]
    ) -> None:
        pipe.xadd(
            self._keys.events(),
            encode_event(kind, cert_id, names),
            maxlen=self._events_maxlen,
            approximate=True,
        )

    def _existing(self, cert_id: str, row: object) -> CertRecord:
        fields = meta_fields(row)
        if fields is None:
            raise NotFound(f"{self._url}: no certificate {cert_id!r}")
        return self._record(cert_id, fields)

    def _record(self, cert_id: str, fields: Mapping[str, bytes | None]) -> CertRecord:
        """A CertRecord from a hash's META_FIELDS; StoreCorrupt (naming the record) if invalid."""
        try:
            return decode_record(cert_id, fields)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} has bad metadata: {exc}") from exc

    def _stream_info(self, raw: object) -> StreamInfo | None:
        """A pipelined XINFO STREAM reply; None if the stream does not exist."""
        if isinstance(raw, redis.exceptions.ResponseError):
            if "no such key" in str(raw).lower():
                return None
            raise raw
        if not isinstance(raw, dict):
            raise StoreError(f"{self._url}: unexpected XINFO STREAM reply {type(raw).__name__}")
        return StreamInfo.from_reply(raw)

    def _gave_up(self, action: str, what: str) -> StoreError:
        return StoreError(f"{self._url}: {action} {what}: the record kept changing; gave up")

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate redis-py and socket errors into the agent's tree, once."""
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise StoreUnavailable(f"{self._url}: {action} failed: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"{self._url}: {action} failed: {exc}") from exc


# --- pure helpers -----------------------------------------------------------------------


def _wrong_type(exc: redis.exceptions.ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")
