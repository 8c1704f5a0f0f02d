"""Certificates in Redis.

Key layout (``prefix`` defaults to ``certagent:``; all values are bytes)::

    {prefix}cert:{id}     HASH   pem    leaf + chain + private key, normalised PEM
                                 names  the bundle's names, space-separated
    {prefix}name:{name}   STRING {id}

``id`` is the first 32 hex digits of the leaf certificate's SHA-256, so storing
the same certificate twice writes the same record.  ``name`` is a validated
lowercase hostname or a wildcard written as is (``*.example.com``).  A lookup
for ``a.example.com`` reads ``name:a.example.com`` and ``name:*.example.com``
in one MGET, takes the first id found, then HGETs that record's ``pem``: two
round trips.  :meth:`RedisStore.put` writes a record and its name entries in one
MULTI/EXEC.  Records are never deleted by the agent; a record no name points to
any more is garbage an operator may remove.

:class:`Keys` is the only place that builds key names.  docs/store.md describes
the same layout for people writing certificates from outside the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from agent import hostname
from agent.errors import ConfigError, InvalidHostname, StoreError, StoreUnavailable
from agent.pem import CertBundle
from agent.store.base import StoredCertificate, candidate_names, check_record, redact_url

__all__ = ["DEFAULT_PREFIX", "ID_LENGTH", "Keys", "RedisStore", "record_id"]

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "certagent:"
ID_LENGTH = 32
FIELD_PEM = "pem"
FIELD_NAMES = "names"
_PUT_ATTEMPTS = 5


@dataclass(frozen=True)
class Keys:
    """Builds every Redis key the store uses."""

    prefix: str = DEFAULT_PREFIX

    def cert(self, cert_id: str) -> str:
        return f"{self.prefix}cert:{cert_id}"

    def name(self, name: str) -> str:
        return f"{self.prefix}name:{name}"


def record_id(bundle: CertBundle) -> str:
    """The id a bundle is stored under: the first 32 hex digits of its SHA-256."""
    return bundle.fingerprint_sha256[:ID_LENGTH]


class RedisStore:
    """A :class:`~agent.store.base.Store` on Redis (``redis://``, ``rediss://``, ``unix://``)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = 2.0,
        health_check_interval: float = 15.0,
    ) -> None:
        self._url = redact_url(url)
        self._keys = Keys(prefix)
        try:
            self._client = redis.asyncio.Redis.from_url(
                url,
                decode_responses=False,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                health_check_interval=health_check_interval,
                # One immediate retry covers a pooled connection the server closed;
                # redis-py's default (10 retries with backoff) would stall the lazy path.
                retry=Retry(NoBackoff(), 1),
            )
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

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        names = candidate_names(hostname)
        name = names[0]
        with self._errors("lookup"):
            ids = [_bytes(i) for i in await self._client.mget([self._keys.name(n) for n in names])]
            found = next(((n, i) for n, i in zip(names, ids, strict=True) if i is not None), None)
            if found is None:
                return None
            indexed_as, raw_id = found
            cert_id = raw_id.decode("ascii", "replace")
            try:
                pem = _bytes(await self._client.hget(self._keys.cert(cert_id), FIELD_PEM))
            except redis.exceptions.ResponseError as exc:
                if not _wrong_type(exc):
                    raise
                pem = None
        if pem is None:
            log.warning(
                "ignoring store record for %s: %s: %s points to %r, which is not a record",
                name,
                self._url,
                self._keys.name(indexed_as),
                cert_id,
            )
            return None
        return check_record(self._url, cert_id, name, pem)

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        found = await self.lookup(hostname)
        return () if found is None else (found,)

    async def put(self, bundle: CertBundle) -> str:
        cert_id = record_id(bundle)
        cert_key = self._keys.cert(cert_id)
        with self._errors("put"):
            for _ in range(_PUT_ATTEMPTS):
                try:
                    await self._put_once(bundle, cert_id, cert_key)
                except redis.exceptions.WatchError:
                    continue
                log.info(
                    "stored certificate %s for %s in %s", cert_id, " ".join(bundle.names), self._url
                )
                return cert_id
        raise StoreError(f"{self._url}: put {cert_id}: the record kept changing; gave up")

    async def _put_once(self, bundle: CertBundle, cert_id: str, cert_key: str) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            # WATCH the record, read the names it had, then write in one MULTI/EXEC.
            await pipe.watch(cert_key)
            try:
                old = _bytes(await pipe.hget(cert_key, FIELD_NAMES))
            except redis.exceptions.ResponseError as exc:
                if not _wrong_type(exc):
                    raise
                old = None  # not a hash: overwritten below
            stale_keys = [self._keys.name(n) for n in _stale_names(old, bundle.names)]
            if stale_keys:
                # Only drop stale name entries that still point to this record.
                await pipe.watch(*stale_keys)
                targets = [_bytes(t) for t in await pipe.mget(stale_keys)]
                stale_keys = [
                    key
                    for key, target in zip(stale_keys, targets, strict=True)
                    if target == cert_id.encode()
                ]
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.delete(cert_key)
            names = " ".join(bundle.names)
            pipe.hset(cert_key, mapping={FIELD_PEM: bundle.pem, FIELD_NAMES: names})
            for name in bundle.names:
                pipe.set(self._keys.name(name), cert_id)
            if stale_keys:
                pipe.delete(*stale_keys)
            await pipe.execute()

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Translate redis-py and socket errors into the agent's tree, once."""
        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise StoreUnavailable(f"{self._url}: {action} failed: {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"{self._url}: {action} failed: {exc}") from exc


def _wrong_type(exc: redis.exceptions.ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")


def _bytes(value: bytes | str | None) -> bytes | None:
    """redis-py types replies as ``bytes | str``; with decode_responses=False they are bytes."""
    return value.encode() if isinstance(value, str) else value


def _stale_names(old: bytes | None, current: tuple[str, ...]) -> list[str]:
    """Valid names in a record's old ``names`` field that ``current`` no longer has."""
    if not old:
        return []
    stale: list[str] = []
    for raw in old.decode("ascii", "replace").split():
        try:
            name = hostname.normalise_pattern(raw)
        except InvalidHostname:
            continue
        if name not in current and name not in stale:
            stale.append(name)
    return stale
