"""The challenge board in Redis: answers every node serves, who serves them, who is alive.

* Challenges: one hash, ``{prefix}acme:challenges``, token -> the challenge as JSON
  (:func:`~certagent.store.issuing.encode_challenge`).  :data:`PUBLISH` and
  :data:`WITHDRAW` change it and append the ``challenge`` event to the feed in
  the same script.  Each entry carries its ``expires_at``: a reader drops an
  entry past it (lazily, compare-and-delete); the hash's own TTL is raised on
  every publish to the latest entry's expiry plus
  :data:`~certagent.store.issuing.CHALLENGE_GRACE`, so nothing outlives the last
  challenge even if no node reads it again.
* Acknowledgements: a set per token, ``{prefix}acme:acks:<token>``, TTL
  :data:`~certagent.store.issuing.ACK_SECONDS`, deleted with its challenge.
* Heartbeats: a sorted set, ``{prefix}acme:nodes``, node -> when its beat lapses,
  in milliseconds of **Redis's clock** (``TIME`` in the scripts): nodes whose
  clocks disagree still agree on who is alive.  Reading it drops the lapsed.

A challenge's ``expires_at`` is the publisher's (Unix seconds, as the interface
says); it is compared with the reader's clock, and turned into the hash's TTL
relative to the publisher's clock.  Every call is one round trip; ``current``
and ``live_nodes`` are O(challenges) and O(nodes), the rest O(1).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

import redis.asyncio

from certagent.store.issuance import PublishedChallenge
from certagent.store.issuing import (
    ACK_SECONDS,
    CHALLENGE_GRACE,
    check_challenge,
    check_node,
    check_token,
    check_ttl,
    decode_challenge,
    encode_challenge,
)
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_bytes, to_text

__all__ = ["BEAT", "DROP_IF", "LIVE", "PUBLISH", "WITHDRAW", "RedisBoard"]

log = logging.getLogger(__name__)

#: KEYS[1] the challenges, 2 the events; ARGV[1] the token, 2 the challenge (JSON), 3 the
#: hash's TTL in ms, 4 the stream's MAXLEN, 5 the name.
PUBLISH = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*',
  'kind', 'challenge', 'id', ARGV[1], 'names', ARGV[5])
return 1
"""
#: KEYS[1] the challenges, 2 the events, 3 the token's acks; ARGV[1] the token, 2 MAXLEN.
#: 1 withdrawn (and the event appended), 0 there was no such challenge.
WITHDRAW = """
redis.call('DEL', KEYS[3])
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
local ok, challenge = pcall(cjson.decode, raw)
local name = ''
if ok and type(challenge) == 'table' and type(challenge['name']) == 'string' then
  name = challenge['name']
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*',
  'kind', 'challenge', 'id', ARGV[1], 'names', name)
return 1
"""
#: KEYS[1] a hash; ARGV[1] a field, 2 the value read.  Deletes the field if it still holds it.
DROP_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
#: KEYS[1] the nodes; ARGV[1] a node, 2 its TTL in ms.
BEAT = (
    _NOW
    + """
redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""
)
#: KEYS[1] the nodes.  The nodes whose beat has not lapsed (the lapsed are removed).
LIVE = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
)


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisBoard:
    """:class:`~certagent.store.issuance.ChallengeBoard` on Redis."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        maxlen: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._maxlen = maxlen
        self._clock = clock
        self._publish = client.register_script(PUBLISH)
        self._withdraw = client.register_script(WITHDRAW)
        self._drop_if = client.register_script(DROP_IF)
        self._beat = client.register_script(BEAT)
        self._live = client.register_script(LIVE)

    # --- challenges -------------------------------------------------------------------

    async def publish(self, challenge: PublishedChallenge) -> None:
        """Store ``challenge`` and append its event; ValueError if it expired already."""
        challenge = check_challenge(challenge)
        left = challenge.expires_at - self._clock()
        if left <= 0:
            raise ValueError(f"challenge {challenge.token} expired already")
        with self._errors(f"publish challenge {challenge.token}"):
            await self._publish(
                keys=[self._keys.challenges(), self._keys.events()],
                args=[
                    challenge.token,
                    encode_challenge(challenge),
                    _ms(left + CHALLENGE_GRACE),
                    self._maxlen,
                    challenge.name,
                ],
            )

    async def withdraw(self, token: str) -> None:
        token = check_token(token)
        with self._errors(f"withdraw challenge {token}"):
            await self._withdraw(
                keys=[self._keys.challenges(), self._keys.events(), self._keys.acks(token)],
                args=[token, self._maxlen],
            )

    async def get(self, token: str) -> PublishedChallenge | None:
        token = check_token(token)
        with self._errors(f"read challenge {token}"):
            raw = to_bytes(await self._client.hget(self._keys.challenges(), token))
        if raw is None:
            return None
        found = await self._live_only({token.encode("ascii"): raw})
        return found[0] if found else None

    async def current(self) -> tuple[PublishedChallenge, ...]:
        """Every live challenge by token: O(challenges), bounded by the issuance concurrency."""
        with self._errors("read the challenges"):
            raw: Mapping[bytes, bytes] = await self._client.hgetall(  # type: ignore[assignment]
                self._keys.challenges()
            )
        return await self._live_only(raw)

    async def _live_only(self, raw: Mapping[bytes, bytes]) -> tuple[PublishedChallenge, ...]:
        """The live challenges of ``raw``; the lapsed or malformed ones are dropped from Redis."""
        now = self._clock()
        live: list[PublishedChallenge] = []
        dropped: list[tuple[bytes, bytes]] = []
        for token, value in sorted(raw.items()):
            try:
                challenge = decode_challenge(value)
                if challenge.token != to_text(token):
                    raise ValueError("it is stored under another token")
            except ValueError as exc:
                log.warning("%s: dropping challenge %r: %s", self._url, to_text(token)[:64], exc)
                dropped.append((token, value))
                continue
            if challenge.expires_at <= now:
                dropped.append((token, value))
            else:
                live.append(challenge)
        for token, value in dropped:
            with self._errors("drop a lapsed challenge"):
                await self._drop_if(keys=[self._keys.challenges()], args=[token, value])
        return tuple(live)

    # --- acknowledgements, heartbeats -------------------------------------------------

    async def ack(self, token: str, node: str) -> None:
        token, node = check_token(token), check_node(node)
        key = self._keys.acks(token)
        with self._errors(f"acknowledge challenge {token}"):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.sadd(key, node)
                pipe.pexpire(key, _ms(ACK_SECONDS))
                await pipe.execute()

    async def acks(self, token: str) -> frozenset[str]:
        token = check_token(token)
        with self._errors(f"read the acknowledgements of challenge {token}"):
            members = await self._client.smembers(self._keys.acks(token))
        return frozenset(to_text(m) for m in members)

    async def beat(self, node: str, ttl: float) -> None:
        """``node`` is alive for ``ttl`` s more, by Redis's clock."""
        node, ttl = check_node(node), check_ttl(ttl)
        with self._errors("beat"):
            await self._beat(keys=[self._keys.nodes()], args=[node, _ms(ttl)])

    async def live_nodes(self) -> frozenset[str]:
        """Nodes whose beat has not lapsed (by Redis's clock): O(nodes)."""
        with self._errors("read the live nodes"):
            found = await self._live(keys=[self._keys.nodes()])
        return frozenset(to_text(n) for n in found or ())

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
