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
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from certagent.errors import ConfigError, StoreError, StoreUnavailable

__all__ = [
    "CLUSTER_SCHEME",
    "MAX_CONNECTIONS",
    "SENTINEL_SCHEME",
    "HaUrl",
    "close_client",
    "connect",
    "parse_ha_url",
    "redis_errors",
]

# Connections per pool; more concurrent commands wait (up to the timeout) for one.
MAX_CONNECTIONS = 32
SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
# A Redis Cluster client opens up to this many connections per node (more fail).
_CLUSTER_CONNECTIONS = 256
_HOST_PORT = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})\Z")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class HaUrl:
    """A ``redis+sentinel://`` or ``redis+cluster://`` URL taken apart (no I/O)."""

    kind: Literal["sentinel", "cluster"]
    nodes: tuple[tuple[str, int], ...]
    service: str  # the Sentinel service name; "" for a cluster
    db: int
    username: str | None
    password: str | None
    sentinel_auth: bool = False  # the sentinels want the same credentials
    sentinel_username: str | None = None  # the sentinels' own credentials
    sentinel_password: str | None = None


def parse_ha_url(url: str, shown: str) -> HaUrl:
    """Take a Sentinel or Cluster URL apart; ConfigError naming ``shown`` if it is wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    hosts = parts.netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        match = _HOST_PORT.match(item.strip())
        if not match or not 0 < int(match.group(2)) < 65536:
            raise ConfigError(
                f"store URL {shown!r}: {item.strip()[:60]!r} is not host:port"
                " (list every node as host:port, separated by commas)"
            )
        nodes.append((match.group(1).strip("[]"), int(match.group(2))))
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    password = parts.password or query.get("password")
    username = parts.username or query.get("username")
    path = [p for p in parts.path.split("/") if p]
    auth = query.get("sentinel_auth", "no").lower()
    if auth not in ("yes", "no"):
        raise ConfigError(f"store URL {shown!r}: sentinel_auth is yes or no, not {auth[:20]!r}")
    sentinel_username = query.get("sentinel_username") or None
    sentinel_password = query.get("sentinel_password") or None
    own = sentinel_username is not None or sentinel_password is not None
    if (auth == "yes" or own) and scheme != SENTINEL_SCHEME:
        raise ConfigError(
            f"store URL {shown!r}: sentinel_auth, sentinel_username and sentinel_password"
            " are for redis+sentinel:// URLs"
        )
    if auth == "yes" and own:
        raise ConfigError(
            f"store URL {shown!r}: give either sentinel_auth=yes (the data nodes' credentials)"
            " or the sentinels' own (store_sentinel_password_file), not both"
        )
    if scheme == SENTINEL_SCHEME:
        if not path or len(path) > 2 or not _SERVICE.match(path[0]):
            raise ConfigError(
                f"store URL {shown!r}: name the Sentinel service (and optionally the db):"
                " redis+sentinel://host:26379,host:26380/mymaster/0"
            )
        if len(path) == 2 and not path[1].isdigit():
            raise ConfigError(f"store URL {shown!r}: the db must be a number, not {path[1]!r}")
        db = int(path[1]) if len(path) == 2 else 0
        kind: Literal["sentinel", "cluster"] = "sentinel"
        service = path[0]
    elif scheme == CLUSTER_SCHEME:
        if path and path != ["0"]:
            raise ConfigError(
                f"store URL {shown!r}: a Redis Cluster has only db 0; give no path:"
                " redis+cluster://host:7000,host:7001"
            )
        kind, service, db = "cluster", "", 0
    else:
        raise ConfigError(f"store URL {shown!r} is neither Sentinel nor Cluster")
    return HaUrl(
        kind,
        tuple(nodes),
        service,
        db,
        unquote(username) if username else None,
        unquote(password) if password else None,
        sentinel_auth=auth == "yes",
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
    )


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
        sentinel = Sentinel(list(ha.nodes), sentinel_kwargs=asked)  # type: ignore[no-untyped-call]
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
