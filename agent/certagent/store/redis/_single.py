"""Keeping an OCSP response with its record in Redis (the ``ocsp`` field of the hash)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis.asyncio
import redis.exceptions

from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.errors import NotFound, StoreError
from certagent.store._redis_layout import (
    F_CHAIN,
    F_NAMES,
    F_OCSP,
    Keys,
    parse_names,
    to_bytes,
    valid_id,
)

__all__ = ["store_ocsp"]


async def store_ocsp(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    cert_id: str,
    der: bytes,
    now: datetime,
    event: Callable[[Any, Any, str, list[str]], None],
) -> OcspFacts:
    """Check ``der`` against the record's chain, then HSET it with a ``put`` event, atomically.

    WATCH on the record: a record replaced meanwhile (another leaf) makes this
    fail rather than keep a response for a certificate it is not about.
    """
    if not valid_id(cert_id):
        raise NotFound(f"{shown}: no certificate {cert_id[:70]!r}")
    cert_key = keys.cert(cert_id)
    async with client.pipeline(transaction=True) as pipe:
        await pipe.watch(cert_key)
        chain, names = (to_bytes(v) for v in await pipe.hmget(cert_key, [F_CHAIN, F_NAMES]))
        if chain is None:
            raise NotFound(f"{shown}: no certificate {cert_id[:70]!r}")
        facts = check_for_chain(chain, der, now)
        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.hset(cert_key, F_OCSP, der)
        event(pipe, "put", cert_id, list(parse_names(names)))
        try:
            await pipe.execute()
        except redis.exceptions.WatchError as exc:
            raise StoreError(
                f"{shown}: certificate {cert_id} changed while its OCSP response was stored;"
                " check the response against the new certificate and try again"
            ) from exc
    return facts
