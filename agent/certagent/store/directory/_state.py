"""The directory store's own files, in ``<root>/.certagent/``: what is not a certificate.

Blocking functions on paths, run on the store's worker threads.  The
certificate scanner and watcher never look here: they read only ``<name>.pem``
files directly in root and ``live/`` (a name never starts with a dot).

::

    .certagent/                        mode 0700
      managed/<record id>.json         {"managed": "acme", "sha256": "<leaf>"}: the record was
                                       obtained by the agent (add_issued)
      acme/<h>.json                    the account of the CA whose directory URL has SHA-256 h
                                       (32 hex digits): directory, url, contact, updated_at,
                                       key_file
      acme/<h>.<k>.key                 its private key, PEM, mode 0600 (k: 16 hex digits of the
                                       key's SHA-256; a new key is a new file, so the JSON is
                                       switched to it in one rename)
      acme/.lock                       flock'ed while the account is compared and set
      domains/<name>                   a registration: "<added_at Unix seconds> <issue 0|1>"
                                       (``_wildcard.x`` for ``*.x``)

A *mark* (``managed/``) holds the SHA-256 of the leaf it is about: a file
replaced by anything else (an upload, a copy, certbot) no longer matches it and
reads as uploaded (``managed`` ``""``), so a stale mark can never claim a
certificate the agent did not obtain.  Every file is written through a synced
temporary file and a rename (:func:`~certagent.store.directory._files.atomic_write`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from certagent.errors import StoreCorrupt
from certagent.store.directory._files import atomic_write, fsync_dir, read_regular
from certagent.store.directory._index import file_stem, name_of_stem
from certagent.store.issuance import AcmeAccount, Registration
from certagent.store.issuing import decode_registration, encode_registration

__all__ = [
    "STATE_DIR",
    "drop_mark",
    "list_registrations",
    "load_account",
    "read_mark",
    "read_registration",
    "remove_registration",
    "save_account",
    "write_mark",
    "write_registration",
]

STATE_DIR = ".certagent"
_MANAGED, _ACME, _DOMAINS = "managed", "acme", "domains"
_SMALL = 64 * 1024  # no state file is bigger


def _dir(root: Path, part: str) -> Path:
    """``root/.certagent/part``, made (mode 0700) if missing."""
    path = root / STATE_DIR / part
    if not path.is_dir():
        (root / STATE_DIR).mkdir(mode=0o700, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def _read(path: Path) -> bytes | None:
    """A small state file, or None if it does not exist."""
    try:
        data, _ = read_regular(path, str(path), _SMALL)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return data


# --- marks of issued records ----------------------------------------------------------------


def write_mark(root: Path, cert_id: str, managed: str, sha256: str) -> None:
    """Say that record ``cert_id`` holding leaf ``sha256`` is ``managed`` (before writing it)."""
    body = json.dumps({"managed": managed, "sha256": sha256}).encode("ascii")
    atomic_write(_dir(root, _MANAGED), f"{cert_id}.json", body)


def read_mark(root: Path, cert_id: str, sha256: str) -> str:
    """``managed`` of record ``cert_id`` whose leaf is ``sha256``: ``""`` unless a mark matches."""
    try:
        raw = _read(root / STATE_DIR / _MANAGED / f"{cert_id}.json")
        mark = json.loads(raw) if raw is not None else None
    except (OSError, StoreCorrupt, ValueError):
        return ""  # unreadable: the record reads as an upload, as without a mark
    if not isinstance(mark, dict) or mark.get("sha256") != sha256:
        return ""
    managed = mark.get("managed")
    return managed if isinstance(managed, str) and managed.isascii() else ""


def drop_mark(root: Path, cert_id: str, sha256: str | None = None) -> None:
    """Remove the mark of ``cert_id`` (only if it is about leaf ``sha256``, when given)."""
    path = root / STATE_DIR / _MANAGED / f"{cert_id}.json"
    if sha256 is not None and read_mark(root, cert_id, sha256) == "":
        return
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(path)


# --- the ACME account -----------------------------------------------------------------------


def _account_stem(directory: str) -> str:
    return hashlib.sha256(directory.encode("utf-8")).hexdigest()[:32]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_account(root: Path, directory: str) -> AcmeAccount | None:
    """The account for the CA at ``directory``, or None; StoreCorrupt if its files are not."""
    folder = root / STATE_DIR / _ACME
    raw = _read(folder / f"{_account_stem(directory)}.json")
    if raw is None:
        return None
    where = f"{folder / _account_stem(directory)}.json"
    try:
        meta = json.loads(raw)
        if meta["directory"] != directory:
            raise ValueError("it is another CA's account")
        key_file = meta["key_file"]
        if not isinstance(key_file, str) or "/" in key_file or not key_file.endswith(".key"):
            raise ValueError("key_file is not a key file's name")
        key = _read(folder / key_file)
        if key is None:
            raise ValueError(f"{key_file} is missing")
        contact = meta["contact"]
        if not isinstance(contact, list) or not all(isinstance(c, str) for c in contact):
            raise ValueError("contact is not a list of strings")
        return AcmeAccount(
            directory=directory,
            key_pem=key,
            url=meta["url"] or None,
            contact=tuple(contact),
            updated_at=datetime.fromtimestamp(float(meta["updated_at"]), UTC),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupt(f"{where} is not an ACME account: {exc}") from exc


def save_account(
    root: Path, account: AcmeAccount, previous_url: str | None, now: datetime
) -> AcmeAccount:
    """Compare-and-set on the URL, under ``acme/.lock``; the stored account afterwards."""
    folder = _dir(root, _ACME)
    stem = _account_stem(account.directory)
    with _locked(folder):
        stored = load_account(root, account.directory)
        if stored is not None and stored.url != previous_url:
            return stored
        key_file = f"{stem}.{hashlib.sha256(account.key_pem).hexdigest()[:16]}.key"
        if _read(folder / key_file) != account.key_pem:
            atomic_write(folder, key_file, account.key_pem)
        meta = {
            "directory": account.directory,
            "url": account.url or "",
            "contact": list(account.contact),
            "updated_at": int(now.timestamp()),
            "key_file": key_file,
        }
        atomic_write(folder, f"{stem}.json", json.dumps(meta, indent=1).encode("ascii"))
        for old in folder.glob(f"{stem}.*.key"):
            if old.name != key_file:
                old.unlink(missing_ok=True)
        fsync_dir(folder)
    return AcmeAccount(
        account.directory, account.key_pem, account.url, account.contact, now.replace(microsecond=0)
    )


# --- registrations ---------------------------------------------------------------------------


def read_registration(root: Path, name: str) -> Registration | None:
    """The registration of validated ``name``, or None."""
    raw = _read(root / STATE_DIR / _DOMAINS / file_stem(name))
    if raw is None:
        return None
    try:
        return decode_registration(name, raw.strip())
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreCorrupt(f"{root / STATE_DIR / _DOMAINS / file_stem(name)}: {exc}") from exc


def write_registration(root: Path, name: str, issue: bool, now: float) -> Registration:
    """Register validated ``name`` (again: ``issue`` updated, ``added_at`` kept)."""
    before = read_registration(root, name)
    added = now if before is None else before.added_at.timestamp()
    folder = _dir(root, _DOMAINS)
    atomic_write(folder, file_stem(name), encode_registration(added, issue).encode("ascii"))
    return decode_registration(name, encode_registration(added, issue))


def remove_registration(root: Path, name: str) -> bool:
    """Forget validated ``name``; False if it was not registered."""
    try:
        os.unlink(root / STATE_DIR / _DOMAINS / file_stem(name))
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def list_registrations(root: Path, after: str | None, limit: int) -> list[Registration]:
    """Registrations in name order after ``after``, at most ``limit``: O(N) (a listing)."""
    try:
        stems = os.listdir(root / STATE_DIR / _DOMAINS)
    except (FileNotFoundError, NotADirectoryError):
        return []
    names = sorted(n for n in map(name_of_stem, stems) if n is not None)
    found: list[Registration] = []
    for name in names:
        if after is not None and name <= after:
            continue
        registration = read_registration(root, name)
        if registration is not None:
            found.append(registration)
            if len(found) == limit:
                break
    return found
