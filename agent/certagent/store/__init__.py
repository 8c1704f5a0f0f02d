"""Certificate storage: one :class:`Store` interface, a Redis and a directory implementation.

Layouts are described in docs/store.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from certagent.certs.keycrypt import KeyRing
from certagent.config import Settings
from certagent.errors import ConfigError
from certagent.store._dirwatch import WatchMode
from certagent.store._redis_conn import CLUSTER_SCHEME, SENTINEL_SCHEME, parse_ha_url
from certagent.store.base import CertRecord, Change, Page, Store, StoredCertificate, redact_url
from certagent.store.directory import DEFAULT_POLL_INTERVAL, DirectoryStore
from certagent.store.redis import DEFAULT_PREFIX, RedisStore

__all__ = [
    "CertRecord",
    "Change",
    "DirectoryStore",
    "Page",
    "RedisStore",
    "Store",
    "StoreUrl",
    "StoredCertificate",
    "open_configured",
    "open_store",
    "parse_store_url",
    "read_secret",
    "with_password",
    "with_sentinel_password",
]

_REDIS_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME, CLUSTER_SCHEME)
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]+\Z")
_EXAMPLES = (
    "redis://[:password@]host:6379/0, rediss://host:6380/0, unix:///run/redis/redis.sock, "
    "redis+sentinel://host:26379[,host:port...]/service[/db], "
    "redis+cluster://host:7000[,host:port...], file:///etc/certagent/certs or a directory path"
)


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
    parts = urlsplit(url)
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
    parts = urlsplit(url)
    if parts.scheme.lower() == "unix":
        glue = "&" if parts.query else "?"
        return f"{url}{glue}{urlencode({'password': password})}"
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    rest = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{user}:{quote(password, safe='')}@{host}{rest}"


def with_sentinel_password(url: str, password: str) -> str:
    """``url`` (a ``redis+sentinel://`` URL) with the sentinels' own ``password`` added."""
    glue = "&" if urlsplit(url).query else "?"
    return f"{url}{glue}{urlencode({'sentinel_password': password})}"


def open_store(
    url: str,
    *,
    redis_prefix: str = DEFAULT_PREFIX,
    keyring: KeyRing | None = None,
    dir_watch: str = "auto",
    dir_poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> Store:
    """The store named by ``url``; no I/O (call :meth:`Store.ping` to check it).

    Redis URLs give a :class:`RedisStore`, which needs ``keyring`` (the
    ``key_file`` setting) to read or write records; a directory gives a
    :class:`DirectoryStore`, which ignores it (keys stay plaintext files, mode
    0600) and notices changes as ``dir_watch`` and ``dir_poll_interval`` say.
    Raises :class:`ConfigError` for anything else (:func:`parse_store_url`).
    """
    if dir_watch not in ("auto", "poll"):
        raise ConfigError(f"dir_watch must be auto or poll, not {dir_watch!r}")
    watch: WatchMode = "poll" if dir_watch == "poll" else "auto"
    parsed = parse_store_url(url)
    if parsed.kind == "redis":
        return RedisStore(url, prefix=redis_prefix, keyring=keyring)
    assert parsed.directory is not None
    return DirectoryStore(parsed.directory, watch=watch, poll_interval=dir_poll_interval)


def open_configured(settings: Settings) -> Store:
    """The store of ``settings``, with the key ring from ``key_file`` when one is set.

    A Redis store needs one: private keys are encrypted at rest.
    """
    keyring = KeyRing.from_file(settings.key_file) if settings.key_file else None
    url = settings.store
    if settings.store_password_file:
        url = with_password(url, read_secret(settings.store_password_file, "store password"))
    if settings.store_sentinel_password_file:
        if not url.lower().startswith(f"{SENTINEL_SCHEME}://"):
            raise ConfigError(
                "store_sentinel_password_file is for a redis+sentinel:// store; remove it"
            )
        secret = read_secret(settings.store_sentinel_password_file, "sentinel password")
        url = with_sentinel_password(url, secret)
    store = open_store(
        url,
        redis_prefix=settings.redis_prefix,
        keyring=keyring,
        dir_watch=settings.dir_watch,
        dir_poll_interval=settings.dir_poll_interval,
    )
    if isinstance(store, RedisStore) and keyring is None:
        raise ConfigError(
            "a Redis store encrypts private keys: set key_file (or CERTAGENT_KEY_FILE) to a key "
            "file made with 'certagent keys generate k1 > /etc/certagent/data.key'"
        )
    return store


def read_secret(path: str, what: str) -> str:
    """The first line of a secret file (a password); ConfigError if unreadable or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"cannot read the {what} file {path}: {reason}") from exc
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise ConfigError(f"the {what} file {path} is empty")
    return secret
