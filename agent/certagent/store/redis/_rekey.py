"""``certagent keys rotate`` on Redis: re-encrypt every private key with the current data key."""

from __future__ import annotations

import logging

import redis.asyncio

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.errors import KeyDecryptError
from certagent.store.redis._layout import F_KEY, Keys, to_text, valid_id
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
) -> int:
    """Re-encrypt every key not made with the ring's current data key; return how many.

    Walks the ``ids`` index in batches (O(N) records, O(N / 500) round trips
    plus one write per re-encrypted key).  Each record's key is swapped on its
    own by ``writer`` (:meth:`~certagent.store.redis._writer.RecordWriter.set_key`,
    a compare-and-set): its ``version`` and the change feed are left alone, as
    the certificate did not change.  A key that cannot be decrypted is logged
    and left as is.  redis-py errors escape (the store translates them).
    """
    rotated = 0
    low = "-"
    while True:
        raw = await client.zrangebylex(keys.ids(), low, "+", start=0, num=_BATCH)
        if not raw:
            break
        ids = [to_text(i) for i in raw]
        low = f"({ids[-1]}"
        ids = [i for i in ids if valid_id(i)]
        async with client.pipeline(transaction=False) as pipe:
            for cert_id in ids:
                pipe.hget(keys.cert(cert_id), F_KEY)
            tokens = await pipe.execute(raise_on_error=False)
        for cert_id, token in zip(ids, tokens, strict=True):
            if isinstance(token, bytes) and await _one(shown, ring, cert_id, token, writer):
                rotated += 1
    log.info("re-encrypted %d keys with data key %r in %s", rotated, ring.current, shown)
    return rotated


async def _one(shown: str, ring: KeyRing, cert_id: str, token: bytes, writer: RecordWriter) -> bool:
    aad = cert_id.encode("ascii")
    try:
        if not keycrypt.needs_rotation(ring, token):
            return False
        fresh = keycrypt.reencrypt(ring, token, aad)
    except KeyDecryptError as exc:
        log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, shown, exc)
        return False
    return await writer.set_key(cert_id, token, fresh)
