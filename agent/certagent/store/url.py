"""Store URLs, taken apart without I/O: which kind of store, where, and its passwords kept apart.

``redis://``, ``rediss://`` and ``unix://`` name one Redis; ``redis+sentinel://``
the master a Sentinel set names; ``redis+cluster://`` a Redis Cluster;
``file:///absolute/path`` or a plain path a directory (docs/store.md).
Nothing here imports a store: both stores import this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit

from certagent.errors import ConfigError

__all__ = [
    "CLUSTER_SCHEME",
    "SENTINEL_SCHEME",
    "HaUrl",
    "StoreUrl",
    "parse_ha_url",
    "parse_store_url",
    "redact_url",
    "with_password",
    "with_sentinel_password",
]

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_REDIS_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, CLUSTER_SCHEME)
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]+\Z")
_NODE = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})\Z")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_EXAMPLES = (
    "redis://[:password@]host:6379/0, rediss://host:6380/0, unix:///run/redis/redis.sock, "
    "redis+sentinel://host:26379[,host:port...]/service[/db], "
    "redis+cluster://host:7000[,host:port...], file:///etc/certagent/certs or a directory path"
)


def _urlsplit(url: str) -> SplitResult:
    """``urlsplit``, also for a list of nodes with bracketed IPv6 ones (``h:1,[::1]:2``).

    Python 3.12 and later refuse a netloc with anything before its ``[`` (gh-103848), which
    a Sentinel or Cluster URL's list of nodes has ("Invalid IPv6 URL"; Debian 13 runs 3.13).
    The list is split with a placeholder host and put back: callers get the netloc 3.11 gave.
    """
    scheme, sep, rest = url.partition("://")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, hosts = rest[:cut].rpartition("@")
    if not sep or "," not in hosts:
        return urlsplit(url)
    parts = urlsplit(f"{scheme}{sep}{userinfo}{at}nodes.invalid{rest[cut:]}")
    return parts._replace(netloc=f"{userinfo}{at}{hosts}")


@dataclass(frozen=True)
class StoreUrl:
    """A store URL taken apart: where, what kind, and its password kept apart."""

    kind: Literal["redis", "directory"]
    url: str  # the URL without its passwords (safe to write into a 0644 file and to log)
    password: str | None
    directory: Path | None = None  # the directory of a directory store
    sentinel_password: str | None = None  # the sentinels' own (``?sentinel_password=``)


def parse_store_url(url: str) -> StoreUrl:
    """Validate ``url`` and take its password out; ConfigError for anything else (no I/O).

    ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` and
    ``redis+cluster://`` are Redis; ``file:///absolute/path``
    or a plain path is a directory.  A bare ``host:port`` is an error (did you
    mean ``redis://host:port/0``?), and so is any other scheme.
    """
    if not url or not url.strip():
        raise ConfigError(f"the store URL is empty; use {_EXAMPLES}")
    scheme, sep, _ = url.partition("://")
    if not sep:
        if _HOST_PORT.match(url):
            raise ConfigError(f"store {url!r} looks like host:port; did you mean redis://{url}/0?")
        path = Path(url).expanduser().absolute()
        return StoreUrl("directory", f"file://{path}", None, path)
    scheme = scheme.lower()
    parts = _urlsplit(url)
    if scheme in _REDIS_SCHEMES:
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
        password = password or next((v for k, v in query if k.lower() == "password"), None)
        sentinel = next((v for k, v in query if k.lower() == "sentinel_password"), None)
        netloc = parts.netloc.rpartition("@")[2]
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
        secret = ("password", "sentinel_password")
        clean_query = urlencode([(k, v) for k, v in query if k.lower() not in secret])
        clean = f"{parts.scheme}://{netloc}{parts.path}"
        if clean_query:
            clean += f"?{clean_query}"
        if scheme in (SENTINEL_SCHEME, CLUSTER_SCHEME):
            # ConfigError if the nodes, the service or the sentinels' credentials are wrong
            parse_ha_url(with_sentinel_password(clean, sentinel) if sentinel else clean, clean)
        elif sentinel is not None:
            raise ConfigError(
                f"store URL {redact_url(url)!r}: sentinel_password is for redis+sentinel:// URLs"
            )
        return StoreUrl(
            "redis",
            clean,
            unquote(password) if password else None,
            sentinel_password=sentinel or None,
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(
                f"store URL {redact_url(url)!r}: a file URL needs an absolute path, "
                "e.g. file:///etc/certagent/certs"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {redact_url(url)!r}: a file URL takes no '?' or '#'")
        path = Path(unquote(parts.path))
        return StoreUrl("directory", f"file://{path}", None, path)
    raise ConfigError(f"unsupported store URL scheme {scheme[:20]!r}; use {_EXAMPLES}")


def with_password(url: str, password: str) -> str:
    """``url`` (a Redis URL without password) with ``password`` put back."""
    parts = _urlsplit(url)
    if parts.scheme.lower() == "unix":
        glue = "&" if parts.query else "?"
        return f"{url}{glue}{urlencode({'password': password})}"
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{user}:{quote(password, safe='')}@{host}{rest}"


def with_sentinel_password(url: str, password: str) -> str:
    """``url`` (a ``redis+sentinel://`` URL) with the sentinels' own ``password`` added."""
    glue = "&" if _urlsplit(url).query else "?"
    return f"{url}{glue}{urlencode({'sentinel_password': password})}"


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
    parts = _urlsplit(url)
    scheme = parts.scheme.lower()
    hosts = parts.netloc.rpartition("@")[2]
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        match = _NODE.match(item.strip())
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


_SECRET_PARAMS = ("password", "sentinel_password")


def redact_url(url: str) -> str:
    """``url`` with any password (userinfo, ``?password=``, ``?sentinel_password=``) as ``***``."""
    parts = _urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
        )
    # Not urlunsplit: it turns "unix:///path" into "unix:/path".
    redacted = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    if query:
        redacted += "?" + query
    if parts.fragment:
        redacted += "#" + parts.fragment
    return redacted
