"""Opening the store a URL or the settings name: the one place that picks a kind of store."""

from __future__ import annotations

from pathlib import Path

from certagent.certs.keycrypt import KeyRing
from certagent.config import Settings
from certagent.errors import ConfigError
from certagent.store.base import Store
from certagent.store.directory import DEFAULT_POLL_INTERVAL, DirectoryStore, WatchMode
from certagent.store.redis import DEFAULT_PREFIX, RedisStore
from certagent.store.url import (
    SENTINEL_SCHEME,
    parse_store_url,
    with_password,
    with_sentinel_password,
)

__all__ = ["open_configured", "open_store", "read_secret"]


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

    A store that encrypts private keys at rest (Redis) needs one.
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
    if keyring is None and store.data_keys() is not None:
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
