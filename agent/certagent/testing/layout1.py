"""Records of the Redis store's first layout (one hash per record), as stores written
before layout 2 hold them: for tests and benches that check they are still read.

:func:`add_layout1` writes one record exactly as the writers did before layout 2
(the hash, its fingerprint, name sets, ``ids``, ``expiry`` and the ``put``
event, in one MULTI/EXEC); on a cluster (``keys.cluster``) in the same order of
one-slot steps as the cluster writer did.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import redis.asyncio

from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.store.base import CertRecord
from certagent.store.records import make_record
from certagent.store.redis import Keys
from certagent.store.redis._records import encode_event, encode_record, expiry_score

__all__ = ["add_layout1"]


async def add_layout1(
    client: redis.asyncio.Redis,
    keys: Keys,
    ring: KeyRing,
    bundle: CertBundle,
    *,
    managed: str = "",
    ocsp: bytes | None = None,
) -> CertRecord:
    """Add ``bundle`` as a layout-1 record (a hash) under a new id; return its record."""
    now = datetime.now(UTC).replace(microsecond=0)
    record = make_record(secrets.token_hex(8), bundle, version=1, updated_at=now, managed=managed)
    fields = encode_record(ring, record, bundle)
    if ocsp is not None:
        fields["ocsp"] = ocsp
    event = encode_event("put", record.id, record.names)
    score = expiry_score(record.not_after)
    if keys.cluster:
        await client.hset(keys.cert(record.id), mapping=fields)
        await client.set(keys.fingerprint(record.fingerprint_sha256), record.id)
        for name in record.names:
            await client.sadd(keys.name(name), record.id)
        async with client.pipeline(transaction=True) as pipe:
            pipe.zadd(keys.ids(), {record.id: 0})
            pipe.zadd(keys.expiry(), {record.id: score})
            pipe.xadd(keys.events(), event)
            await pipe.execute()
        return record
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(keys.cert(record.id), mapping=fields)
        pipe.set(keys.fingerprint(record.fingerprint_sha256), record.id)
        for name in record.names:
            pipe.sadd(keys.name(name), record.id)
        pipe.zadd(keys.ids(), {record.id: 0})
        pipe.zadd(keys.expiry(), {record.id: score})
        pipe.xadd(keys.events(), event)
        await pipe.execute()
    return record
