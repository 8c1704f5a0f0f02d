"""The store's format and the fleet's board, in Redis: which format writers write, who runs.

Two small hashes on the ``{global}`` slot (:mod:`certagent.store.formats` says what a
format is and the rules):

* ``{prefix}format``: the active format (``format``) and the ``version``, ``node`` and
  time (``at``) of whoever set it.  Absent: format 1, a store of a release that did
  not keep the number.  :data:`INIT` marks a store that has no record yet (and no
  node that does not announce a version) at the newest format, once;
  :data:`FINALIZE` moves it up, never down.  Every writer reads it (one Redis: in
  its transaction or script, so a write racing ``fleet finalize`` is encoded again).
* ``{prefix}fleet:nodes``: node -> ``"<lapse ms> <seen ms> <JSON>"``, each agent's
  :class:`~certagent.store.formats.NodeInfo`, beat every
  :data:`~certagent.service.fleet.BEAT` seconds by Redis's clock (:data:`BEAT`), kept
  :data:`KEEP_MS` after its last beat so that ``fleet status`` shows a node that
  stopped (and ``fleet finalize`` counts it) for a while.

Nodes of 0.2.0 announce only their data keys (``{prefix}datakeys``, same slot):
:meth:`RedisFleetBoard.nodes` lists a live one of those without an entry here as a
node that does not say its version.  Every call is one round trip and O(nodes); a
user who may not run scripts gets the same through plain commands (logged once).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import redis.asyncio
import redis.exceptions

from certagent.certs.keycrypt import KeyRing
from certagent.store.formats import (
    LEGACY,
    NEWEST,
    FormatState,
    Migration,
    NodeInfo,
    NodeSeen,
    StoreFormatError,
    check_known,
)
from certagent.store.issuing import check_node, check_ttl
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_text
from certagent.store.redis._migrate import migrate

__all__ = [
    "BEAT",
    "FINALIZE",
    "INIT",
    "KEEP_MS",
    "NODES",
    "RedisFleetBoard",
    "active_layout",
    "parse_format",
    "parse_nodes",
]

log = logging.getLogger(__name__)

#: How long a node stays on the board after its last beat (ms): ``fleet status`` shows it as
#: stopped, and ``fleet finalize`` waits for it (or ``--force``).
KEEP_MS = 10 * 60 * 1000

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: KEYS[1] ``format``, 2 ``ids``, 3 ``datakeys``, 4 ``fleet:nodes``; ARGV[1] the newest
#: format, 2 version, 3 node, 4 time.  Marks a store at the newest format if it has no
#: format yet, no record, and no live node that does not announce its version.  Reply:
#: the hash's format, version, node, at (nils: no format, a store of an earlier release).
INIT = (
    _NOW
    + """
if redis.call('HEXISTS', KEYS[1], 'format') == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
  local held = redis.call('HGETALL', KEYS[3])
  local quiet = true
  for i = 1, #held, 2 do
    local lapse = tonumber(string.match(held[i + 1], '^(%d+)'))
    if lapse ~= nil and lapse > now and redis.call('HEXISTS', KEYS[4], held[i]) == 0 then
      quiet = false
    end
  end
  if quiet then
    redis.call('HSET', KEYS[1], 'format', ARGV[1], 'version', ARGV[2], 'node', ARGV[3],
      'at', ARGV[4])
  end
end
return redis.call('HMGET', KEYS[1], 'format', 'version', 'node', 'at')
"""
)

#: KEYS[1] ``format``; ARGV[1] the target format, 2 version, 3 node, 4 time.  Moves the
#: store up to the target (never down).  Reply: the hash's format, version, node, at.
FINALIZE = """
local now = tonumber(redis.call('HGET', KEYS[1], 'format') or '1')
if now == nil or now < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'format', ARGV[1], 'version', ARGV[2], 'node', ARGV[3],
    'at', ARGV[4])
end
return redis.call('HMGET', KEYS[1], 'format', 'version', 'node', 'at')
"""

#: KEYS[1] ``fleet:nodes``, 2 ``format``; ARGV[1] the node, 2 its TTL (ms), 3 its JSON,
#: 4 :data:`KEEP_MS`, 5 '1' for a beat, '0' for leaving (its lapse = now).  Drops the
#: nodes not seen for KEEP_MS.  Reply: {now ms, format, version, node, at}.
BEAT = (
    _NOW
    + """
local all = redis.call('HGETALL', KEYS[1])
local keep = tonumber(ARGV[4])
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '^%d+ (%d+) '))
  if seen == nil or seen + keep <= now then redis.call('HDEL', KEYS[1], all[i]) end
