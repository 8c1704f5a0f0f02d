"""Issuance leases in Redis: one order per name across the fleet, and the fenced write.

A lease is one string, ``{prefix}acme:lease:<name>`` = ``"<token> <node>"``, set by
:data:`ACQUIRE` (``SET ... PX`` only if absent, the token drawn in the same
script) and renewed or released by scripts that act only if it still holds the
caller's value.  The token comes from ``INCR {prefix}acme:fence``, raised to at
least Redis's clock in milliseconds: it grows with every lease, and keeps
growing if the counter is lost (a failover to a replica that had not received
it, a flush), so a token is never handed out twice.

Time: a lease's TTL is Redis's (``PX``, relative), so it lapses in Redis whatever
happens to its holder.  :attr:`Lease.expires_at
<certagent.store.issuance.Lease.expires_at>` is this node's clock read *before*
the request, plus the TTL: the holder's view of its lease ends no later than
Redis's does, and no two machines' clocks are ever compared.

:meth:`RedisLeases.add_issued` first makes the lease last at least
:data:`~certagent.store.issuing.HOLD_SECONDS` more (:data:`HOLD`, only if it is
still ours), then adds the record through the store's writer with a
:class:`~certagent.store.redis._writer.Fence` that the writer checks atomically
with the add's commit point: WATCH on one Redis, a script on a cluster's
``{global}`` slot, where the lease lives too.  Every call is one round trip,
O(1), except ``add_issued`` (an add's round trips, plus one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager

import redis.asyncio

from certagent.certs.pem import CertBundle
from certagent.store.issuance import ACME_MANAGED, Lease
from certagent.store.issuing import (
    HOLD_SECONDS,
    check_name,
    check_node,
    check_ttl,
    lease_lost,
    lease_value,
)
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_bytes
from certagent.store.redis._renewals import scheduled
from certagent.store.redis._writer import Fence
from certagent.store.renewing import check_entry
from certagent.store.values import CertRecord

__all__ = ["ACQUIRE", "HOLD", "RELEASE", "RENEW", "FencedAdd", "RedisLeases"]

#: The store's add, fenced: ``await add(bundle, fence, managed)``.
FencedAdd = Callable[[CertBundle, Fence, str], Awaitable[CertRecord]]

#: KEYS[1] the lease, 2 the fence counter; ARGV[1] the node, 2 the TTL in ms.  The token,
#: or 0 if the name is leased.
ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local token = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if token < floor then
  token = floor
  redis.call('SET', KEYS[2], string.format('%.0f', token))
end
redis.call('SET', KEYS[1], string.format('%.0f', token) .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
"""
#: KEYS[1] the lease; ARGV[1] its value, 2 the new TTL in ms.  1 renewed, 0 not ours.
RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
#: KEYS[1] the lease; ARGV[1] its value.  Deletes it if it is still ours.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
#: KEYS[1] the lease; ARGV[1] its value, 2 a TTL in ms.  ``{1}`` if ours (its TTL raised to
#: at least ARGV[2]); ``{0, holder}`` if not (holder absent when nobody holds it).
HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder ~= ARGV[1] then return {0, holder} end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {1}
"""


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisLeases:
    """:class:`~certagent.store.issuance.IssueLocks` on Redis (one server, Sentinel or Cluster)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        add: FencedAdd,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = keys
        self._url = shown
        self._add = add
        self._clock = clock
        self._acquire = client.register_script(ACQUIRE)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._hold = client.register_script(HOLD)

    async def acquire(self, name: str, node: str, ttl: float) -> Lease | None:
        name, node, ttl = check_name(name), check_node(node), check_ttl(ttl)
        started = self._clock()
        with self._errors(f"lease {name}"):
            token = await self._acquire(
                keys=[self._keys.lease(name), self._keys.fence()], args=[node, _ms(ttl)]
            )
        if not isinstance(token, int) or token <= 0:
            return None
        return Lease(name, node, token, started + ttl)

    async def renew(self, lease: Lease, ttl: float) -> Lease | None:
        name, ttl = check_name(lease.name), check_ttl(ttl)
        started = self._clock()
        with self._errors(f"renew the lease on {name}"):
            renewed = await self._renew(
                keys=[self._keys.lease(name)], args=[lease_value(lease), _ms(ttl)]
            )
        if renewed != 1:
            return None
        return Lease(name, lease.node, lease.token, started + ttl)

    async def release(self, lease: Lease) -> None:
        name = check_name(lease.name)
        with self._errors(f"release the lease on {name}"):
            await self._release(keys=[self._keys.lease(name)], args=[lease_value(lease)])

    async def add_issued(
        self,
        bundle: CertBundle,
        lease: Lease,
        *,
        managed: str = ACME_MANAGED,
        renew_at: float | None = None,
    ) -> CertRecord:
        """The store's add, its commit fenced by ``lease`` (see the module's docstring).

        With ``renew_at``, the commit also schedules ``lease.name``
        (:mod:`._renewals`): in the same MULTI/EXEC on one Redis, in the same
        commit script on a cluster.
        """
        name = check_name(lease.name)
        renew = None
        if renew_at is not None:
            renew = scheduled(check_entry(name, renew_at, bundle.not_after.timestamp()))
        key, value = self._keys.lease(name), lease_value(lease)
        with self._errors(f"check the lease on {name}"):
            held = await self._hold(keys=[key], args=[value, _ms(HOLD_SECONDS)])
        if not isinstance(held, list) or not held or held[0] != 1:
            holder = held[1] if isinstance(held, list) and len(held) > 1 else None
            raise lease_lost(lease, to_bytes(holder))
        return await self._add(bundle, Fence(key, value, lease, renew), managed)

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
