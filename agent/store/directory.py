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
``root`` (``live/N/fullchain.pem`` for certbot).  :meth:`DirectoryStore.put`
writes ``<root>/<name>.pem`` (``_wildcard.P.pem`` for ``*.P``) for every name of
the bundle, each atomically with mode 0600.  Paths are built only from names
that passed :func:`agent.hostname.normalise`, so they never contain ``/`` or
``..``.  Files are read in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.errors import StoreCorrupt, StoreUnavailable
from agent.pem import CertBundle
from agent.store.base import StoredCertificate, candidate_names, check_record

__all__ = ["MAX_FILE_SIZE", "WILDCARD_PREFIX", "DirectoryStore", "file_stem"]

log = logging.getLogger(__name__)

#: Files above this size are not certificates; they are reported as corrupt, not read.
MAX_FILE_SIZE = 1 << 20
#: How a ``*.`` wildcard is spelled in file names written by the agent.
WILDCARD_PREFIX = "_wildcard."
FULLCHAIN = "fullchain.pem"
PRIVKEY = "privkey.pem"


@dataclass(frozen=True)
class _Candidate:
    """One place a record may be: a combined file, or a certbot directory."""

    relative: str  # the record id, relative to root
    chain: Path
    key: Path | None  # None: the key is inside ``chain``


@dataclass(frozen=True)
class _Found:
    candidate: _Candidate
    chain: bytes
    key: bytes | None


def file_stem(name: str) -> str:
    """The file name stem the agent writes ``name`` under: ``*.x.com`` -> ``_wildcard.x.com``."""
    return WILDCARD_PREFIX + name[2:] if name.startswith("*.") else name


class DirectoryStore:
    """A :class:`~agent.store.base.Store` on a local directory."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._uri = root.absolute().as_uri()

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

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        names = candidate_names(hostname)
        try:
            found = await asyncio.to_thread(self._read_first, self._candidates(names))
        except StoreCorrupt as exc:
            log.warning("ignoring store record for %s: %s", names[0], exc)
            return None
        if found is None:
            return None
        return check_record(self._uri, found.candidate.relative, names[0], found.chain, found.key)

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        found = await self.lookup(hostname)
        return () if found is None else (found,)

    async def put(self, bundle: CertBundle) -> str:
        """Write ``<root>/<name>.pem`` for every name; return the first one's path."""
        files = [f"{file_stem(name)}.pem" for name in bundle.names]
        await asyncio.to_thread(self._write, files, bundle.pem)
        log.info("stored certificate %s for %s in %s", files[0], " ".join(bundle.names), self._uri)
        return files[0]

    # --- worker-thread helpers ----------------------------------------------------

    def _candidates(self, names: tuple[str, ...]) -> list[_Candidate]:
        result: list[_Candidate] = []
        for name in names:
            spellings = [file_stem(name), name] if name.startswith("*.") else [name]
            for stem in spellings:
                result.append(_Candidate(f"{stem}.pem", self._root / f"{stem}.pem", None))
            for stem in spellings:
                live = self._root / "live" / stem
                result.append(
                    _Candidate(f"live/{stem}/{FULLCHAIN}", live / FULLCHAIN, live / PRIVKEY)
                )
        return result

    def _read_first(self, candidates: list[_Candidate]) -> _Found | None:
        """The first candidate that exists, read."""
        for candidate in candidates:
            try:
                chain = self._read(candidate, candidate.chain)
            except (FileNotFoundError, NotADirectoryError):
                continue
            key: bytes | None = None
            if candidate.key is not None:
                try:
                    key = self._read(candidate, candidate.key)
                except FileNotFoundError:
                    key = None  # parse_bundle then looks for the key in the chain file
            return _Found(candidate, chain, key)
        if not self._root.is_dir():
            raise StoreUnavailable(f"{self._uri}: not a directory")
        return None

    def _read(self, candidate: _Candidate, path: Path) -> bytes:
        """Read one file; FileNotFoundError and NotADirectoryError pass through."""
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_FILE_SIZE + 1)
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot read {path.name} of {candidate.relative!r}: {exc.strerror}"
            ) from exc
        if len(data) > MAX_FILE_SIZE:
            raise StoreCorrupt(
                f"{self._uri}: {path.name} of {candidate.relative!r} is over {MAX_FILE_SIZE} bytes"
            )
        return data

    def _write(self, files: list[str], data: bytes) -> None:
        try:
            for name in files:
                _atomic_write(self._root, name, data)
            _fsync_dir(self._root)
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot write {files[0]!r}: {exc.strerror}"
            ) from exc


def _atomic_write(directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` with ``data``, mode 0600, via a synced temporary file."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
