"""``certagent keys rotate`` on Redis: re-encrypt every private key with the current data key."""

from __future__ import annotations

import logging

import redis.asyncio
import redis.exceptions

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.errors import KeyDecryptError
from certagent.store._redis_cluster import ClusterWrites
from certagent.store._redis_layout import F_KEY, Keys, to_bytes, to_text, valid_id

__all__ = ["reencrypt_all"]

log = logging.getLogger(__name__)

_BATCH = 500


async def reencrypt_all(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    ring: KeyRing,
    cluster: ClusterWrites | None = None,
) -> int:
    """Re-encrypt every key not made with the ring's current data key; return how many.

    Walks the ``ids`` index in batches (O(N) records, O(N / 500) round trips
    plus one transaction per re-encrypted key).  Each record is rewritten on
    its own (WATCH/MULTI/EXEC on its hash): its ``version`` and the change feed
    are left alone, as the certificate did not change.  A key that cannot be
    decrypted is logged and left as is.  On a cluster each swap is a one-key
    compare-and-set script instead.  redis-py errors escape (the store
    translates them).
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
            if isinstance(token, bytes) and await _one(
                client, keys, shown, ring, cert_id, token, cluster
            ):
                rotated += 1
    log.info("re-encrypted %d keys with data key %r in %s", rotated, ring.current, shown)
    return rotated


async def _one(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    ring: KeyRing,
    cert_id: str,
    token: bytes,
    cluster: ClusterWrites | None,
) -> bool:
    aad = cert_id.encode("ascii")
    try:
        if not keycrypt.needs_rotation(ring, token):
            return False
        fresh = keycrypt.reencrypt(ring, token, aad)
    except KeyDecryptError as exc:
        log.warning("cannot re-encrypt the key of record %r in %s: %s", cert_id, shown, exc)
        return False
    if cluster is not None:
        return await cluster.set_key(cert_id, token, fresh)
    cert_key = keys.cert(cert_id)
    async with client.pipeline(transaction=True) as pipe:
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