end
local lapse = now
if ARGV[5] == '1' then lapse = now + tonumber(ARGV[2]) end
redis.call('HSET', KEYS[1], ARGV[1],
  string.format('%.0f %.0f ', lapse, now) .. ARGV[3])
if redis.call('PTTL', KEYS[1]) < keep + tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], keep + tonumber(ARGV[2]))
end
local f = redis.call('HMGET', KEYS[2], 'format', 'version', 'node', 'at')
return {string.format('%.0f', now), f[1], f[2], f[3], f[4]}
"""
)

#: KEYS[1] ``fleet:nodes``, 2 ``datakeys``.  Reply: {now ms, {node, value, ...}, {node,
#: value, ...}} (the board, then the data-key announcements).
NODES = (
    _NOW
    + """
return {string.format('%.0f', now), redis.call('HGETALL', KEYS[1]),
  redis.call('HGETALL', KEYS[2])}
"""
)


def parse_format(reply: Sequence[object]) -> FormatState:
    """An ``HMGET format version node at`` reply: the store's :class:`FormatState`.

    A store without the hash is at :data:`~certagent.store.formats.LEGACY`, unmarked.
    StoreFormatError if the number is not a number (a hostile or broken store).
    """
    number, version, node, at = (to_text(v) if v is not None else None for v in reply[:4])
    if number is None:
        return FormatState(LEGACY, marked=False)
    if not number.isdigit() or not 0 < int(number) < 1_000_000:
        raise StoreFormatError(f"the store's format is {number[:20]!r}, not a format number")
    return FormatState(int(number), True, (version or "")[:64], (node or "")[:128], (at or "")[:32])


def active_layout(raw: object, where: str, version: str) -> int:
    """The format a write encodes in, from ``HGET format format`` read in its transaction
    (absent: 1); StoreFormatError if this release does not know it."""
    state = parse_format([raw, None, None, None])
    check_known(state, where, version)
    return state.number


def parse_nodes(reply: object) -> tuple[NodeSeen, ...]:
    """:data:`NODES`' reply: every node on the board (malformed entries left out), then
    every live data-key holder without an entry (a node that does not say its version)."""
    if not isinstance(reply, list) or len(reply) != 3:
        return ()
    try:
        now = int(to_text(reply[0]))
    except ValueError:
        return ()
    board, holders = reply[1], reply[2]
    seen: dict[str, NodeSeen] = {}
    for node, value in _pairs(board):
        lapse_ms, seen_ms, raw = [*to_text(value).split(" ", 2), "", "", ""][:3]
        if not lapse_ms.isdigit() or not seen_ms.isdigit():
            continue
        try:
            info = NodeInfo.from_json(raw)
        except ValueError:
            continue
        seen[node] = NodeSeen(node, info, int(seen_ms) / 1000, int(lapse_ms) > now)
    for node, value in _pairs(holders):
        lapse = to_text(value).split(" ", 1)[0]
        if node in seen or not lapse.isdigit() or int(lapse) <= now:
            continue
        # announced every 20 s with a 60 s lapse: seen about when it was announced
        seen[node] = NodeSeen(node, None, (int(lapse) - 60_000) / 1000, True)
    return tuple(sorted(seen.values(), key=lambda n: n.node))


def _pairs(flat: object) -> list[tuple[str, object]]:
    if not isinstance(flat, list):
        return []
    return [(to_text(k), v) for k, v in zip(flat[::2], flat[1::2], strict=False)]


def _iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RedisFleetBoard:
    """:class:`~certagent.store.base.FleetBoard` on Redis (see the module docstring)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        version: str,
        ring_for: Callable[[str], KeyRing],
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self.version = version
        self._ring_for = ring_for
        self._init = client.register_script(INIT)
        self._finalize = client.register_script(FINALIZE)
        self._beat = client.register_script(BEAT)
        self._nodes = client.register_script(NODES)
        self._scripts = True  # until the server says NOPERM

    def describe(self) -> str:
        return self._url

    @property
    def newest(self) -> int:
        return NEWEST

    async def state(self, *, node: str = "") -> FormatState:
        """The store's active format; a store with no record yet is marked at the newest
        first (:data:`INIT`).  One round trip."""
        keys = self._keys
        with self._errors("read the store's format"):
            if self._scripts:
                try:
                    reply = await self._init(
                        keys=[
                            keys.store_format(),
                            keys.ids(),
                            keys.data_key_holders(),
                            keys.fleet_nodes(),
                        ],
                        args=[NEWEST, self.version, node, _iso_now()],
                    )
                    return parse_format(reply)
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            fields = ["format", "version", "node", "at"]
            state = parse_format(await self._client.hmget(keys.store_format(), fields))
            if not state.marked and not await self._client.exists(keys.ids()):
                nodes = await self.nodes()
                if not any(n.info is None and n.live for n in nodes):
                    await self._client.hsetnx(keys.store_format(), "format", str(NEWEST))
                    state = parse_format(await self._client.hmget(keys.store_format(), fields))
            return state

    async def finalize(self, target: int, node: str) -> FormatState:
        """Move the store up to ``target`` (never down); the state afterwards."""
        with self._errors("finalize the store's format"):
            at = _iso_now()
            args: list[str | int] = [target, self.version, node, at]
            if self._scripts:
                try:
                    reply = await self._finalize(keys=[self._keys.store_format()], args=args)
                    return parse_format(reply)
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            key = self._keys.store_format()
            current = parse_format(await self._client.hmget(key, ["format", "version"]))
            if current.number < target or not current.marked:
                await self._client.hset(
                    key, mapping={"format": target, "version": self.version, "node": node, "at": at}
                )
            return parse_format(await self._client.hmget(key, ["format", "version", "node", "at"]))

    async def migrate(self, progress: Callable[[Migration], None] | None = None) -> Migration:
        """Rewrite every format-1 record in format 2 (:mod:`._migrate`), if the store is
        at format 2; the key file decrypts and seals the keys again."""
        state = await self.state()
        if state.number < 2:
            return Migration()
        ring = self._ring_for("rewrite records in format 2")
        with self._errors("migrate records to format 2"):
            return await migrate(self._client, self._keys, self._url, ring, progress)

    async def beat(self, node: str, info: NodeInfo, ttl: float) -> FormatState:
        """``node`` runs ``info`` for ``ttl`` s more (Redis's clock); the store's format."""
        return await self._write(node, info, ttl, leaving=False)

    async def leave(self, node: str, info: NodeInfo) -> None:
        """``node`` stops: listed as stopped from now (until :data:`KEEP_MS` has passed)."""
        await self._write(node, info, 1.0, leaving=True)

    async def _write(self, node: str, info: NodeInfo, ttl: float, *, leaving: bool) -> FormatState:
        node, ttl = check_node(node), check_ttl(ttl)
        ttl_ms = max(1, math.ceil(ttl * 1000))
        keys = [self._keys.fleet_nodes(), self._keys.store_format()]
        with self._errors("leave the fleet's board" if leaving else "beat on the fleet's board"):
            if self._scripts:
                try:
                    reply = await self._beat(
                        keys=keys,
                        args=[node, ttl_ms, info.to_json(), KEEP_MS, "0" if leaving else "1"],
                    )
                    return parse_format(list(reply[1:5]))
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            seconds, micros = await self._client.time()
            now = int(seconds) * 1000 + int(micros) // 1000
            lapse = now if leaving else now + ttl_ms
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hset(keys[0], node, f"{lapse} {now} {info.to_json()}")
                pipe.pexpire(keys[0], KEEP_MS + ttl_ms)
                pipe.hmget(keys[1], ["format", "version", "node", "at"])
                *_, reply = await pipe.execute()
            return parse_format(reply)

    async def nodes(self) -> tuple[NodeSeen, ...]:
        """Every node on the board and every node announcing data keys only: O(nodes)."""
        keys = [self._keys.fleet_nodes(), self._keys.data_key_holders()]
        with self._errors("read the fleet's board"):
            if self._scripts:
                try:
                    return parse_nodes(await self._nodes(keys=keys))
                except redis.exceptions.NoPermissionError as exc:
                    self._no_scripts(exc)
            seconds, micros = await self._client.time()
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys[0])
                pipe.hgetall(keys[1])
                board, holders = await pipe.execute()
        now = str(int(seconds) * 1000 + int(micros) // 1000).encode()
        flat = [[x for pair in d.items() for x in pair] for d in (board, holders)]
        return parse_nodes([now, *flat])

    def _no_scripts(self, exc: Exception) -> None:
        log.warning(
            "%s: scripts are not allowed for this user (%s); the fleet's board and the store's"
            " format now take several round trips, and marking a new store is not atomic:"
            " grant +evalsha +script|load",
            self._url,
            exc,
        )
        self._scripts = False

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
