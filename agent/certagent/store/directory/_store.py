"""Certificates as PEM files in a directory (plain files or certbot's ``live/`` layout).

For a validated name ``N`` with one-label wildcard ``*.P`` (see docs/store.md)
the first of these that exists decides::

    <root>/N.pem                       combined: chain + key
    <root>/live/N/fullchain.pem        certbot: chain ...
    <root>/live/N/privkey.pem          ... and key
    live/<L>/ for every lineage L whose certificate names N (the SAN index)
    <root>/_wildcard.P.pem             combined, wildcard
    <root>/*.P.pem
    <root>/live/_wildcard.P/{fullchain,privkey}.pem
    <root>/live/*.P/{fullchain,privkey}.pem
    live/<L>/ for every lineage L whose certificate names *.P

A record's id is its path relative to ``root`` (``live/L/fullchain.pem`` for
certbot).  Only files whose name is exactly what a lookup builds (a valid
lowercase name, ``_wildcard.`` or ``*.`` for wildcards) are records.  The SAN
index (name -> lineages) is kept by :class:`~certagent.store.directory._watch.DirWatcher`,
which also feeds :meth:`DirectoryStore.changes`: inotify, or polling every
``poll_interval`` s where inotify is unavailable.  It starts with the first
lookup or change-feed call.

Every filesystem call runs on the store's own bounded pool of daemon threads
(:class:`~certagent.store.directory._threads.DaemonExecutor`) under a timeout: a read
that hangs (a dead NFS server, a FIFO) fails its lookup after ``read_timeout``
s with StoreUnavailable naming the path, and never delays :meth:`close` or the
agent's exit.  Only regular files are read, at most 1 MiB each.

:meth:`DirectoryStore.add` writes ``<root>/<first name>.pem`` (mode 0600,
through a synced temporary file, hard-linked into place so an existing file is
never overwritten) and an *alias* for each other name: a symlink
``<root>/<name>.pem -> <first name>.pem``, unless a file for that name already
exists.  A lookup through an alias reports the record's id.  Certbot's
``live/`` records and other symlinks are read-only.  Private keys stay
plaintext PEM on disk (mode 0600).  ``version`` is always 1 and ``updated_at``
is the file's mtime.  Paths are built only from names that passed
:func:`certagent.certs.hostname.normalise` or from ids checked the same way.

:meth:`DirectoryStore.issuance` is one node's (:mod:`._issuance`): the ACME
account, the registered names and the marks of the records the agent obtained
(``managed``) are kept in ``<root>/.certagent/`` (:mod:`._state`), which lookups,
listings and the change watcher never read; the rest is in memory.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from certagent.certs import hostname
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import NotFound, StoreCorrupt, StoreError, StoreUnavailable
from certagent.store.base import CertRecord, Change, Issuance, Page, StoredCertificate
from certagent.store.directory import _files
from certagent.store.directory._files import ocsp_path
from certagent.store.directory._fleet import DirectoryFleet
from certagent.store.directory._index import FULLCHAIN, LIVE, PRIVKEY, file_stem
from certagent.store.directory._issuance import directory_issuance
from certagent.store.directory._records import Records, spellings
from certagent.store.directory._renewals import DirRenewals
from certagent.store.directory._scan import alias_target
from certagent.store.directory._threads import DaemonExecutor
from certagent.store.directory._tickets import LocalRing
from certagent.store.directory._watch import SCAN_TIMEOUT, DirWatcher, WatchMode
from certagent.store.records import (
    best_first,
    candidate_names,
    check_record,
    decode_cursor,
    encode_cursor,
)

__all__ = ["DEFAULT_POLL_INTERVAL", "READ_TIMEOUT", "DirectoryStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How often the change feed rescans the directory when it cannot use inotify, in seconds.
DEFAULT_POLL_INTERVAL = 5.0
#: How long one lookup's reads (or one record's) may take, in seconds.
READ_TIMEOUT = 2.0
#: How long one write (file, fsync, aliases) may take, in seconds.
WRITE_TIMEOUT = 30.0
#: How long a lookup or the change feed waits for the first scan of the lineages, in seconds.
INDEX_WAIT = 10.0
#: Worker threads for filesystem calls (reads stuck on a hung filesystem hold one each).
THREADS = 8
#: Lineages read for one name at most (certbot keeps old ``-0001`` lineages around).
MAX_LINEAGES_PER_NAME = 8
_LIST_CHUNK = 64


@dataclass(frozen=True)
class _Candidate:
    """One place a record may be: a combined file, or a certbot directory."""

    relative: str  # the record id, relative to root
    chain: Path
    key: Path | None  # None: the key is inside ``chain``


@dataclass(frozen=True)
class _Found:
    record_id: str  # the candidate's, or the record an alias points to
    chain: bytes
    key: bytes | None
    refused: str | None = None  # why the file was not read (FIFO, too large ...)
    ocsp: bytes | None = None  # the ``<chain file>.ocsp`` beside it (DER), if any


def _reading(progress: builtins.list[str], suffix: str = "") -> str:
    """What a worker-thread call was reading when it timed out (it appends each path)."""
    return f"reading {progress[-1]!r}{suffix}"


class DirectoryStore:
    """A :class:`~certagent.store.base.Store` on a local directory.

    What it offers beyond the method roles: a ticket ring of this node only
    (:class:`LocalRing`), no data keys (private keys are files, mode 0600), no
    bulk adds, issuance for this node only.
    """

    def __init__(
        self,
        root: Path,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        watch: WatchMode = "auto",
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self._root = root
        self._uri = root.absolute().as_uri()
        self._poll_interval = poll_interval
        self._watch_mode: WatchMode = watch
        self._read_timeout = read_timeout
        self._records = Records(root, self._uri)
        self._pool: DaemonExecutor | None = None
        self._watcher: DirWatcher | None = None
        self._renewals = DirRenewals(self._records, self._uri, self._run_state)
        self._issuance = directory_issuance(
            root, self._uri, self._run_state, self._add_managed, self._publish, self._renewals
        )

    @property
    def root(self) -> Path:
        return self._root

    def describe(self) -> str:
        return self._uri

    def ticket_ring(self, local_file: Path) -> LocalRing:
        """The ring in ``local_file``: one node's (a directory is not shared by agents)."""
        return LocalRing(local_file)

    def data_keys(self) -> None:
        """None: private keys are kept as PEM files (mode 0600), not encrypted."""
        return None

    def bulk(self) -> None:
        """None: records are added one by one."""
        return None

    def fleet(self) -> DirectoryFleet:
        """The directory's format, and an empty board (:mod:`._fleet`)."""
        return DirectoryFleet(self._root, self._uri, self._run)

    def filter_snapshot(self) -> None:
        """None: positions in this store's change feed do not outlive the process.

        A snapshot could not be brought up to date at the next start, and the
        store scans its root at start anyway (the SAN index).
        """
        return None

    def issuance(self) -> Issuance:
        """This node's issuance roles (:mod:`._issuance`): not shared (``shared`` False).

        The account and the registrations in ``<root>/.certagent/``; leases,
        challenges, acknowledgements, heartbeats and limits in memory.
        """
        return self._issuance

    async def names(self) -> AsyncIterator[str]:
        """The names of every record, page by page (O(N); see Store.names)."""
        cursor: str | None = None
        while True:
            page = await self.list(cursor=cursor, limit=500)
            for record in page.records:
                for name in record.names:
                    yield name
            if page.cursor is None:
                return
            cursor = page.cursor

    @property
    def watch_mode(self) -> WatchMode:
        """``auto`` (inotify where it can be used) or ``poll`` (the ``dir_watch`` setting)."""
        return self._watch_mode

    @property
    def poll_interval(self) -> float:
        """Seconds between rescans while polling (the ``dir_poll_interval`` setting)."""
        return self._poll_interval

    @property
    def change_detection(self) -> str:
        """How this store notices changes now (``inotify (N directories)``, ``polling ...``)."""
        return "not started" if self._watcher is None else self._watcher.describe()

    async def ping(self) -> None:
        if not await self._run("checking root", functools.partial(os.path.isdir, self._root)):
            raise StoreUnavailable(f"{self._uri}: not a directory")

    async def close(self) -> None:
        """Stop watching and drop the threads; never waits for a read that is stuck."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # --- threads ---------------------------------------------------------------------

    async def _run(
        self, what: str | Callable[[], str], call: Callable[[], T], timeout: float | None = None
    ) -> T:
        """``call()`` on a worker thread; StoreUnavailable naming ``what`` after ``timeout`` s."""
        if self._pool is None:
            self._pool = DaemonExecutor(THREADS, "certagent-dir")
        pool = self._pool
        future = pool.submit(call)
        limit = self._read_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if future.done() and not future.cancelled():
                return future.result()  # finished as the time ran out
            subject = what() if callable(what) else what
            if future.cancel():
                raise StoreUnavailable(
                    f"{self._uri}: {subject}: no free file thread within {limit:.1f}s:"
                    f" {pool.running()} of {pool.max_workers} are busy, probably on reads"
                    " that do not finish; check the filesystem"
                ) from None
            raise StoreUnavailable(
                f"{self._uri}: {subject} did not finish within {limit:.1f}s; the filesystem"
                " may be hung (check the mount); other names are still answered"
            ) from None

    def _watch(self) -> DirWatcher:
        """The change watcher of the running event loop, started on first use."""
        loop = asyncio.get_running_loop()
        if self._watcher is None or self._watcher.loop is not loop:
            if self._watcher is not None:
                self._watcher.abandon()  # its event loop is gone
            self._watcher = DirWatcher(
                self._root,
                self._uri,
                self._run,
                mode=self._watch_mode,
                poll_interval=self._poll_interval,
            )
        return self._watcher

    async def _run_state(self, what: str, call: Callable[[], T]) -> T:
        """``call()`` on a worker thread, with a write's time limit (``.certagent/``)."""
        return await self._run(what, call, WRITE_TIMEOUT)

    def _publish(self, change: Change) -> None:
        """An issuance change into the feed, if this event loop's feed is running."""
        watcher = self._watcher
        if watcher is not None and watcher.loop is asyncio.get_running_loop():
            watcher.publish([change])

    def _touch(self, files: Iterable[str], lineages: Iterable[str] = ()) -> None:
        """The store wrote ``files``: the change feed looks at them now, whatever its mode."""
        watcher = self._watcher
        if watcher is not None and watcher.loop is asyncio.get_running_loop():
            watcher.touch(files=files, lineages=lineages)

    # --- lookups ---------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        found = await self.lookup_all(hostname)
        return found[0] if found else None

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """The certificate for ``hostname``: a file or lineage named after it, else the lineages
        whose certificate names it, then the same for its wildcard.

        At most one certificate, except for lineages found by name: the best
        ECDSA one and the best other one.  Cost: one thread hop, at most 6
        probes plus one read per lineage found; the SAN index lookup is O(1).
        """
        names = candidate_names(hostname)
        watcher = self._watch()
        found: builtins.list[_Found] = []
        for name in names:
            files = self._file_tiers(name)
            if watcher.ready:
                found = await self._read_tiers(name, [*files, *self._san_tier(name, watcher)])
            else:
                found = await self._read_tiers(name, files)
                if not found:
                    await watcher.wait_ready(INDEX_WAIT)
                    found = await self._read_tiers(name, self._san_tier(name, watcher))
            if found:
                break
        valid: builtins.list[StoredCertificate] = []
        for item in found:
            if item.refused is not None:
                log.warning("ignoring store record for %s: %s", names[0], item.refused)
                continue
            stored = check_record(
                self._uri, item.record_id, names[0], item.chain, item.key, item.ocsp
            )
            if stored is not None:
                valid.append(stored)
        ecdsa = [s for s in best_first(valid) if s.bundle.key_type.startswith("ECDSA")][:1]
        other = [s for s in best_first(valid) if not s.bundle.key_type.startswith("ECDSA")][:1]
        return (*ecdsa, *other)

    def _file_tiers(self, name: str) -> builtins.list[builtins.list[_Candidate]]:
        """The files named after ``name``, in lookup order: each one is a tier of its own."""
        stems = spellings(name)
        tiers = [[_Candidate(f"{s}.pem", self._root / f"{s}.pem", None)] for s in stems]
        return tiers + [[self._lineage(s)] for s in stems]

    def _san_tier(self, name: str, watcher: DirWatcher) -> builtins.list[builtins.list[_Candidate]]:
        """The lineages whose certificate names ``name`` (other than the one named after it)."""
        stems = spellings(name)
        dirs = [d for d in watcher.state.lineages_for(name) if d not in stems]
        if len(dirs) > MAX_LINEAGES_PER_NAME:
            log.warning(
                "%s: %d lineages name %s; reading only %s",
                self._uri,
                len(dirs),
                name,
                " ".join(dirs[:MAX_LINEAGES_PER_NAME]),
            )
        return [[self._lineage(d) for d in dirs[:MAX_LINEAGES_PER_NAME]]] if dirs else []

    def _lineage(self, dirname: str) -> _Candidate:
        live = self._root / LIVE / dirname
        return _Candidate(f"{LIVE}/{dirname}/{FULLCHAIN}", live / FULLCHAIN, live / PRIVKEY)

    async def _read_tiers(
        self, name: str, tiers: builtins.list[builtins.list[_Candidate]]
    ) -> builtins.list[_Found]:
        if not tiers:
            return []
        progress = [tiers[0][0].relative]
        return await self._run(
            functools.partial(_reading, progress, f" for {name}"),
            functools.partial(self._read_first_tier, tiers, progress),
        )

    def _read_first_tier(
        self, tiers: builtins.list[builtins.list[_Candidate]], progress: builtins.list[str]
    ) -> builtins.list[_Found]:
        """Every candidate of the first tier that has one that exists, read (worker thread)."""
        for tier in tiers:
            found = []
            for candidate in tier:
                progress.append(candidate.relative)
                item = self._read_candidate(candidate)
                if item is not None:
                    found.append(item)
            if found:
                return found
        if not os.path.isdir(self._root):
            raise StoreUnavailable(f"{self._uri}: not a directory")
        return []

    def _read_candidate(self, candidate: _Candidate) -> _Found | None:
        """The candidate's files; None if it does not exist."""
        relative = candidate.relative
        try:
            chain = self._read(relative, candidate.chain)
            if chain is None:
                return None
            key: bytes | None = None
            if candidate.key is not None:
                key = self._read(relative, candidate.key)  # None: the key is in the chain file
        except StoreCorrupt as exc:
            return _Found(relative, b"", None, refused=str(exc))
        record_id = relative
        if candidate.key is None:
            record_id = alias_target(self._root, relative) or relative
        try:
            ocsp = self._read(relative, ocsp_path(candidate.chain))
        except StoreCorrupt as exc:
            log.warning("%s: not stapling for %s: %s", self._uri, relative, exc)
            ocsp = None
        return _Found(record_id, chain, key, ocsp=ocsp)

    def _read(self, relative: str, path: Path) -> bytes | None:
        """One file, bounded; None if it does not exist."""
        shown = path.relative_to(self._root).as_posix()
        try:
            data, _ = _files.read_regular(path, f"{self._uri}: {shown}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreUnavailable(
                f"{self._uri}: cannot read {shown} (record {relative!r}): {exc.strerror}"
            ) from exc
        return data

    # --- records ---------------------------------------------------------------------

    async def get(self, cert_id: str) -> CertRecord | None:
        read = functools.partial(self._records.get, cert_id)
        return await self._run(f"reading {cert_id!r}", read)

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Records by id, read ``_LIST_CHUNK`` per thread call: O(N) reads with a filter."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if expiring_before is not None and expiring_before.utcoffset() is None:
            raise ValueError("expiring_before must be timezone-aware")
        after = decode_cursor(cursor) if cursor is not None else None
        pattern = hostname.normalise_pattern(name) if name is not None else None
        ids = await self._run(f"listing {self._root}", self._records.ids, SCAN_TIMEOUT)
        ids = [i for i in ids if after is None or i > after]
        records: builtins.list[CertRecord] = []
        for start in range(0, len(ids), _LIST_CHUNK):
            progress = [ids[start]]
            chunk = ids[start : start + _LIST_CHUNK]
            results = await self._run(
                functools.partial(_reading, progress),
                functools.partial(self._records.read_records, chunk, progress),
                SCAN_TIMEOUT,
            )
            for record in results:
                if isinstance(record, StoreCorrupt):
                    log.warning("listing %s: %s", self._uri, record)
                    continue
                if record is None:
                    continue  # removed since the listing
                if pattern is not None and pattern not in record.names:
                    continue
                if expiring_before is not None and not record.not_after < expiring_before:
                    continue
                if len(records) == limit:
                    return Page(tuple(records), encode_cursor(records[-1].id))
                records.append(record)
        return Page(tuple(records), None)

    async def put(self, bundle: CertBundle) -> str:
        """Write ``<root>/<name>.pem`` for every name (replacing); return the first one's path."""
        files = [f"{file_stem(name)}.pem" for name in bundle.names]
        await self._run(
            f"writing {files[0]!r}",
            functools.partial(self._records.write, files, bundle.pem),
            WRITE_TIMEOUT,
        )
        self._touch(files)
        log.info("stored certificate %s for %s in %s", files[0], " ".join(bundle.names), self._uri)
        return files[0]

    def _without_ocsp(self, write: Callable[..., T], cert_id: str, *args: object) -> T:
        """``write`` (a replace or delete), then drop the old certificate's OCSP response."""
        done = write(cert_id, *args)
        parsed = self._records.parse_id(cert_id)
        if parsed is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ocsp_path(parsed[1]))
        return done

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` for the record's leaf and write it beside it (``<file>.ocsp``)."""
        parsed = self._records.parse_id(cert_id)
        if parsed is None:
            raise NotFound(f"{self._uri}: no certificate {cert_id[:70]!r}")
        _, path, certbot = parsed

        def write() -> OcspFacts:
            chain = self._read(cert_id, path)
            if chain is None:
                raise NotFound(f"{self._uri}: no certificate {cert_id[:70]!r}")
            facts = check_for_chain(chain, der, now)
            sidecar = ocsp_path(path)
            try:
                _files.atomic_write(sidecar.parent, sidecar.name, der)
            except OSError as exc:
                raise StoreError(
                    f"{self._uri}: cannot write {sidecar.relative_to(self._root)}: {exc.strerror}"
                ) from exc
            return facts

        facts = await self._run(f"storing the OCSP response of {cert_id!r}", write, WRITE_TIMEOUT)
        if certbot:
            self._touch((), [path.parent.name])
        else:
            self._touch([cert_id])
        log.info("stored an OCSP response (%s) for %s in %s", facts.status, cert_id, self._uri)
        return facts

    async def add(self, bundle: CertBundle) -> CertRecord:
        return await self._add_managed(bundle, "")

    async def _add_managed(self, bundle: CertBundle, managed: str) -> CertRecord:
        """``add``; ``managed`` (``add_issued``) is kept in the record's mark (:mod:`._state`)."""
        record = await self._run(
            "adding a certificate",
            functools.partial(self._records.add, bundle, managed),
            WRITE_TIMEOUT,
        )
        self._touch([record.id, *(f"{file_stem(n)}.pem" for n in bundle.names)])
        log.info(
            "stored certificate %s for %s (sha256 %s%s) in %s",
            record.id,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            f", {managed}" if managed else "",
            self._uri,
        )
        return record

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        record, removed = await self._run(
            f"replacing {cert_id!r}",
            functools.partial(self._without_ocsp, self._records.replace, cert_id, bundle),
            WRITE_TIMEOUT,
        )
        self._touch([cert_id, *removed, *(f"{file_stem(n)}.pem" for n in bundle.names)])
        log.info(
            "replaced certificate %s for %s (sha256 %s) in %s",
            cert_id,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._uri,
        )
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        record, removed = await self._run(
            f"deleting {cert_id!r}",
            functools.partial(self._without_ocsp, self._records.delete, cert_id),
            WRITE_TIMEOUT,
        )
        self._touch([cert_id, *removed])
        names = " ".join(record.names)
        log.info("deleted certificate %s for %s from %s", cert_id, names, self._uri)
        await self._renewals.unschedule_orphans(record.names)
        return record

    # --- change feed -----------------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        """Changes after ``after``, waiting up to ``timeout`` s (no polling with inotify).

        Positions belong to this store object: one from another process (or
        one older than the last 4,096 changes) raises ChangesLost.  The first
        call waits for the first scan of root (StoreUnavailable if it fails).
        """
        watcher = self._watch()
        await watcher.wait_ready(INDEX_WAIT)
        if after is None:
            return (), watcher.log.position()
        seq = watcher.log.seq_of(after)
        await watcher.wait_changes(seq, timeout)
        return watcher.log.since(seq), watcher.log.position()
