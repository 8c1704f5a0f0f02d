"""The fleet's TLS ticket-key ring in Redis, encrypted with the data key.

One HASH, ``{prefix}tls:ring``: ``generation``, ``rotated_at`` (Unix seconds)
and ``k0`` .. ``k2``, each key a keycrypt token (aad ``tls-ticket-key``), oldest
first.  One rotation at a time: an agent takes ``{prefix}tls:lock`` (``SET NX
PX``, its own random token), re-reads the ring, writes the next generation only
if the ring is still the one it expected, appends a ``tls-keys`` event to the
change feed (every agent then loads the new ring and pushes it into its HAProxy)
and releases the lock if it still holds it.  Every command touches one key, so
this works unchanged on a Redis Cluster.  O(1) per call.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import redis.asyncio

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.ticketkeys import RING_SIZE, TicketRing, parse_key
from certagent.errors import KeyDecryptError, RotationInProgress, StoreCorrupt
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_text

__all__ = ["LOCK_SECONDS", "RedisTicketRing"]

log = logging.getLogger(__name__)

#: How long a rotation may hold the lock before another agent may take it.
LOCK_SECONDS = 10.0
_AAD = b"tls-ticket-key"
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisTicketRing:
    """Reads and rotates the ring; a :class:`~certagent.store.base.RingStore`."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        keyring: Callable[[str], KeyRing],
        events: Callable[[], Mapping[Any, Any]],
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._keyring = keyring
        self._event = events
        self._release = client.register_script(_RELEASE)

    def describe(self) -> str:
        return f"{self._url} ({self._keys.tls_ring()})"

    async def load(self) -> TicketRing | None:
        """The ring as stored; None if there is none yet.

        Raises KeyDecryptError naming the data key the ring was encrypted with
        when the key file lacks it, StoreCorrupt for a malformed ring.
        """
        with self._errors("read the ticket-key ring"):
            raw: Mapping[bytes, bytes] = await self._client.hgetall(  # type: ignore[assignment]
                self._keys.tls_ring()
            )
        if not raw:
            return None
        return self._decode(raw)

    async def rotate(
        self, expected: int | None, make: Callable[[TicketRing | None], TicketRing]
    ) -> TicketRing:
        """Store ``make(ring)`` if the ring's generation is still ``expected``.

        ``expected`` None means "there is no ring yet"; ``make`` gets None when
        there is none (a first start, or a store that lost it).  Returns the ring
        stored afterwards: the new one, or the one another agent wrote meanwhile.
        Raises Locked if another agent holds the rotation lock.
        """
        token = secrets.token_hex(16)
        lock = self._keys.tls_lock()
        with self._errors("take the ticket-key lock"):
            taken = await self._client.set(lock, token, nx=True, px=int(LOCK_SECONDS * 1000))
        if not taken:
            raise RotationInProgress(f"{self._url}: another agent is rotating the ticket keys")
        try:
            current = await self.load()
            if current is not None and current.generation != expected:
                return current  # another agent rotated meanwhile
            ring = make(current)
            fields: dict[str, str | bytes] = {
                "generation": str(ring.generation),
                "rotated_at": f"{ring.rotated_at:.3f}",
            }
            keyring = self._keyring("store ticket keys")
            for index, key in enumerate(ring.keys):
                fields[f"k{index}"] = keycrypt.encrypt(keyring, key.encode("ascii"), _AAD)
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(self._keys.tls_ring(), mapping=fields)  # type: ignore[arg-type]
                pipe.xadd(self._keys.events(), self._event())  # type: ignore[arg-type]
                with self._errors("write the ticket-key ring"):
                    await pipe.execute()
            log.info("ticket keys rotated to generation %d", ring.generation)
            return ring
        finally:
            with self._errors("release the ticket-key lock"):
                await self._release(keys=[lock], args=[token])

    async def reencrypt(self) -> None:
        """Write the ring again with the current data key (``certagent keys rotate``)."""
        ring = await self.load()
        if ring is not None:
            await self.rotate(ring.generation, lambda same: ring)

    def _decode(self, raw: Mapping[bytes, bytes]) -> TicketRing:
        where = f"{self._url}: ticket-key ring {self._keys.tls_ring()}"
        keyring = self._keyring("read ticket keys")
        keys = []
        try:
            generation = int(to_text(raw.get(b"generation")))
            rotated_at = float(to_text(raw.get(b"rotated_at")))
            for index in range(RING_SIZE):
                token = raw.get(f"k{index}".encode())
                if token is None:
                    raise ValueError(f"k{index} is missing")
                keys.append(parse_key(keycrypt.decrypt(keyring, token, _AAD).decode("ascii")))
            return TicketRing(generation, tuple(keys), rotated_at)
        except KeyDecryptError as exc:
            raise KeyDecryptError(f"{where}: {exc}") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreCorrupt(f"{where} is malformed: {exc}") from exc

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
