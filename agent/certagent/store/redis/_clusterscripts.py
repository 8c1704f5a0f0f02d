"""The Lua scripts of the Redis Cluster writer (:mod:`._cluster`): each touches one slot."""

from __future__ import annotations

__all__ = ["CLAIM", "FENCED_COMMIT", "RELEASE", "SET_IF", "WRITE_NEW"]

#: KEYS[1] a new record's key; ARGV[1] the record (format 2: one string; '' for format 1,
#: a hash, whose fields and values follow in ARGV[2..]).  1 written, 0 id taken.
WRITE_NEW = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[1] == '' then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"""
#: KEYS[1] a ``fp:`` key; ARGV[1] a stale owner that may be replaced ('' none), ARGV[2]
#: the id claiming it.  1 claimed (free, stale or already ours), else the owner's id.
CLAIM = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[2] then return 1 end
if not owner or owner == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return owner
"""
#: KEYS[1] a key; ARGV[1] a value.  Deletes the key if it holds that value.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
#: The commit point of a fenced add (``add_issued``), on ``{global}``.  KEYS[1] the lease,
#: 2 ``ids``, 3 ``expiry``, 4 ``events``, [5 the renewal schedule, 6 its entries]; ARGV[1]
#: the lease's value expected, 2 the id, 3 the expiry score, 4 the stream's MAXLEN, 5 the
#: event's names, [6 the name to schedule, 7 its renew_at, 8 its member].  ``{1}``
#: committed (and scheduled), else ``{0, holder}`` (nothing written; holder absent when no
#: node holds the lease).
FENCED_COMMIT = """
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return {0, holder} end
redis.call('ZADD', KEYS[2], 0, ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*',
  'kind', 'put', 'id', ARGV[2], 'names', ARGV[5])
if KEYS[5] then
  local old = redis.call('HGET', KEYS[6], ARGV[6])
  if old and old ~= ARGV[8] then redis.call('ZREM', KEYS[5], old) end
  redis.call('ZADD', KEYS[5], ARGV[7], ARGV[8])
  redis.call('HSET', KEYS[6], ARGV[6], ARGV[8])
end
return {1}
"""
#: KEYS[1] a record; ARGV[1] field, ARGV[2] value expected, ARGV[3] field, ARGV[4] value.
#: Sets field ARGV[3] (or deletes it when ARGV[4] is '') if ARGV[1] still holds ARGV[2].
SET_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[4] == '' then redis.call('HDEL', KEYS[1], ARGV[3])
else redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) end
return 1
"""
