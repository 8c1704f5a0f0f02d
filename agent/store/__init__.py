"""Certificate storage: one :class:`Store` interface, a Redis and a directory implementation.

Layouts are described in docs/store.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from agent.config import Settings
from agent.errors import ConfigError
from agent.keycrypt import KeyRing
from agent.store.base import CertRecord, Change, Page, Store, StoredCertificate, redact_url
from agent.store.directory import DirectoryStore
from agent.store.redis import DEFAULT_PREFIX, RedisStore

__all__ = [
    "CertRecord",
    "Change",
    "DirectoryStore",
    "Page",
    "RedisStore",
    "Store",
    "StoredCertificate",
    "open_configured",
    "open_store",
]

_REDIS_SCHEMES = ("redis", "rediss", "unix")
_HOST_PORT = re.compile(r"[A-Za-z0-9.-]+:[0-9]+\Z")
_EXAMPLES = (
    "redis://[:password@]host:6379/0, rediss://host:6380/0, unix:///run/redis/redis.sock, "
    "file:///etc/certagent/certs or a directory path"
)


def open_store(
    url: str, *, redis_prefix: str = DEFAULT_PREFIX, keyring: KeyRing | None = None
) -> Store:
    """The store named by ``url``; no I/O (call :meth:`Store.ping` to check it).

    ``redis://``, ``rediss://`` and ``unix://`` give a :class:`RedisStore`,
    which needs ``keyring`` (the ``key_file`` setting) to read or write
    records; ``file:///absolute/path`` or a plain path gives a
    :class:`DirectoryStore`, which ignores it (keys stay plaintext files, mode
    0600).  Raises :class:`ConfigError` for anything else.
    """
    if not url or not url.strip():
        raise ConfigError(f"the store URL is empty; use {_EXAMPLES}")
    scheme, sep, _ = url.partition("://")
    if not sep:
        if _HOST_PORT.match(url):
            raise ConfigError(f"store {url!r} looks like host:port; did you mean redis://{url}/0?")
        return DirectoryStore(Path(url).expanduser())
    scheme = scheme.lower()
    if scheme in _REDIS_SCHEMES:
        return RedisStore(url, prefix=redis_prefix, keyring=keyring)
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigError(
                f"store URL {redact_url(url)!r}: a file URL needs an absolute path, "
                "e.g. file:///etc/certagent/certs"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"store URL {redact_url(url)!r}: a file URL takes no '?' or '#'")
        return DirectoryStore(Path(unquote(parts.path)))
    raise ConfigError(f"unsupported store URL scheme {scheme[:20]!r}; use {_EXAMPLES}")


def open_configured(settings: Settings) -> Store:
    """The store of ``settings``, with the key ring from ``key_file`` when one is set.

    A Redis store needs one: private keys are encrypted at rest.
    """
    keyring = KeyRing.from_file(settings.key_file) if settings.key_file else None
    store = open_store(settings.store, redis_prefix=settings.redis_prefix, keyring=keyring)
    if isinstance(store, RedisStore) and keyring is None:
        raise ConfigError(
            "a Redis store encrypts private keys: set key_file (or CERTAGENT_KEY_FILE) to a key "
            "file made with 'certagent keys generate k1 > /etc/certagent/data.key'"
        )
    return store
