"""Redis connections for the store, and the one place redis-py's errors become ours.

Three kinds of Redis, all through redis-py's own support:

* ``redis://``, ``rediss://``, ``unix://`` -- one server;
* ``redis+sentinel://[user:pass@]host:port[,host:port...]/<service>[/db]`` -- the
  master of ``service`` as the sentinels name it (:class:`redis.asyncio.sentinel.Sentinel`,
  ``master_for``): after a failover, new connections go to the promoted replica;
* ``redis+cluster://[user:pass@]host:port[,host:port...]`` -- a Redis Cluster
  (:class:`redis.asyncio.cluster.RedisCluster`), the nodes given being where it
  starts to discover the others.

The credentials are the data nodes'.  Sentinels are asked without a password,
unless the URL says ``?sentinel_auth=yes``: then with the same user and password
(Sentinel's ``requirepass``, set like the data nodes' one), or it carries the
sentinels' own: ``?sentinel_password=...`` (and ``sentinel_username=...``), which
:func:`certagent.store.open_configured` adds from ``store_sentinel_password_file``.
The URLs are taken apart by :mod:`certagent.store.url`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from certagent.errors import ConfigError, StoreError, StoreUnavailable
from certagent.store.url import CLUSTER_SCHEME, SENTINEL_SCHEME, parse_ha_url

__all__ = ["MAX_CONNECTIONS", "close_client", "connect", "redis_errors"]

# Connections per pool; more concurrent commands wait (up to the timeout) for one.
MAX_CONNECTIONS = 32
# A Redis Cluster client opens up to this many connections per node (more fail).
_CLUSTER_CONNECTIONS = 256

#: Sentinel's constructor through a typed name: redis-py types ``Sentinel.__init__`` from 8.2
#: on and not before, so a direct call needs an ignore under the oldest supported redis-py
#: (5.3) that is an unused ignore under the newest; this holds across the whole range.
_new_sentinel: Callable[..., Sentinel] = Sentinel


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The master's pool of a Sentinel client, waiting for a free connection like ours."""


def connect(
    url: str, shown: str, read_timeout: float, connect_timeout: float, health_check: float
) -> redis.asyncio.Redis:
    """A client with its own blocking pool; no I/O yet.  ``shown`` is ``url`` redacted.

    A Cluster client is returned typed as :class:`redis.asyncio.Redis`: the store
    uses only the commands both share (each touching keys of one slot).
    """
    # One immediate retry covers a pooled connection the server closed;
    # redis-py's default (10 retries with backoff) would stall the lazy path.
    retry = Retry(NoBackoff(), 1)
    scheme = url.partition("://")[0].lower()
    if scheme in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        ha = parse_ha_url(url, shown)
        if ha.kind == "cluster":
            cluster = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in ha.nodes],
                username=ha.username,
                password=ha.password,
                decode_responses=False,
                socket_timeout=read_timeout,
                socket_connect_timeout=connect_timeout,
                health_check_interval=health_check,
                max_connections=_CLUSTER_CONNECTIONS,
                retry=Retry(NoBackoff(), 2),
            )
            return cast(redis.asyncio.Redis, cluster)
        asked: dict[str, object] = {
            "socket_timeout": connect_timeout,
            "socket_connect_timeout": connect_timeout,
            # redis-py's default retries a sentinel 3 times with 1-10 s backoff (about 7 s
            # for one that is down or refuses the password) before asking the next one
            "retry": Retry(NoBackoff(), 1),
        }
        if ha.sentinel_auth:
            asked.update(username=ha.username, password=ha.password)
        elif ha.sentinel_password is not None or ha.sentinel_username is not None:
            asked.update(username=ha.sentinel_username, password=ha.sentinel_password)
        sentinel = _new_sentinel(list(ha.nodes), sentinel_kwargs=asked)
        client: redis.asyncio.Redis = sentinel.master_for(
            ha.service,
            redis_class=redis.asyncio.Redis,
            connection_pool_class=_BlockingSentinelPool,
            max_connections=MAX_CONNECTIONS,
            timeout=connect_timeout,
            db=ha.db,
            username=ha.username,
            password=ha.password,
            decode_responses=False,
            socket_timeout=read_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check,
            retry=retry,
        )
        return client
    try:
        # A storm of new hosts makes hundreds of lookups at once: they wait for one
        # of MAX_CONNECTIONS connections instead of failing with "Too many connections".
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=connect_timeout,
            decode_responses=False,
            socket_timeout=read_timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=health_check,
            retry=retry,
        )
        return redis.asyncio.Redis.from_pool(pool)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {shown!r}: {exc}") from exc


async def close_client(client: redis.asyncio.Redis) -> None:
    """Close ``client``, its pool and, for a Sentinel client, its connections to the sentinels."""
    await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()


@contextmanager
def redis_errors(shown: str, action: str) -> Iterator[None]:
    """Translate redis-py and socket errors into the agent's tree, once.

    Unavailable (worth retrying later): connection errors and timeouts, no
    master known to the sentinels, a cluster that is down, a slot no node
    serves, a redirection that did not settle (MOVED/ASK/TRYAGAIN during a
    resharding or failover), a write on a connection closed under it (uvloop's
    RuntimeError).  Anything else Redis says is a StoreError.
    """
    try:
        yield
    except MasterNotFoundError as exc:  # a ConnectionError; redis-py's text is unreadable
        raise StoreUnavailable(f"{shown}: {action} failed: {_no_master(exc, shown)}") from exc
    except (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.ClusterDownError,
        redis.exceptions.TryAgainError,
        redis.exceptions.AskError,  # MovedError too
        redis.exceptions.SlotNotCoveredError,
        OSError,
    ) as exc:
        raise StoreUnavailable(f"{shown}: {action} failed: {exc}") from exc
    except RuntimeError as exc:
        # uvloop: a write on a connection the server closed (a failover, a restart) raises
        # RuntimeError("unable to perform operation on <TCPTransport closed=True ...>; the
        # handler is closed"); redis-py has dropped that connection, the next call reconnects.
        if "handler is closed" not in str(exc):
            raise
        raise StoreUnavailable(f"{shown}: {action} failed: the connection was closed") from exc
    except redis.exceptions.ClusterCrossSlotError as exc:
        raise StoreError(f"{shown}: {action} failed: keys in several slots: {exc}") from exc
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise StoreError(f"{shown}: {action} failed: {exc}") from exc


def _no_master(exc: MasterNotFoundError, shown: str) -> str:
    """What the sentinels said, in a line: redis-py's message holds every client's repr."""
    text = str(exc)
    service = re.match(r"No master found for '([^']*)'", text)
    named = f" for service {service.group(1)!r}" if service else ""
    answers = re.findall(r" - (\w+):(\w+)", text)
    said = ", ".join(f"{n} x {kind}" for kind, n in Counter(e for _, e in answers).items())
    if not any(kind == "auth" for kind, _ in answers):
        hint = "; check the sentinel addresses and the service name (SENTINEL MASTERS)"
    elif "sentinel_auth=yes" in shown:
        hint = "; the sentinels refused the store's user and password: check them"
    elif "sentinel_password=" in shown:
        hint = "; the sentinels refused their password (store_sentinel_password_file): check it"
    else:
        hint = (
            "; the sentinels want a password: add ?sentinel_auth=yes to the store URL"
            " (the data nodes' user and password are then sent to them too), or set"
            " store_sentinel_password_file to a file holding theirs"
        )
    return f"no sentinel named a master{named} (answers: {said or 'none'}){hint}"
