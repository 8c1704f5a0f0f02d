"""The name filter's snapshot in Redis: one string key, ``{prefix}namefilter``.

Written whole by one SET (≈2.4 MB for a store of a million names, see
:mod:`certagent.service.bloom`); on a cluster the key is on the ``{global}``
slot.  A read of its header is one GETRANGE.
"""

from __future__ import annotations

import redis.asyncio

from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_bytes

__all__ = ["RedisSnapshotSlot"]


class RedisSnapshotSlot:
    """A :class:`~certagent.store.base.SnapshotSlot` shared by every agent on this Redis."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str) -> None:
        self._client = client
        self._key = keys.name_filter()
        self._url = shown

    def describe(self) -> str:
        return f"{self._url} key {self._key}"

    async def read(self, limit: int | None = None) -> bytes | None:
        with redis_errors(self._url, "reading the name filter snapshot"):
            if limit is None:
                raw = await self._client.get(self._key)
            else:
                raw = await self._client.getrange(self._key, 0, max(0, limit - 1))
        data = to_bytes(raw)
        return data or None

    async def write(self, data: bytes) -> None:
        with redis_errors(self._url, "writing the name filter snapshot"):
            await self._client.set(self._key, data)
