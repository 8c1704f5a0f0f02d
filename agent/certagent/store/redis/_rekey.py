"""``certagent keys rotate`` on Redis: re-encrypt every private key with the current data key.

A record keeps its layout when the store is at format 1 (a hash's ``key`` field is
swapped for one encrypted with the current key, as releases before 0.2.0 read it); at
format 2 a hash is rewritten in format 2 at the same time (:mod:`._migrate`'s
:func:`~._migrate.repack`).  Records keep their id, version, metadata, OCSP response
and index entries, and no event is written (the certificates did not change); agents
keep serving throughout.  Each record is swapped on its own, only if it is still the
one read, so a write meanwhile wins and the record is left for the next run.
"""

from __future__ import annotations

import logging

import redis.asyncio

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.errors import KeyDecryptError
from certagent.store.redis._layout import F_CHAIN, F_KEY, Keys
from certagent.store.redis._listing import every_id
from certagent.store.redis._migrate import repack
from certagent.store.redis._packed import chain_digest, key_aad
from certagent.store.redis._rows import SWAP, Row, decode, fetch
from certagent.store.redis._writer import RecordWriter

__all__ = ["reencrypt_all"]

log = logging.getLogger(__name__)

_BATCH = 500


async def reencrypt_all(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    ring: KeyRing,
    writer: RecordWriter,
    layout: int,
) -> int:
    """Re-encrypt every key not made with the ring's current data key; with the store at
    format ``layout`` 2, rewrite every hash in format 2 too (its key re-encrypted);
    return how many records changed.

    Walks the ``ids`` index in batches (O(N) records, O(N / 500) round trips
    plus one write per record changed).  A layout-2 record is swapped whole by
    ``writer`` (:meth:`~certagent.store.redis._writer.RecordWriter.set_key`, a
    compare-and-set); its ``version`` and the change feed are left alone, as
    the certificate did not change.  A record that cannot be decrypted or parsed
    is logged and left as is.  redis-py errors escape (the store translates them).
    """
    changed = rewritten = 0
    async for ids in every_id(client, keys, _BATCH):
        replies = await fetch(client, keys, ids, [F_CHAIN])
        for cert_id, reply in zip(ids, replies, strict=True):
            try:
                row = None if isinstance(reply, Exception) else decode(reply, [F_CHAIN])
            except ValueError as exc:
                log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, shown, exc)
                continue
            if row is None:
                continue
            if row.packed is not None:
                changed += await _packed(shown, ring, cert_id, row, writer)
            elif layout == 1:
                changed += await _hashed(shown, ring, cert_id, row, writer)
            elif await _rewrite(client, keys, shown, ring, cert_id, row):
                changed += 1
                rewritten += 1
    log.info(
        "re-encrypted the keys of %d records with data key %r in %s (%d of them rewritten"
        " from format 1 to format 2)",
        changed,
        ring.current,
        shown,
        rewritten,
    )
    return changed


async def _packed(shown: str, ring: KeyRing, cert_id: str, row: Row, writer: RecordWriter) -> bool:
    """A layout-2 record: the whole record swapped for one with its key re-encrypted."""
    assert row.packed is not None
    token = row.packed.key_token
    try:
        if not keycrypt.needs_rotation(ring, token):
            return False
        fresh = keycrypt.reencrypt(ring, token, key_aad(cert_id))
    except KeyDecryptError as exc:
        log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, shown, exc)
        return False
    return await writer.set_key(cert_id, row.raw, row.packed.with_fields(K=fresh))


async def _hashed(shown: str, ring: KeyRing, cert_id: str, row: Row, writer: RecordWriter) -> bool:
    """A hash of a store at format 1: its ``key`` field swapped for one with the current key."""
    token = row.fields.get(F_KEY)
    try:
        if token is None:
            raise KeyDecryptError("the record has no key")
        if not keycrypt.needs_rotation(ring, token):
            return False
        fresh = keycrypt.reencrypt(ring, token, cert_id.encode("ascii"))
    except KeyDecryptError as exc:
        log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, shown, exc)
        return False
    return await writer.set_key(cert_id, token, fresh)


async def _rewrite(
    client: redis.asyncio.Redis, keys: Keys, shown: str, ring: KeyRing, cert_id: str, row: Row
) -> bool:
    """A hash rewritten in format 2: the same record, its chain shared, its key encrypted
    with the current data key.  False if it changed meanwhile (or is unusable)."""
    try:
        payload, shared = repack(ring, cert_id, row)
    except ValueError as exc:
        log.warning("cannot rewrite record %r of %s in format 2: %s", cert_id, shown, exc)
        return False
    if shared:
        await client.set(keys.chain(chain_digest(shared)), shared)  # before the record
    return bool(await client.eval(SWAP, 1, keys.cert(cert_id), row.state, payload) == 1)
