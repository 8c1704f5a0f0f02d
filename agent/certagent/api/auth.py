"""Bearer tokens for the REST API, kept as SHA-256 hashes in a file.

The tokens file (setting ``api_tokens_file``) has one ``name:sha256hex`` line
per token, optionally followed by what the token may do (its scopes, name
patterns, expiry, rate and client certificate subject, :mod:`certagent.api.grants`);
blank lines and ``#`` comments are ignored::

    # certagent API tokens -- add with `certagent token add NAME --file FILE`
    deploy:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
    panel:3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8555 scopes=domains,read

A line without attributes grants everything (``admin``), as every line did
before scopes existed.  ``-`` instead of a hash is a token no bearer value
matches: it authenticates only by its client certificate ``subject=`` (mutual TLS).

A token is ``cat_`` + 43 URL-safe base64 characters (32 random bytes); only its
hash is ever written down.  :func:`add_token` makes one, appends its line and
returns the token, which the caller prints once; :func:`register_token` writes
the hash of a token made elsewhere (a Docker secret), or a subject-only line;
:func:`remove_token` rewrites the file without one (atomically, mode and owner
kept); every edit holds an exclusive ``flock`` on the file.  :func:`token_names`
and :func:`token_entries` list names and grants, never a hash.

:class:`TokenFile` is what the agent checks requests against.  It calls ``stat`` on the
file on every authenticated request (≈2 µs, O(1)) and re-reads it when its
mtime, size or inode changed, so an added or removed token takes effect from
the next request on, without a restart or SIGHUP.  An edit that leaves the file
unparseable keeps the previous tokens (and logs a warning), a deleted file
accepts no token.  Checking a token costs O(tokens) hash comparisons, with
:func:`hmac.compare_digest`; finding a client certificate's subject one dict
lookup.  Nothing here logs a token or a hash.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from certagent.errors import ConfigError

from .grants import EVERYTHING, Grant, parse_attributes

__all__ = [
    "NO_TOKEN",
    "TOKEN_PREFIX",
    "TokenEntry",
    "TokenFile",
    "add_token",
    "bearer_token",
    "check_token",
    "hash_token",
    "parse_tokens",
    "register_token",
    "remove_token",
    "token_entries",
    "token_names",
]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "cat_"  # noqa: S105 (a prefix, not a secret)
#: written instead of a hash: no bearer token matches the line (a client certificate may)
NO_TOKEN = "-"  # noqa: S105 (a marker, not a secret)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}\Z")
_HASH = re.compile(r"[0-9a-f]{64}\Z")
_HEADER = "# certagent API tokens (name:sha256): `certagent token add NAME --file F`\n"
_MAX_FILE = 1 << 20
_TOKEN_MIN, _TOKEN_MAX = 16, 512
_TOKEN = re.compile(rf"[\x21-\x7e]{{{_TOKEN_MIN},{_TOKEN_MAX}}}\Z")


@dataclass(frozen=True)
class TokenEntry:
    name: str
    #: None: no bearer token (``-`` in the file): only its client certificate subject
    sha256: str | None = field(repr=False)
    grant: Grant = EVERYTHING

    def line(self) -> str:
        """The entry as a line of the file (without its newline)."""
        attributes = self.grant.attributes()
        head = f"{self.name}:{self.sha256 or NO_TOKEN}"
        return f"{head} {attributes}" if attributes else head


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens(text: str, *, source: str = "tokens file") -> tuple[TokenEntry, ...]:
    """Parse the file's lines; errors name ``source`` and the line number, never a hash."""
    entries: list[TokenEntry] = []
    subjects: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number}"
        name, sep, rest = (part.strip() for part in line.partition(":"))
        if not sep or not _NAME.match(name):
            raise ConfigError(
                f"{where}: expected name:sha256hex with a name of 1-64 letters, digits,"
                " '_', '.', '@' or '-'; add tokens with `certagent token add NAME --file FILE`"
            )
        words = rest.split()
        digest = words[0].lower() if words else ""
        if digest != NO_TOKEN and not _HASH.match(digest):
            raise ConfigError(
                f"{where}: the hash of token {name!r} is not 64 hex digits (the file holds"
                " SHA-256 hashes, never tokens); add tokens with `certagent token add`"
            )
        grant = parse_attributes(words[1:], where)
        if digest == NO_TOKEN and grant.subject is None:
            raise ConfigError(
                f"{where}: token {name!r} has no hash ('-') and no subject=: nothing can use it"
            )
        if any(entry.name == name for entry in entries):
            raise ConfigError(f"{where}: token name {name!r} appears twice")
        if grant.subject is not None:
            if grant.subject in subjects:
                raise ConfigError(f"{where}: client certificate subject of {name!r} appears twice")
            subjects.add(grant.subject)
        entries.append(TokenEntry(name, None if digest == NO_TOKEN else digest, grant))
    return tuple(entries)


