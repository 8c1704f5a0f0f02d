"""The shared chains of layout-2 records: read, checked against their SHA-256, cached.

A chain (the certificates after the leaf) is stored once, as the string
``chain:{sha256}`` (:mod:`._packed`), and named by every record it serves.  Its
key is its content's SHA-256, so a chain read once never changes: a reader
keeps the chains it has seen (:class:`Chains`, a handful in a real store: one
per issuing intermediate) and reads one from Redis only the first time a record
names it -- one more round trip, once per chain and process.  On a cluster the
chain lives in its own slot (tagged by its SHA-256): every writer writes it
before the record that names it, so a reader finding the record finds it.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio
from cryptography import x509

from certagent.certs.pem import split_blocks
from certagent.errors import StoreCorrupt
from certagent.store.redis._layout import F_CHAIN, Keys, to_bytes
from certagent.store.redis._packed import chain_digest, chain_pem
from certagent.store.redis._rows import Row

__all__ = ["Chains", "chain_of"]

#: Chains kept by one reader; past it the cache starts again (a store has a handful).
CACHE_LIMIT = 1_024


class Chains:
    """The chains one reader has read (PEM by SHA-256); O(1) per record once read."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._pem: dict[bytes, bytes] = {}

    def pem(self, digest: bytes) -> bytes | None:
        """The chain's PEM if read already (:meth:`load`), else None."""
        return self._pem.get(digest)

    async def load(self, digests: Iterable[bytes]) -> list[str]:
        """Read the chains not cached yet, in one pipeline; why each that failed did."""
        todo = sorted({d for d in digests if d not in self._pem})
        if not todo:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for digest in todo:
                pipe.get(self._keys.chain(digest))
            replies = await pipe.execute(raise_on_error=False)
        problems: list[str] = []
        if len(self._pem) + len(todo) > CACHE_LIMIT:
            self._pem.clear()
        for digest, reply in zip(todo, replies, strict=True):
            try:
                self._pem[digest] = parsed(self._keys, digest, checked(self._keys, digest, reply))
            except StoreCorrupt as exc:
                problems.append(str(exc))
        return problems


def checked(keys: Keys, digest: bytes, reply: object) -> bytes:
    """A chain's PEM from its key's reply; StoreCorrupt if missing or not what it should be."""
    key = keys.chain(digest)
    raw = to_bytes(reply) if not isinstance(reply, Exception) else None
    if raw is None:
        why = f"cannot be read ({reply})" if isinstance(reply, Exception) else "is missing"
        raise StoreCorrupt(f"the shared chain {key} {why}")
    if chain_digest(raw) != digest:
        raise StoreCorrupt(f"the shared chain {key} does not match its SHA-256 (altered?)")
    try:
        return chain_pem(raw)
    except ValueError as exc:
        raise StoreCorrupt(f"the shared chain {key} is not DER certificates: {exc}") from exc


def parsed(keys: Keys, digest: bytes, pem: bytes) -> bytes:
    """``pem``, once each of its certificates parses (StoreCorrupt if one does not).

    Checked once per chain and reader, where a record's bundle used to parse every
    certificate of its chain on each load (:func:`~certagent.certs.pem.parse_der_bundle`).
    """
    for index, (_, block) in enumerate(split_blocks(pem)):
        try:
            x509.load_pem_x509_certificate(block)
        except ValueError as exc:
            raise StoreCorrupt(
                f"the shared chain {keys.chain(digest)}: certificate #{index + 1} cannot be parsed"
            ) from exc
    return pem


async def chain_of(
    client: redis.asyncio.Redis, keys: Keys, shown: str, cert_id: str, row: Row
) -> bytes:
    """The whole chain of a record (leaf first, PEM): a hash's ``chain`` field (read with
    ``extra=[F_CHAIN]``), or a layout-2 record's leaf and its shared chain (one GET).
    StoreCorrupt if it cannot be had."""
    if row.packed is None:
        chain = row.fields.get(F_CHAIN)
        if chain is None:
            raise StoreCorrupt(f"{shown}: record {cert_id!r} has no chain")
        return chain
    digest = row.packed.chain_digest
    if digest is None:
        return row.packed.leaf_pem()
    try:
        return row.packed.leaf_pem() + checked(keys, digest, await client.get(keys.chain(digest)))
    except StoreCorrupt as exc:
        raise StoreCorrupt(f"{shown}: record {cert_id!r}: {exc}") from exc
