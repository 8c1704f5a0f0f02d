"""Certificates as PEM files in a directory (plain files or certbot's ``live/`` layout).

For a validated name ``N`` with one-label wildcard ``*.P`` (see docs/store.md)::

    <root>/N.pem                       combined: chain + key
    <root>/live/N/fullchain.pem        certbot: chain ...
    <root>/live/N/privkey.pem          ... and key
    <root>/_wildcard.P.pem             combined, wildcard
    <root>/*.P.pem
    <root>/live/_wildcard.P/{fullchain,privkey}.pem
    <root>/live/*.P/{fullchain,privkey}.pem

The first candidate that exists decides.  A record's id is its path relative to
``root`` (``live/N/fullchain.pem`` for certbot).  Only files whose name is
exactly what a lookup builds (a valid lowercase name, ``_wildcard.`` or ``*.``
for wildcards) are records: they are what :meth:`DirectoryStore.list` and
:meth:`DirectoryStore.changes` see.

:meth:`DirectoryStore.add` writes ``<root>/<first name>.pem`` (mode 0600,
through a synced temporary file, hard-linked into place so an existing file is
never overwritten) and an *alias* for each other name: a symlink
``<root>/<name>.pem -> <first name>.pem``, unless a file for that name already
exists.  A lookup through an alias reports the record's id, as do the change
feed and :meth:`DirectoryStore.delete`, which removes the aliases too.
:meth:`DirectoryStore.replace` rewrites the file in place (temporary file +
rename) and adjusts the aliases.  Certbot's ``live/`` records and other
symlinks are read-only.  Private keys stay plaintext PEM on disk (mode 0600):
encryption at rest is the Redis store's.  There is no version history:
``version`` is always 1 and ``updated_at`` is the file's mtime.

The change feed polls: it keeps a snapshot ``{path: (inode, mtime, size)}`` of
the record files and aliases (symlinks followed) and reports the records whose
files differ.  Paths are built only from names that passed
:func:`agent.hostname.normalise` or from ids checked the same way, so they
never contain ``..``.  Files are read in a worker thread.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import secrets
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from agent import hostname
from agent.errors import (
    CertificateError,
    ChangesLost,
    DuplicateCertificate,
    InvalidHostname,
    NotFound,
    ReadOnlyRecord,
    StoreCorrupt,
    StoreUnavailable,
)
from agent.pem import CertBundle, parse_leaf
from agent.store._files import (
    Entry,
    Snapshot,
    atomic_write,
    diff,
    exclusive_write,
    fsync_dir,
    signature,
)
from agent.store.base import (
    CertRecord,
    Change,
    Page,
    StoredCertificate,
    candidate_names,
    check_record,
    decode_cursor,
    encode_cursor,
    make_record,
)

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "MAX_FILE_SIZE",
    "WILDCARD_PREFIX",
    "DirectoryStore",
    "file_stem",
    "name_of_stem",
]

log = logging.getLogger(__name__)

#: Files above this size are not certificates; they are reported as corrupt, not read.
MAX_FILE_SIZE = 1 << 20
#: How a ``*.`` wildcard is spelled in file names written by the agent.
WILDCARD_PREFIX = "_wildcard."
#: How often :meth:`DirectoryStore.changes` looks at the directory, in seconds.
DEFAULT_POLL_INTERVAL = 0.2
FULLCHAIN = "fullchain.pem"
PRIVKEY = "privkey.pem"
LIVE = "live"
_POSITIONS_KEPT = 16


@dataclass(frozen=True)
class _Candidate:
    """One place a record may be: a combined file, or a certbot directory."""

    relative: str  # the record id, relative to root
    chain: Path
    key: Path | None  # None: the key is inside ``chain``


@dataclass(frozen=True)
class _Found:
    candidate: _Candidate
    record_id: str  # the candidate's, or the record an alias points to
    chain: bytes
    key: bytes | None


def file_stem(name: str) -> str:
    """The file name stem the agent writes ``name`` under: ``*.x.com`` -> ``_wildcard.x.com``."""
    return WILDCARD_PREFIX + name[2:] if name.startswith("*.") else name


def name_of_stem(stem: str) -> str | None:
    """The name a file stem or certbot directory stands for, or None if lookups never use it.

    ``a.x.com`` -> ``a.x.com``; ``_wildcard.x.com`` and ``*.x.com`` -> ``*.x.com``.
    """
    raw = "*." + stem[len(WILDCARD_PREFIX) :] if stem.startswith(WILDCARD_PREFIX) else stem
    try:
        name = hostname.normalise_pattern(raw)
    except InvalidHostname:
        return None
    return name if name == raw else None


def _spellings(name: str) -> list[str]:
    """The stems a lookup tries for ``name``, in order."""
    return [file_stem(name), name] if name.startswith("*.") else [name]


class DirectoryStore:
    """A :class:`~agent.store.base.Store` on a local directory."""

    def __init__(self, root: Path, *, poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self._root = root
        self._uri = root.absolute().as_uri()
        self._poll_interval = poll_interval
        self._instance = secrets.token_hex(4)
        self._counter = 0
        self._snapshots: OrderedDict[str, Snapshot] = OrderedDict()

    @property
    def root(self) -> Path:
        return self._root

    def describe(self) -> str:
        return self._uri

    async def ping(self) -> None:
        if not await asyncio.to_thread(self._root.is_dir):
            raise StoreUnavailable(f"{self._uri}: not a directory")

    async def close(self) -> None:
        return None

    # --- lookups ---------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        names = candidate_names(hostname)
        try:
            found = await asyncio.to_thread(self._read_first, self._candidates(names))
        except StoreCorrupt as exc:
            log.warning("ignoring store record for %s: %s", names[0], exc)
            return None
        if found is None:
            return None
        return check_record(self._uri, found.record_id, names[0], found.chain, found.key)

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """At most one certificate: a directory holds one file per name."""
        found = await self.lookup(hostname)
        return () if found is None else (found,)

    async def get(self, cert_id: str) -> CertRecord | None:
        return await asyncio.to_thread(self._get, cert_id)

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if expiring_before is not None and expiring_before.utcoffset() is None:
            raise ValueError("expiring_before must be timezone-aware")
        after = decode_cursor(cursor) if cursor is not None else None
        pattern = hostname.normalise_pattern(name) if name is not None else None
        return await asyncio.to_thread(self._list, pattern, expiring_before, after, limit)

    # --- writes ----------------------------------------------------------------------

    async def put(self, bundle: CertBundle) -> str:
        """Write ``<root>/<name>.pem`` for every name (replacing); return the first one's path."""
        files = [f"{file_stem(name)}.pem" for name in bundle.names]
        await asyncio.to_thread(self._write, files, bundle.pem)
        log.info("stored certificate %s for %s in %s", files[0], " ".join(bundle.names), self._uri)
        return files[0]

    async def add(self, bundle: CertBundle) -> CertRecord:
        record = await asyncio.to_thread(self._add, bundle)
        log.info(
            "stored certificate %s for %s (sha256 %s) in %s",
            record.id,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._uri,
        )
        return record

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        record = await asyncio.to_thread(self._replace, cert_id, bundle)
        log.info(
            "replaced certificate %s for %s (sha256 %s) in %s",
            cert_id,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._uri,
        )
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        record = await asyncio.to_thread(self._delete, cert_id)
        names = " ".join(record.names)
        log.info("deleted certificate %s for %s from %s", cert_id, names, self._uri)
        return record

    # --- change feed -----------------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        """Poll the directory every ``poll_interval`` s until something differs from ``after``.

        Positions belong to this store object: one from another process (or an
        old one, when many callers share this object) raises ChangesLost.
        """
        if after is None:
            return (), self._remember(await asyncio.to_thread(self._scan))
        base = self._snapshots.get(after)
        if base is None:
            raise ChangesLost(f"{self._uri}: {after[:40]!r} is not a recent change-feed position")
        self._snapshots.move_to_end(after)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            current = await asyncio.to_thread(self._scan)
            if current != base:
                return diff(base, current), self._remember(current)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (), after
            await asyncio.sleep(min(self._poll_interval, remaining))

    def _remember(self, snapshot: Snapshot) -> str:
        self._counter += 1
        position = f"{self._instance}.{self._counter}"
        self._snapshots[position] = snapshot
        while len(self._snapshots) > _POSITIONS_KEPT:
            self._snapshots.popitem(last=False)
        return position

    # --- worker-thread helpers: lookups ----------------------------------------------

    def _candidates(self, names: tuple[str, ...]) -> builtins.list[_Candidate]:
        result: builtins.list[_Candidate] = []
        for name in names:
            spellings = _spellings(name)
            for stem in spellings:
                result.append(_Candidate(f"{stem}.pem", self._root / f"{stem}.pem", None))
            for stem in spellings:
                live = self._root / LIVE / stem
                result.append(
                    _Candidate(f"{LIVE}/{stem}/{FULLCHAIN}", live / FULLCHAIN, live / PRIVKEY)
                )
        return result

    def _read_first(self, candidates: builtins.list[_Candidate]) -> _Found | None:
        """The first candidate that exists, read."""
        for candidate in candidates:
            try:
                chain = self._read(candidate.relative, candidate.chain)
            except (FileNotFoundError, NotADirectoryError):
                continue
            key: bytes | None = None
            if candidate.key is not None:
                try:
                    key = self._read(candidate.relative, candidate.key)
                except FileNotFoundError:
                    key = None  # parse_bundle then looks for the key in the chain file
            record_id = candidate.relative
            if candidate.key is None:
                record_id = self._alias_target(candidate.chain) or record_id
            return _Found(candidate, record_id, chain, key)
        if not self._root.is_dir():
            raise StoreUnavailable(f"{self._uri}: not a directory")
        return None

    def _read(self, relative: str, path: Path) -> bytes:
        """Read one file; FileNotFoundError and NotADirectoryError pass through."""
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_SIZE + 1)
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot read {path.name} of {relative!r}: {exc.strerror}"
            ) from exc
        if len(data) > MAX_FILE_SIZE:
            raise StoreCorrupt(
                f"{self._uri}: {path.name} of {relative!r} is over {MAX_FILE_SIZE} bytes"
            )
        return data

    def _alias_target(self, path: Path) -> str | None:
        """If ``path`` is an alias (a symlink to a record file in root), that record's id."""
        try:
            target = os.readlink(path)
        except OSError:
            return None  # not a symlink, or gone
        if "/" in target or target == path.name or not target.endswith(".pem"):
            return None
        if name_of_stem(target[:-4]) is None:
            return None
        try:
            mode = os.lstat(self._root / target).st_mode
        except OSError:
            return None
        return target if stat.S_ISREG(mode) else None

    # --- worker-thread helpers: records ----------------------------------------------

    def _parse_id(self, cert_id: str) -> tuple[str, Path, bool] | None:
        """A record id as (name, chain path, certbot?); None if no record can have that id."""
        parts = cert_id.split("/")
        if len(parts) == 1 and cert_id.endswith(".pem"):
            name = name_of_stem(cert_id[:-4])
            return None if name is None else (name, self._root / cert_id, False)
        if len(parts) == 3 and parts[0] == LIVE and parts[2] == FULLCHAIN:
            name = name_of_stem(parts[1])
            return None if name is None else (name, self._root / cert_id, True)
        return None

    def _get(self, cert_id: str) -> CertRecord | None:
        parsed = self._parse_id(cert_id)
        if parsed is None:
            return None
        _, path, certbot = parsed
        if not certbot and self._alias_target(path) is not None:
            return None  # an alias, not a record
        return self._read_record(cert_id, path)

    def _read_record(self, cert_id: str, path: Path) -> CertRecord | None:
        """The metadata of the record at ``path`` (its first certificate); None if absent."""
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_SIZE + 1)
                mtime = os.fstat(handle.fileno()).st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: cannot read {cert_id!r}: {exc.strerror}") from exc
        if len(data) > MAX_FILE_SIZE:
            raise StoreCorrupt(f"{self._uri}: {cert_id!r} is over {MAX_FILE_SIZE} bytes")
        try:
            info = parse_leaf(data)
        except CertificateError as exc:
            raise StoreCorrupt(f"{self._uri}: record {cert_id!r} is not valid: {exc}") from exc
        return make_record(
            cert_id, info, version=1, updated_at=datetime.fromtimestamp(mtime, UTC)
        )

    def _list(
        self, pattern: str | None, before: datetime | None, after: str | None, limit: int
    ) -> Page:
        snapshot = self._scan()
        ids = sorted(
            path
            for path, entry in snapshot.items()
            if entry.record == path and (after is None or path > after)
        )
        records: builtins.list[CertRecord] = []
        for cert_id in ids:
            try:
                record = self._read_record(cert_id, self._root / cert_id)
            except StoreCorrupt as exc:
                log.warning("listing %s: %s", self._uri, exc)
                continue
            if record is None:
                continue  # removed since the scan
            if pattern is not None and pattern not in record.names:
                continue
            if before is not None and not record.not_after < before:
                continue
            if len(records) == limit:
                return Page(tuple(records), encode_cursor(records[-1].id))
            records.append(record)
        return Page(tuple(records), None)

    def _holder(self, name: str) -> str | None:
        """The file or certbot directory a lookup for exactly ``name`` would find."""
        for stem in _spellings(name):
            for relative in (f"{stem}.pem", f"{LIVE}/{stem}"):
                if os.path.lexists(self._root / relative):
                    return relative
        return None

    def _add(self, bundle: CertBundle) -> CertRecord:
        name = bundle.names[0]
        cert_id = f"{file_stem(name)}.pem"
        holder = self._holder(name)
        if holder is not None:
            raise self._duplicate(name, holder)
        try:
            try:
                exclusive_write(self._root, cert_id, bundle.pem)
            except FileExistsError:
                raise self._duplicate(name, cert_id) from None
            self._link_aliases(cert_id, [n for n in bundle.names if n != name])
            fsync_dir(self._root)
            mtime = os.stat(self._root / cert_id).st_mtime
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot write {cert_id!r}: {exc.strerror}"
            ) from exc
        return make_record(
            cert_id, bundle, version=1, updated_at=datetime.fromtimestamp(mtime, UTC)
        )

    def _duplicate(self, name: str, holder: str) -> DuplicateCertificate:
        return DuplicateCertificate(
            f"{self._uri}: a certificate for {name} is already stored as {holder!r};"
            " replace or delete that record instead"
        )

    def _writable(self, cert_id: str) -> tuple[str, Path]:
        """The name and path of the agent-writable record ``cert_id``, or raise."""
        parsed = self._parse_id(cert_id)
        if parsed is None:
            raise NotFound(f"{self._uri}: no certificate {cert_id[:100]!r}")
        name, path, certbot = parsed
        if certbot:
            raise ReadOnlyRecord(
                f"{self._uri}: {cert_id!r} belongs to certbot; renew or remove it with certbot"
            )
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise NotFound(f"{self._uri}: no certificate {cert_id!r}") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: cannot read {cert_id!r}: {exc.strerror}") from exc
        if stat.S_ISLNK(mode):
            target = self._alias_target(path)
            if target is not None:
                raise NotFound(f"{self._uri}: {cert_id!r} is an alias of certificate {target!r}")
            raise ReadOnlyRecord(
                f"{self._uri}: {cert_id!r} is a symlink the agent did not make; change its target"
            )
        if not stat.S_ISREG(mode):
            raise NotFound(f"{self._uri}: no certificate {cert_id!r}")
        return name, path

    def _replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        name, _ = self._writable(cert_id)
        if name not in bundle.names:
            raise CertificateError(
                f"the new certificate does not cover {name}, the name {cert_id!r} is stored"
                f" under (it covers {' '.join(bundle.names)}): add it as a new certificate"
            )
        try:
            atomic_write(self._root, cert_id, bundle.pem)
            aliases = self._aliases_of(cert_id)
            for alias_name, alias in aliases.items():
                if alias_name not in bundle.names:
                    os.unlink(self._root / alias)
            self._link_aliases(
                cert_id, [n for n in bundle.names if n != name and n not in aliases]
            )
            fsync_dir(self._root)
            mtime = os.stat(self._root / cert_id).st_mtime
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot write {cert_id!r}: {exc.strerror}"
            ) from exc
        return make_record(
            cert_id, bundle, version=1, updated_at=datetime.fromtimestamp(mtime, UTC)
        )

    def _delete(self, cert_id: str) -> CertRecord:
        _, path = self._writable(cert_id)
        record = self._read_record(cert_id, path)
        if record is None:
            raise NotFound(f"{self._uri}: no certificate {cert_id!r}")
        try:
            for alias in self._aliases_of(cert_id).values():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._root / alias)
            os.unlink(path)
            fsync_dir(self._root)
        except FileNotFoundError:
            raise NotFound(f"{self._uri}: no certificate {cert_id!r}") from None
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot delete {cert_id!r}: {exc.strerror}"
            ) from exc
        return record

    def _aliases_of(self, cert_id: str) -> dict[str, str]:
        """{name: alias file} of the aliases pointing to ``cert_id``."""
        aliases: dict[str, str] = {}
        with os.scandir(self._root) as entries:
            for entry in entries:
                if not entry.name.endswith(".pem") or not entry.is_symlink():
                    continue
                name = name_of_stem(entry.name[:-4])
                if name is not None and os.readlink(entry.path) == cert_id:
                    aliases[name] = entry.name
        return aliases

    def _link_aliases(self, cert_id: str, names: builtins.list[str]) -> None:
        for name in names:
            alias = f"{file_stem(name)}.pem"
            holder = self._holder(name)
            if holder is None:
                try:
                    os.symlink(cert_id, self._root / alias)
                    continue
                except FileExistsError:
                    holder = alias
            log.warning(
                "%s: %s is not linked to %s: %s is already there", self._uri, name, cert_id, holder
            )

    def _write(self, files: builtins.list[str], data: bytes) -> None:
        try:
            for name in files:
                atomic_write(self._root, name, data)
            fsync_dir(self._root)
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot write {files[0]!r}: {exc.strerror}"
            ) from exc

    # --- worker-thread helpers: change feed ------------------------------------------

    def _scan(self) -> Snapshot:
        """Every record file and alias in root and every certbot record, with signatures."""
        snapshot: Snapshot = {}
        try:
            with os.scandir(self._root) as entries:
                files = [(e.name, e.is_symlink()) for e in entries if e.name.endswith(".pem")]
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: cannot list: {exc.strerror}") from exc
        for filename, is_link in files:
            name = name_of_stem(filename[:-4])
            path = self._root / filename
            found = signature(path)
            if name is None or found is None:
                continue
            record = (self._alias_target(path) if is_link else None) or filename
            snapshot[filename] = Entry(record, name, found)
        try:
            with os.scandir(self._root / LIVE) as entries:
                dirs = [e.name for e in entries]
        except (FileNotFoundError, NotADirectoryError):
            dirs = []
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: cannot list {LIVE}: {exc.strerror}") from exc
        for dirname in dirs:
            name = name_of_stem(dirname)
            live = self._root / LIVE / dirname
            chain = signature(live / FULLCHAIN)
            if name is None or chain is None:
                continue
            cert_id = f"{LIVE}/{dirname}/{FULLCHAIN}"
            snapshot[cert_id] = Entry(cert_id, name, chain + (signature(live / PRIVKEY) or ()))
        return snapshot