def add_token(path: str | os.PathLike[str], name: str, grant: Grant = EVERYTHING) -> str:
    """Append a new random token named ``name`` to the file at ``path`` (made 0600); return it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    register_token(path, name, token, grant=grant)
    return token


def register_token(
    path: str | os.PathLike[str],
    name: str,
    token: str | None,
    *,
    replace: bool = False,
    grant: Grant = EVERYTHING,
) -> str:
    """Write ``name:sha256(token)`` and ``grant``'s attributes into the file at ``path``.

    The file is created 0600.  ``token`` is one made elsewhere (a Docker secret):
    16-512 printable ASCII characters without spaces; None writes a line no bearer
    token matches, for a client certificate (``grant.subject`` must be set).  A
    name already in the file is refused, unless ``replace``: then its line is
    rewritten (atomically, in place).  Returns what happened: ``"added"``,
    ``"replaced"`` or ``"unchanged"``.
    """
    _check_name(name)
    if token is not None:
        check_token(token)
    elif grant.subject is None:
        raise ConfigError("a line without a token needs a client certificate subject")
    target = Path(path)
    entry = TokenEntry(name, None if token is None else hash_token(token), grant)
    with _locked(target, create=True) as (fd, text):
        entries = parse_tokens(text, source=str(target))
        clash = next(
            (e for e in entries if grant.subject and e.grant.subject == grant.subject), None
        )
        if clash is not None and clash.name != name:
            raise ConfigError(
                f"{target}: token {clash.name!r} already has the client certificate subject"
                f" {grant.subject!r}"
            )
        old = next((e for e in entries if e.name == name), None)
        if old is None:
            line = entry.line() + "\n"
            if text and not text.endswith("\n"):
                line = "\n" + line
            elif not text:
                line = _HEADER + line
            _write_all(fd, target, line.encode("utf-8"))
            return "added"
        if not replace:
            raise ConfigError(
                f"{target} already has a token named {name!r}; remove it first with"
                f" `certagent token rm {name} --file {target}`, or choose another name"
            )
        same_hash = (old.sha256 is None and entry.sha256 is None) or (
            old.sha256 is not None
            and entry.sha256 is not None
            and hmac.compare_digest(old.sha256, entry.sha256)
        )
        if same_hash and old.grant == grant:
            return "unchanged"
        _rewrite(target, fd, _edit_lines(text, name, entry.line()))
        return "replaced"


def remove_token(path: str | os.PathLike[str], name: str) -> None:
    """Remove the token named ``name``: the file is rewritten atomically, mode and owner kept.

    ConfigError if the file does not exist or has no such token.  Comments,
    blank lines and the other tokens stay as they were.
    """
    target = Path(path)
    with _locked(target, create=False) as (fd, text):
        names = [entry.name for entry in parse_tokens(text, source=str(target))]
        if name not in names:
            raise ConfigError(
                f"tokens file {target} has no token named {name[:80]!r};"
                f" `certagent token ls --file {target}` lists the names it has"
            )
        _rewrite(target, fd, _edit_lines(text, name, None))


def token_names(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The names in the tokens file at ``path``, in file order (never a hash)."""
    return tuple(entry.name for entry in token_entries(path))


def token_entries(path: str | os.PathLike[str]) -> tuple[TokenEntry, ...]:
    """The entries of the tokens file at ``path``, in file order; ConfigError if it is missing."""
    target = Path(path)
    if not target.exists():
        raise ConfigError(
            f"tokens file {target} does not exist; create it with"
            f" `certagent token add NAME --file {target}`"
        )
    return parse_tokens(_read(target), source=str(target))


def check_token(token: str) -> None:
    """ConfigError unless ``token`` is 16-512 printable ASCII characters, no spaces.

    The message never quotes the token.
    """
    if not _TOKEN.match(token):
        raise ConfigError(
            f"the token is {len(token)} characters: it must be {_TOKEN_MIN}-{_TOKEN_MAX}"
            " printable ASCII characters without spaces (e.g. `openssl rand -hex 32`)"
        )


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise ConfigError(
            f"token name {name[:80]!r}: use 1-64 letters, digits, '_', '.', '@' or '-'"
        )


def _line_name(raw: str) -> str | None:
    """The token name a line of the file holds (as :func:`parse_tokens` reads it), if any."""
    line = raw.split("#", 1)[0].strip()
    return line.partition(":")[0].strip() if line else None


def _edit_lines(text: str, name: str, new: str | None) -> str:
    """``text`` with the line of ``name`` replaced by ``new`` (None: dropped)."""
    out: list[str] = []
    for raw in text.splitlines(keepends=True):
        if _line_name(raw) != name:
            out.append(raw)
        elif new is not None:
            out.append(new + "\n")
    return "".join(out)


