"""Which data keys the fleet's agents hold, in Redis: one small hash, a beat per agent.

``{prefix}datakeys`` (on the ``{global}`` slot of a cluster) maps each agent's
node name to ``"<lapse ms> <kid> <kid> ..."``: the key ids of its key file and
when its announcement lapses, in milliseconds of **Redis's clock** (``TIME`` in
the scripts, as the challenge board's heartbeats): agents whose clocks disagree
still agree on who is alive.  An agent announces at start and then every
:data:`~certagent.service.datakey.BEAT` seconds, and withdraws when it stops;
an announcement drops the lapsed ones.  Every call is one round trip, O(nodes);
for a user who may not run scripts (``NOPERM``, logged once) ``TIME`` and the
hash's commands go separately (two or three round trips).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager

import redis.asyncio
import redis.exceptions

from certagent.store.issuing import check_node, check_ttl
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_text

__all__ = ["ANNOUNCE", "HOLDERS", "RedisFleetKeys", "parse_holders"]

log = logging.getLogger(__name__)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
#: KEYS[1] the hash; ARGV[1] the node, 2 its TTL in ms, 3 its key ids (space-separated).
ANNOUNCE = (
    _NOW
    + """
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local lapse = tonumber(string.match(all[i + 1], '^(%d+)'))
  if lapse == nil or lapse <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
local lapse = string.format('%.0f', now + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], lapse .. ' ' .. ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""
)
#: KEYS[1] the hash.  Reply: {now ms, node, value, node, value, ...} (lapsed ones included).
HOLDERS = (
    _NOW
    + """
local out = {string.format('%.0f', now)}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
"""
)


def parse_holders(reply: object) -> dict[str, frozenset[str]]:
    """:data:`HOLDERS`' reply -> node -> key ids, the lapsed and malformed left out."""
    if not isinstance(reply, list) or not reply:
        return {}
    try:
        now = int(to_text(reply[0]))
    except ValueError:
        return {}
    out: dict[str, frozenset[str]] = {}
    for node, value in zip(reply[1::2], reply[2::2], strict=False):
        kids = _live(value, now)
        if kids:
            out[to_text(node)] = kids
    return out


def _live(value: object, now: int) -> frozenset[str]:
    """The key ids of one announcement; empty if it lapsed by ``now`` (ms) or is malformed."""
    lapse, *kids = to_text(value).split() or [""]
    return frozenset(kids) if lapse.isdigit() and int(lapse) > now else frozenset()


class RedisFleetKeys:
    """The data-key announcements of :class:`~certagent.store.base.DataKeys`."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str) -> None:
        self._client = client
        self._key = keys.data_key_holders()
        self._url = shown
        self._announce = client.register_script(ANNOUNCE)
        self._holders = client.register_script(HOLDERS)
        self._scripts = True  # until the server says NOPERM

    async def announce(self, node: str, key_ids: Sequence[str], ttl: float) -> None:
        node, ttl = check_node(node), check_ttl(ttl)
        if not key_ids or any(not k or " " in k for k in key_ids):
            raise ValueError(f"not a list of key ids: {list(key_ids)!r}")
        ttl_ms, kids = max(1, math.ceil(ttl * 1000)), " ".join(key_ids)
        with self._errors("announce the data keys this agent holds"):
            if self._scripts:
                try:
                    await self._announce(keys=[self._key], args=[node, ttl_ms, kids])
                    return
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            now = await self._now_ms()
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hgetall(self._key)
                pipe.pttl(self._key)
                held, pttl = await pipe.execute()
            lapsed = [field for field, value in held.items() if not _live(value, now)]
            async with self._client.pipeline(transaction=False) as pipe:
                if lapsed:
                    pipe.hdel(self._key, *lapsed)
                pipe.hset(self._key, node, f"{now + ttl_ms} {kids}")
                if not isinstance(pttl, int) or pttl < ttl_ms:
                    pipe.pexpire(self._key, ttl_ms)
                await pipe.execute()

    async def withdraw(self, node: str) -> None:
        with self._errors("withdraw this agent's data keys"):
            await self._client.hdel(self._key, check_node(node))

    async def holders(self) -> dict[str, frozenset[str]]:
        with self._errors("read the data keys the fleet holds"):
            if self._scripts:
                try:
                    return parse_holders(await self._holders(keys=[self._key]))
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            now = await self._now_ms()
            held = await self._client.hgetall(self._key)
        return parse_holders([str(now).encode(), *(x for pair in held.items() for x in pair)])

    async def _now_ms(self) -> int:
        seconds, micros = await self._client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _no_scripts(self, exc: Exception) -> None:
        log.warning(
            "%s: scripts are not allowed for this user (%s); data-key announcements now take"
            " two or three round trips: grant +evalsha +script|load for one",
            self._url,
            exc,
        )
        self._scripts = False

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
