"""The renewal schedule and the fleet's issuance budget in Redis (issue 20).

**Schedule**: one sorted set, ``{prefix}acme:renew``, scored by ``renew_at``,
whose member is ``"<name> <not_after>"``: :meth:`RedisRenewals.due` is one
``ZRANGEBYSCORE -inf <now> WITHSCORES LIMIT 0 <limit>`` (O(log M + due)) that
needs nothing else.  Because the member carries ``not_after``, moving or
dropping a name's entry needs its current member: the hash
``{prefix}acme:renew-entries`` maps name -> member, and :data:`SCHEDULE` and
:data:`UNSCHEDULE` change both in one script.  :meth:`~RedisRenewals.count` is
ZCARD + ZCOUNT in one round trip (O(log M)).

Who writes it: :meth:`RedisRenewals.schedule` and :meth:`~RedisRenewals.manage`;
``add_issued(..., renew_at=...)`` inside its fenced write (the single-node
writer's MULTI/EXEC, or :data:`~certagent.store.redis._cluster.FENCED_COMMIT` on a
cluster: a lost lease schedules nothing); the store's delete drops the entries of
the names no record holds any more (:data:`UNSCHEDULE` with the name sets as
KEYS inside the delete's MULTI on one Redis; on a cluster, where the name sets
live in other slots, after the name sets are emptied, only for entries whose
``not_after`` is not later than the deleted certificate's, so an entry a
concurrent renewal wrote for its new certificate stays).

**Budget**: a counter per fixed window, ``{prefix}acme:budget:<key>:<s>:<i>``
(window ``i`` of ``s`` seconds), ``PX`` until its window ends plus a second;
:data:`SPEND` checks every window and increments all or none.

Every key is on the ``{global}`` slot of a cluster, with the other issuance keys.
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager
from dataclasses import dataclass

import redis.asyncio

from certagent.errors import InvalidHostname, NotFound, StoreCorrupt
from certagent.store.issuance import ACME_MANAGED
from certagent.store.issuing import check_name, check_time
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import F_NOT_AFTER, F_SHA256, Keys, to_text
from certagent.store.redis._records import decode_record_time
from certagent.store.redis._rows import SWAP, read_one
from certagent.store.renewals import BudgetWindow, DueRenewal
from certagent.store.renewing import (
    check_due_limit,
    check_entry,
    check_windows,
    format_time,
    window_index,
    window_wait,
)

__all__ = [
    "ENTRY",
    "MARK",
    "SCHEDULE",
    "SPEND",
    "UNSCHEDULE",
    "RedisRenewals",
    "Scheduled",
    "decode_member",
    "scheduled",
]

log = logging.getLogger(__name__)

#: KEYS[1] the schedule, 2 its entries, [3] the name's record set (when given, nothing is
#: written unless it exists).  ARGV[1] the name, 2 renew_at, 3 the member.  1 set, 0 not.
SCHEDULE = """
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old and old ~= ARGV[3] then redis.call('ZREM', KEYS[1], old) end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""
#: KEYS[1] the schedule, 2 its entries, 3.. (optional) the record sets of the names, in
#: their order: a name whose set exists is kept.  ARGV[1] the latest not_after an entry may
#: have to be dropped ('' any), 2.. the names.  How many entries were dropped.
UNSCHEDULE = """
local dropped = 0
for i = 2, #ARGV do
  local held = KEYS[i + 1] and redis.call('EXISTS', KEYS[i + 1]) == 1
  local member = (not held) and redis.call('HGET', KEYS[2], ARGV[i])
  if member then
    local after = tonumber(string.match(member, ' (%S+)$'))
    if ARGV[1] == '' or (after and after <= tonumber(ARGV[1])) then
      redis.call('ZREM', KEYS[1], member)
      redis.call('HDEL', KEYS[2], ARGV[i])
      dropped = dropped + 1
    end
  end
end
return dropped
"""
#: KEYS[1] the schedule, 2 its entries; ARGV[1] a name.  ``{member, score}`` or ``{}``.
ENTRY = """
local member = redis.call('HGET', KEYS[2], ARGV[1])
if not member then return {} end
local score = redis.call('ZSCORE', KEYS[1], member)
if not score then return {} end
return {member, score}
"""
#: KEYS the windows' counters; ARGV[1..n] their limits, ARGV[n+1..2n] their TTLs in ms.
#: 0 when one unit was taken from every window, else the (1-based) indexes of the full ones.
SPEND = """
local n = #KEYS
local full = {}
for i = 1, n do
  if tonumber(redis.call('GET', KEYS[i]) or '0') >= tonumber(ARGV[i]) then
    full[#full + 1] = i
  end
end
if #full > 0 then return full end
for i = 1, n do
  redis.call('INCR', KEYS[i])
  redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
end
return 0
"""
#: KEYS[1] a record; ARGV[1] its leaf's SHA-256 as read, 2 ``managed``.  1 marked, 0 the
#: record changed or went meanwhile.
MARK = """
if redis.call('HGET', KEYS[1], 'fingerprint_sha256') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'managed', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class Scheduled:
    """A schedule entry as :data:`SCHEDULE` takes it (``add_issued``'s fenced write)."""

    name: str
    score: str
    member: str


def scheduled(entry: DueRenewal) -> Scheduled:
    """``entry`` (checked) as the ARGV of :data:`SCHEDULE`."""
    return Scheduled(
        entry.name, format_time(entry.renew_at), f"{entry.name} {format_time(entry.not_after)}"
    )


def decode_member(member: object, score: object) -> DueRenewal:
    """An entry of the schedule; ValueError if the member is not ``"<name> <not_after>"``."""
    name, _, after = to_text(member).rpartition(" ")
    try:
        valid = check_name(name)
    except InvalidHostname as exc:
        raise ValueError(str(exc)) from exc
    at = float(score) if isinstance(score, (int, float)) else float(to_text(score))
    return DueRenewal(valid, at, float(after))


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisRenewals:
    """:class:`~certagent.store.renewals.Renewals` on Redis: each call one round trip,
    except :meth:`schedule` on a cluster (two) and :meth:`manage` (three or four)."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: Keys, shown: str, *, cluster: bool
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._cluster = cluster
        self._schedule = client.register_script(SCHEDULE)
        self._unschedule = client.register_script(UNSCHEDULE)
        self._entry = client.register_script(ENTRY)
        self._spend = client.register_script(SPEND)
        self._mark = client.register_script(MARK)

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)

    def _schedule_keys(self) -> list[str]:
        return [self._keys.renewals(), self._keys.renewal_entries()]

    async def schedule(self, name: str, renew_at: float, not_after: float) -> None:
        """:data:`SCHEDULE`; a no-op unless ``name:<name>`` exists (see Renewals.schedule)."""
        entry = scheduled(check_entry(name, renew_at, not_after))
        keys = self._schedule_keys()
        with self._errors(f"schedule the renewal of {entry.name}"):
            if self._cluster:  # the name set is in another slot: check it first
                if not await self._client.exists(self._keys.name(entry.name)):
                    return
            else:
                keys.append(self._keys.name(entry.name))
            await self._schedule(keys=keys, args=[entry.name, entry.score, entry.member])

    async def unschedule(self, name: str) -> None:
        name = check_name(name)
        with self._errors(f"unschedule the renewal of {name}"):
            await self._unschedule(keys=self._schedule_keys(), args=["", name])

    async def manage(self, name: str, renew_at: float) -> None:
        """Mark the records of ``name:<name>`` managed (:data:`MARK`, each if its leaf is the
        one read), then schedule: SMEMBERS, HMGET each, MARK each, SCHEDULE."""
        name = check_name(name)
        renew_at = check_time(renew_at, "renew_at")
        with self._errors(f"manage the renewal of {name}"):
            ids = sorted(to_text(i) for i in await self._client.smembers(self._keys.name(name)))
            marked: list[float] = []
            for cert_id in ids:
                cert_key = self._keys.cert(cert_id)
                try:
                    row = await read_one(self._client, cert_key)
                    if row is None:
                        continue  # deleted meanwhile
                    sha, after = row.meta[F_SHA256], row.meta[F_NOT_AFTER]
                    assert sha is not None and after is not None
                    not_after = decode_record_time(after)
                except ValueError as exc:
                    raise StoreCorrupt(f"{self._url}: record {cert_id!r}: {exc}") from exc
                if row.packed is not None:
                    marked_row = row.packed.with_fields(m=ACME_MANAGED.encode())
                    done = await self._client.eval(SWAP, 1, cert_key, row.state, marked_row)
                else:
                    done = await self._mark(keys=[cert_key], args=[sha, ACME_MANAGED])
                if done == 1:
                    marked.append(not_after)
            if not marked:
                raise NotFound(
                    f"{self._url}: no certificate is stored for {name}; add it before"
                    " asking for its renewal"
                )
            entry = scheduled(DueRenewal(name, renew_at, max(marked)))
            await self._schedule(
                keys=self._schedule_keys(), args=[entry.name, entry.score, entry.member]
            )
        log.info("%s is now renewed by the agent (first at %.0f) in %s", name, renew_at, self._url)

    async def entry(self, name: str) -> DueRenewal | None:
        name = check_name(name)
        with self._errors(f"read the renewal entry of {name}"):
            reply = await self._entry(keys=self._schedule_keys(), args=[name])
        if not isinstance(reply, list) or len(reply) != 2:
            return None
        return self._decode(reply[0], reply[1])

    async def due(self, now: float, limit: int) -> list[DueRenewal]:
        """One ZRANGEBYSCORE ... WITHSCORES LIMIT: O(log M + due)."""
        now, limit = check_time(now, "now"), check_due_limit(limit)
        with self._errors("read the renewals due"):
            rows: list[tuple[bytes, float]] = await self._client.zrangebyscore(  # type: ignore[assignment]
                self._keys.renewals(), "-inf", format_time(now), start=0, num=limit, withscores=True
            )
        found: list[DueRenewal] = []
        for member, score in rows:
            try:
                found.append(self._decode(member, score))
            except StoreCorrupt as exc:
                log.warning("reading the renewals due: %s", exc)
        return found

    async def count(self, now: float) -> tuple[int, int]:
        """ZCARD + ZCOUNT, one round trip: O(log M)."""
        now = check_time(now, "now")
        with self._errors("count the renewals"):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zcard(self._keys.renewals())
                pipe.zcount(self._keys.renewals(), "-inf", format_time(now))
                total, due = await pipe.execute()
        return int(total), int(due)

    async def spend(self, windows: tuple[BudgetWindow, ...], now: float) -> float:
        """:data:`SPEND`, one script over the windows' counters: O(windows)."""
        windows, now = check_windows(windows), check_time(now, "now")
        if not windows:
            return 0.0
        keys = [
            self._keys.budget(w.key, format_time(w.seconds), window_index(w, now)) for w in windows
        ]
        waits = [window_wait(w, now) for w in windows]
        args = [w.limit for w in windows] + [_ms(wait + 1.0) for wait in waits]
        with self._errors("spend the issuance budget"):
            full = await self._spend(keys=keys, args=args)
        if not isinstance(full, list) or not full:
            return 0.0
        return max(waits[int(i) - 1] for i in full)

    def _decode(self, member: object, score: object) -> DueRenewal:
        try:
            return decode_member(member, score)
        except ValueError as exc:
            raise StoreCorrupt(
                f"{self._url}: renewal entry {to_text(member)[:80]!r} is not '<name> <not_after>'"
            ) from exc