@contextmanager
def _locked(target: Path, *, create: bool) -> Iterator[tuple[int, str]]:
    """The tokens file open for appending, its contents, under an exclusive ``flock``.

    Edits by two ``certagent token`` commands at once are serialised: a
    command that waited for the lock while the other replaced the file opens
    the new file and locks again.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(target, flags, 0o600)
        except FileNotFoundError as exc:
            raise ConfigError(
                f"tokens file {target} does not exist; create it with"
                f" `certagent token add NAME --file {target}`"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"cannot open tokens file {target}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(target)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                yield fd, _decode(_read_fd(fd, target), target)
                return
        finally:
            os.close(fd)


def _read_fd(fd: int, target: Path) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= _MAX_FILE:
        chunk = os.pread(fd, _MAX_FILE + 1 - size, size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > _MAX_FILE:
        raise ConfigError(f"API tokens file {target} is over {_MAX_FILE} bytes")
    return b"".join(chunks)


def _write_all(fd: int, target: Path, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except OSError as exc:
        raise ConfigError(f"cannot write tokens file {target}: {exc.strerror}") from exc


def _rewrite(target: Path, fd: int, text: str) -> None:
    """Replace ``target`` (open as ``fd``) by a file holding ``text``: same mode and owner.

    Written to a temporary file in the same directory, then renamed over
    ``target``: a reader sees the old file or the new one, never half of one.
    """
    held = os.fstat(fd)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(
            f"cannot rewrite tokens file {target}: {exc.strerror} (creating {tmp});"
            " its directory must be writable"
        ) from exc
    try:
        try:
            mine = os.fstat(out)
            if (mine.st_uid, mine.st_gid) != (held.st_uid, held.st_gid):
                os.fchown(out, held.st_uid, held.st_gid)
            os.fchmod(out, stat.S_IMODE(held.st_mode))
        except PermissionError as exc:
            raise ConfigError(
                f"cannot rewrite tokens file {target} as its owner (uid {held.st_uid},"
                f" gid {held.st_gid}) would read it: run this as that user or as root"
            ) from exc
        _write_all(out, tmp, text.encode("utf-8"))
        os.close(out)
        out = -1
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise ConfigError(f"cannot replace tokens file {target}: {exc.strerror}") from exc
    finally:
        if out != -1:
            os.close(out)
        tmp.unlink(missing_ok=True)


class TokenFile:
    """The accepted tokens, re-read from ``path`` whenever the file changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: tuple[TokenEntry, ...] = ()
        self._subjects: dict[str, TokenEntry] = {}
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
        tokens._use(parse_tokens(_read(tokens.path), source=f"tokens file {tokens.path}"))
        tokens._stamp = stamp
        if not tokens._entries:
            log.warning("API tokens file %s holds no token: every request is refused", tokens.path)
        return tokens

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self._entries)

    def match(self, token: str) -> str | None:
        """The name of ``token`` if the file accepts it, else None."""
        entry = self.find(token)
        return None if entry is None else entry.name

    def find(self, token: str) -> TokenEntry | None:
        """The entry of ``token`` if the file has one (expired or not), else None."""
        self._refresh()
        digest = hash_token(token)
        found: TokenEntry | None = None
        for entry in self._entries:  # no early exit: every request does the same work
            if entry.sha256 is not None and hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found

    def for_subject(self, subject: str) -> TokenEntry | None:
        """The entry whose ``subject=`` is this client certificate subject, if any."""
        self._refresh()
        return self._subjects.get(subject)

    def _use(self, entries: tuple[TokenEntry, ...]) -> None:
        self._entries = entries
        self._subjects = {e.grant.subject: e for e in entries if e.grant.subject is not None}

    def _current_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read API tokens file {self.path}: {exc.strerror}") from exc
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self) -> None:
        """Re-read the file if it changed (each request does; SIGHUP asks at once)."""
        self._refresh()

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
            self._use(())
            self._stamp = None
            return
        try:
            entries = parse_tokens(_read(self.path), source=f"tokens file {self.path}")
        except ConfigError as exc:
            log.warning("%s; keeping the %d tokens read before", exc, len(self._entries))
            self._bad_stamp = stamp
            return
        self._use(entries)
        self._stamp = stamp
        log.info("API tokens file %s re-read: %d tokens", self.path, len(entries))


def _read(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read API tokens file {path}: {exc.strerror}") from exc
    if len(data) > _MAX_FILE:
        raise ConfigError(f"API tokens file {path} is over {_MAX_FILE} bytes")
    return _decode(data, path)


def _decode(data: bytes, path: Path) -> str:
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
