"""Test certificates and Redis stores: a CA whose leaves share one key, data-key files."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import redis

from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.pem import CertBundle, parse_bundle
from certagent.store.redis import RedisStore
from certagent.testing.certs import CA, KeyType, combined, issue, make_ca, shared_key


def write_key_file(path: Path, kid: str = "k1") -> Path:
    """A data-key file (``key_file`` setting) with one fresh AES-256 key, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{generate_key_line(kid)}\n")
    return path


@dataclass(frozen=True)
class RedisFixture:
    """A Redis store (URL) and the key file its records are encrypted with."""

    url: str
    key_file: Path
    #: empties the store where ``url`` is not one server (a Sentinel set, a cluster)
    flusher: Callable[[], None] | None = None

    def open(self) -> RedisStore:
        return RedisStore(self.url, keyring=KeyRing.from_file(self.key_file))

    def flushall(self) -> None:
        if self.flusher is not None:
            self.flusher()
            return
        with redis.Redis.from_url(self.url, socket_timeout=5) as client:
            client.flushall()

    def put(self, bundles: Iterable[CertBundle], *, concurrency: int = 1) -> int:
        """Store ``bundles`` with the agent's own ``RedisStore.put`` (MULTI/EXEC each).

        ``concurrency`` puts run at once (the benchmarks fill 100k records).
        Returns how many were stored.
        """

        async def main() -> int:
            store = self.open()
            done = 0
            try:
                batch: list[CertBundle] = []
                for bundle in bundles:
                    batch.append(bundle)
                    if len(batch) >= concurrency:
                        await asyncio.gather(*(store.put(b) for b in batch))
                        done += len(batch)
                        batch = []
                if batch:
                    await asyncio.gather(*(store.put(b) for b in batch))
                    done += len(batch)
            finally:
                await store.close()
            return done

        return asyncio.run(main())

# --- certificates ------------------------------------------------------------------------


@dataclass
class PKI:
    """A test CA (root written to ``cafile`` for clients); leaves share one key (fast)."""

    ca: CA
    cafile: Path
    key_type: KeyType = "ec"

    @classmethod
    def create(cls, cafile: Path, name: str = "certagent test CA", key_type: KeyType = "ec") -> PKI:
        ca = make_ca(name, key_type=key_type)
        cafile.parent.mkdir(parents=True, exist_ok=True)
        cafile.write_bytes(ca.root_pem)
        return cls(ca, cafile, key_type)

    def chain_and_key(self, *names: str) -> tuple[bytes, bytes]:
        return issue(self.ca, *names, key=shared_key(self.key_type))

    def bundle(self, *names: str) -> CertBundle:
        return parse_bundle(*self.chain_and_key(*names))

    def combined_pem(self, *names: str) -> bytes:
        return combined(*self.chain_and_key(*names))

