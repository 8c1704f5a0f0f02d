"""Bearer tokens for the REST API, kept as SHA-256 hashes in a file.

The tokens file (setting ``api_tokens_file``) has one ``name:sha256hex`` line
per token; blank lines and ``#`` comments are ignored::

    # certagent API tokens -- add with `certagent token add NAME --file FILE`
    deploy:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8

A token is ``cat_`` + 43 URL-safe base64 characters (32 random bytes); only its
hash is ever written down.  :func:`add_token` makes one, appends its line and
returns the token, which the caller prints once.  :class:`TokenFile` re-reads
the file when it changes, so adding or removing a line takes effect without a
restart; an edit that leaves the file unparseable keeps the previous tokens
(and logs a warning), a deleted file accepts no token.  Tokens are compared
with :func:`hmac.compare_digest`.  Nothing here logs a token or a hash.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import ConfigError

__all__ = [
    "TOKEN_PREFIX",
    "TokenEntry",
    "TokenFile",
    "add_token",
    "bearer_token",
    "hash_token",
    "parse_tokens",
]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "cat_"  # noqa: S105 (a prefix, not a secret)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}\Z")
_HASH = re.compile(r"[0-9a-f]{64}\Z")
_HEADER = "# certagent API tokens (name:sha256): `certagent token add NAME --file F`\n"
_MAX_FILE = 1 << 20


@dataclass(frozen=True)
class TokenEntry:
    name: str
    sha256: str = field(repr=False)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens(text: str, *, source: str = "tokens file") -> tuple[TokenEntry, ...]:
    """Parse ``name:sha256hex`` lines; errors name ``source`` and the line number only."""
    entries: list[TokenEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number}"
        name, sep, digest = (part.strip() for part in line.partition(":"))
        if not sep or not _NAME.match(name):
            raise ConfigError(
                f"{where}: expected name:sha256hex with a name of 1-64 letters, digits,"
                " '_', '.', '@' or '-'; add tokens with `certagent token add NAME --file FILE`"
            )
        if not _HASH.match(digest.lower()):
            raise ConfigError(
                f"{where}: the hash of token {name!r} is not 64 hex digits (the file holds"
                " SHA-256 hashes, never tokens); add tokens with `certagent token add`"
            )
        if any(entry.name == name for entry in entries):
            raise ConfigError(f"{where}: token name {name!r} appears twice")
        entries.append(TokenEntry(name, digest.lower()))
    return tuple(entries)


def add_token(path: str | os.PathLike[str], name: str) -> str:
    """Append a new token named ``name`` to the file at ``path`` (created 0600); return it."""
    if not _NAME.match(name):
        raise ConfigError(
            f"token name {name[:80]!r}: use 1-64 letters, digits, '_', '.', '@' or '-'"
        )
    target = Path(path)
    existing = _read(target) if target.exists() else ""
    if any(entry.name == name for entry in parse_tokens(existing, source=str(target))):
        raise ConfigError(
            f"{target} already has a token named {name!r}; remove its line to revoke it,"
            " or choose another name"
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    line = f"{name}:{hash_token(token)}\n"
    if existing and not existing.endswith("\n"):
        line = "\n" + line
    elif not existing:
        line = _HEADER + line
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(line)
    except OSError as exc:
        raise ConfigError(f"cannot write tokens file {target}: {exc.strerror}") from exc
    return token


class TokenFile:
    """The accepted tokens, re-read from ``path`` whenever the file changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: tuple[TokenEntry, ...] = ()
        self._stamp: tuple[int, int, int] | None = None
        self._bad_stamp: tuple[int, int, int] | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenFile:
        """Read the file once; ConfigError if it is missing or malformed."""
        tokens = cls(path)
        stamp = tokens._current_stamp()
        if stamp is None:
            raise ConfigError(
                f"API tokens file {tokens.path} does not exist; create it with"
                f" `certagent token add NAME --file {tokens.path}`"
            )
        tokens._entries = parse_tokens(_read(tokens.path), source=f"tokens file {tokens.path}")
        tokens._stamp = stamp
        if not tokens._entries:
            log.warning("API tokens file %s holds no token: every request is refused", tokens.path)
        return tokens

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self._entries)

    def match(self, token: str) -> str | None:
        """The name of ``token`` if the file accepts it, else None."""
        self._refresh()
        digest = hash_token(token)
        found: str | None = None
        for entry in self._entries:  # no early exit: every request does the same work
            if hmac.compare_digest(entry.sha256, digest):
                found = entry.name
        return found

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read API tokens file {self.path}: {exc.strerror}") from exc
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        try:
            stamp = self._current_stamp()
        except ConfigError as exc:
            log.warning("%s; keeping the tokens read before", exc)
            return
        if stamp == self._stamp or (stamp is not None and stamp == self._bad_stamp):
            return
        if stamp is None:
            log.warning("API tokens file %s was removed: every request is refused", self.path)
            self._entries, self._stamp = (), None
            return
        try:
            entries = parse_tokens(_read(self.path), source=f"tokens file {self.path}")
        except ConfigError as exc:
            log.warning("%s; keeping the %d tokens read before", exc, len(self._entries))
            self._bad_stamp = stamp
            return
        self._entries, self._stamp = entries, stamp
        log.info("API tokens file %s re-read: %d tokens", self.path, len(entries))


def _read(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read API tokens file {path}: {exc.strerror}") from exc
    if len(data) > _MAX_FILE:
        raise ConfigError(f"API tokens file {path} is over {_MAX_FILE} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"API tokens file {path} is not UTF-8 text") from exc


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
