"""Certificates in Redis, private keys encrypted at rest.

One Redis (``redis://``, ``rediss://``, ``unix://``), the master a Sentinel set
names (``redis+sentinel://``) or a Redis Cluster (``redis+cluster://``); the
connections are :mod:`certagent.store._redis_conn`'s.
Key layout: :mod:`certagent.store._redis_layout` (and docs/store.md, for operators).
Every write (add, replace, delete) changes the record, its name sets, the
fingerprint index, both sorted sets and appends its event (the record's names
before and after) in one MULTI/EXEC, WATCHing the keys it read first, retrying
if one changed; on a cluster, where those keys live in several slots, the same
writes are ordered idempotent steps (:mod:`certagent.store._redis_cluster`).
:attr:`RedisStore.bulk` adds many records per round trip, one Lua script each.
A lookup (:mod:`certagent.store._redis_lookup`) is one round trip: LOOKUP_SCRIPT
reads the exact name's set, else its wildcard's, and the ``chain`` and ``key`` of
each valid id (two pipelined round trips on a cluster, or for a user who may not
run scripts).  Keys are
decrypted with the :class:`~certagent.certs.keycrypt.KeyRing` (``key_file``).
:meth:`RedisStore.changes` is :class:`~certagent.store._redis_feed.ChangeFeed`.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, Literal

import redis.asyncio
import redis.exceptions

from certagent.certs import hostname, keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.errors import (
    ConfigError,
    DuplicateCertificate,
    InvalidHostname,
    KeyDecryptError,
    NotFound,
    StoreCorrupt,
    StoreError,
)
from certagent.store._redis_bulk import BulkAdds, IdTaken, PreparedRecord, RecordEncoder
from certagent.store._redis_cluster import ClusterWrites, Stored
from certagent.store._redis_conn import CLUSTER_SCHEME, close_client, connect, redis_errors
from certagent.store._redis_feed import MAX_BLOCK, ChangeFeed
from certagent.store._redis_layout import (
    DEFAULT_PREFIX,
    F_KEY,
    META_FIELDS,
    Keys,
    decode_record,
    encode_event,
    encode_record,
    expiry_score,
    meta_fields,
    tickets_event,
    to_bytes,
    to_text,
    valid_id,
)
from certagent.store._redis_lookup import Lookup
from certagent.store._redis_ocsp import store_ocsp
from certagent.store._redis_rekey import reencrypt_all
from certagent.store._redis_tickets import RedisTicketRing
from certagent.store.base import (
    CertRecord,
    Change,
    Page,
    StoredCertificate,
    decode_cursor,
    encode_cursor,
    make_record,
    redact_url,
)

__all__ = [
    "DEFAULT_EVENTS_MAXLEN",
    "DEFAULT_PREFIX",
    "MAX_BLOCK",
    "BulkAdds",
    "IdTaken",
    "Keys",
    "PreparedRecord",
    "RecordEncoder",
    "RedisStore",
]

log = logging.getLogger(__name__)

#: About this many events stay in the stream (``XADD MAXLEN ~``).
DEFAULT_EVENTS_MAXLEN = 100_000

_WRITE_ATTEMPTS = 5
_SCAN_BATCH = 500


def _now() -> datetime:
    """The clock, to the second as stored; tests replace this function."""
    return datetime.now(UTC).replace(microsecond=0)


class RedisStore:
    """A :class:`~certagent.store.base.Store` on Redis: one server, Sentinel or Cluster."""

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
        cluster = url.lower().startswith(f"{CLUSTER_SCHEME}://")
        try:
            self._keys = Keys(prefix, cluster=cluster)
        except ValueError as exc:
            raise ConfigError(f"redis_prefix {prefix!r}: {exc}") from exc
        self._ring = keyring
        self._events_maxlen = events_maxlen
        self._client = connect(url, self._url, timeout, timeout, health_check_interval)
        # a cluster cannot write a record in one MULTI: ordered steps instead
        self._cluster = (
            ClusterWrites(self._client, self._keys, self._url, events_maxlen) if cluster else None
        )
        self._bulk = BulkAdds(
            self._client,
            self._keys,
            self._url,
            events_maxlen,
            self._ring_for,
            lambda: _now(),
            cluster=self._cluster,
        )
        self._tickets = RedisTicketRing(
            self._client, self._keys, self._url, self._ring_for, tickets_event
        )
        self._lookup = Lookup(
            self._client, self._keys, self._url, self._ring_for, script=not cluster
        )
        # XREAD BLOCK holds its connection for up to MAX_BLOCK: give it its own pool,
        # whose socket timeout outlasts the block.
        self._feed = ChangeFeed(
            self._client,
            connect(url, self._url, MAX_BLOCK + timeout, timeout, health_check_interval),
            self._keys,
            self._url,
            cluster=cluster,
        )

    @property
    def keys(self) -> Keys:
        return self._keys

    @property
    def keyring(self) -> KeyRing | None:
        return self._ring

    @property
    def tickets(self) -> RedisTicketRing:
        """The fleet's TLS ticket-key ring: :mod:`certagent.store._redis_tickets`."""
        return self._tickets

    @property
    def bulk(self) -> BulkAdds:
        """Many adds per round trip (``add_many``): :mod:`certagent.store._redis_bulk`."""
        return self._bulk

    def describe(self) -> str:
        return self._url

    async def names(self) -> AsyncIterator[str]:
        """Every ``name:`` key's name, by SCAN (O(N), in batches; see Store.names)."""
        with self._errors("names"):
            # on a cluster, scan_iter walks every master in turn
            async for key in self._client.scan_iter(
                match=self._keys.name_pattern(), count=_SCAN_BATCH
            ):
                try:
                    yield hostname.normalise_pattern(self._keys.name_of(to_text(key)))
                except InvalidHostname:
                    continue

    async def ping(self) -> None:
        with self._errors("ping"):
            await self._client.ping()

    async def close(self) -> None:
        with self._errors("close"):
            await close_client(self._client)
            await self._feed.close()

    # --- reads ----------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        found = await self.lookup_all(hostname)
        return found[0] if found else None

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """:class:`~certagent.store._redis_lookup.Lookup`: one round trip, two on a cluster."""
        return await self._lookup.all(hostname)

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` for the record's leaf and keep it with the record (a ``put`` event)."""
        with self._errors("store an OCSP response"):
            if self._cluster is not None:
                return await self._cluster.put_ocsp(cert_id, der, now)
            return await store_ocsp(
                self._client, self._keys, self._url, cert_id, der, now, self._event
            )

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
                ids = [i for i, s in zip(ids, scores, strict=True) if s is not None and s < before]
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
        if self._cluster is not None:
            (got,) = await self._cluster.add([RecordEncoder(ring).prepare(bundle, _now())])
            if isinstance(got, IdTaken):
                raise redis.exceptions.WatchError("id collision")  # draw another id
            if isinstance(got, (Stored, StoreError)):
                return got.owner if isinstance(got, Stored) else _raise(got)
            log.info("stored certificate %s for %s in %s", got.id, " ".join(got.names), self._url)
            return got
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
            if self._cluster is not None:
                return await self._cluster.replace(ring, cert_id, bundle, _now())
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
            if self._cluster is not None:
                return await self._cluster.delete(cert_id)
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
        """Re-encrypt every key not made with the current data key: :mod:`._redis_rekey`."""
        ring = self._ring_for("rotate keys")
        with self._errors("rotate keys"):
            rotated = await reencrypt_all(self._client, self._keys, self._url, ring, self._cluster)
        await self._tickets.reencrypt()
        return rotated

    async def key_ids_in_use(self, sample: int = 32) -> set[str]:
        """Data-key ids of ``sample`` random records and of the ticket ring: O(sample).

        What an agent checks at start against its key file (a node made with
        its own data key cannot decrypt the fleet's records).
        """
        with self._errors("sample the data keys in use"):
            picked = await self._client.zrandmember(self._keys.ids(), sample)
            ids = [to_text(i) for i in picked or ()]
            async with self._client.pipeline(transaction=False) as pipe:
                for cert_id in ids:
                    pipe.hget(self._keys.cert(cert_id), F_KEY)
                pipe.hmget(self._keys.tls_ring(), ["k0", "k1", "k2"])
                *tokens, ring = await pipe.execute()
        found = set()
        for token in [*tokens, *ring]:
            if isinstance(token, bytes):
                with contextlib.suppress(KeyDecryptError):
                    found.add(keycrypt.token_kid(token))
        return found

    # --- change feed ----------------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        with self._errors("changes"):
            return await self._feed.changes(after, timeout)

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

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)

    def _gave_up(self, action: str, what: str) -> StoreError:
        return StoreError(f"{self._url}: {action} {what}: the record kept changing; gave up")


def _raise(exc: StoreError) -> str:
    raise exc
