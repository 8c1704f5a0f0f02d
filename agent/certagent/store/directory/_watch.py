"""The directory store's view of its root, kept current: inotify, or polling as a fallback.

:class:`DirWatcher` builds :class:`~certagent.store.directory._index.DirState` (the
record files, the certbot lineages and their SAN index) once, in chunks on
worker threads, then keeps it current and turns every difference into a
:class:`~certagent.store.base.Change` in its :class:`ChangeLog`:

* **inotify** (the default on Linux): one watch on root, one on ``live/`` and
  one on each ``live/<lineage>/`` (N + 2 watches, none on ``archive/``).  The
  event loop reads the events (``loop.add_reader``); nothing runs at rest.  A
  burst of events is coalesced (quiet for 50 ms, at most 0.5 s) and only the
  files and lineages they name are looked at again: certbot's renewal (new
  ``archive/`` files, then ``live/`` symlinks re-pointed, unlink + symlink)
  shows up as events in ``live/<lineage>/``.  A queue overflow or a lost root
  means one full rescan.
* **polling** every ``poll_interval`` s, when inotify cannot be trusted or used:
  ``dir_watch = "poll"``, a network filesystem (``_scan.remote_filesystem``), no
  inotify on this system, or the watch limit (``fs.inotify.max_user_watches``)
  reached.  One WARNING says why.  A full rescan costs about 2 ``stat`` per
  lineage and file (0.25-0.4 s of CPU for 20,000 lineages); the wait between
  two is at least 20 times the last one took.

A rescan is O(N) ``stat`` calls, plus one certificate parse (≈15 µs) per
lineage that is new or changed; an event costs O(1) files.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from certagent.errors import StoreUnavailable
from certagent.store.base import Change
from certagent.store.directory import _inotify, _scan
from certagent.store.directory._index import (
    FULLCHAIN,
    LIVE,
    PRIVKEY,
    ChangeLog,
    DirState,
    name_of_stem,
)
from certagent.store.directory._scan import file_entries, lineage_entries, list_live, list_root

__all__ = ["CHUNK", "SCAN_TIMEOUT", "DirWatcher", "Run", "WatchMode"]

OCSP_FILE = f"{FULLCHAIN}.ocsp"  # a lineage's OCSP response to staple

log = logging.getLogger(__name__)

T = TypeVar("T")
WatchMode = Literal["auto", "poll"]


class Run(Protocol):
    """The store's way to run a blocking call on its threads with a timeout.

    ``await run(what, call, timeout)``; StoreUnavailable naming ``what`` on timeout.
    """

    def __call__(self, what: str, call: Callable[[], T], timeout: float, /) -> Awaitable[T]: ...


#: Files or lineages looked at per worker-thread call while scanning.
CHUNK = 256
#: How long one chunk of a scan may take before the scan counts as failed (s).
SCAN_TIMEOUT = 30.0
QUIET = 0.05
MAX_DELAY = 0.5
#: While polling, the wait between two rescans is at least this many times a rescan.
POLL_SHARE = 20
ROOT_TAG = "."
_SELF = _inotify.IN_DELETE_SELF | _inotify.IN_MOVE_SELF | _inotify.IN_IGNORED


@dataclass
class _Dirty:
    files: set[str] = field(default_factory=set)
    lineages: set[str] = field(default_factory=set)
    live: bool = False  # list live/ again
    full: bool = False  # rescan everything

    def __bool__(self) -> bool:
        return bool(self.files or self.lineages or self.live or self.full)


class DirWatcher:
    """Keeps one root's :class:`DirState` current and logs its changes.  One per event loop."""

    def __init__(
        self, root: Path, uri: str, run: Run, *, mode: WatchMode, poll_interval: float
    ) -> None:
        self.root = root
        self.uri = uri
        self.state = DirState()
        self.log = ChangeLog(uri)
        self.mode = mode
        self.poll_interval = poll_interval
        self.poll_reason: str | None = "dir_watch is poll" if mode == "poll" else None
        self._run_blocking = run
        self._loop = asyncio.get_running_loop()
        self._inotify: _inotify.Inotify | None = None
        self._dirty = _Dirty()
        self._wake = asyncio.Event()
        self._advanced = asyncio.Event()
        self._ready = asyncio.Event()
        self._error: StoreUnavailable | None = None
        self._warned: str | None = None
        self._built = False  # the first full scan is done: later differences are changes
        self._last_event = 0.0
        self._scan_seconds = 0.0  # how long the last full scan took
        self._task = self._loop.create_task(self._main(), name=f"watch {uri}")
        self._task.add_done_callback(self._ended)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def watching(self) -> bool:
        """True while inotify reports the changes (False: polling, or not started yet)."""
        return self._inotify is not None

    def describe(self) -> str:
        """How changes are noticed now: ``inotify``, ``polling every 5.0s (why)``, ..."""
        if self._inotify is not None:
            return f"inotify ({len(self._inotify)} directories)"
        if self.poll_reason is not None:
            return f"polling every {self.poll_interval:.1f}s ({self.poll_reason})"
        return "starting" if self._error is None else f"failing ({self._error})"

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the first full scan; StoreUnavailable if it failed or takes longer."""
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            raise StoreUnavailable(
                f"{self.uri}: the index of certbot lineages is still being built after"
                f" {timeout:.0f}s ({len(self.state.lineages)} so far); try again shortly"
            ) from None
        if self._error is not None:
            raise self._error

    async def wait_changes(self, seq: int, timeout: float) -> None:
        """Return once the log is past ``seq``, or after ``timeout`` s."""
        if self.log.seq > seq or timeout <= 0:
            return
        advanced = self._advanced
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await advanced.wait()

    def touch(self, files: Iterable[str] = (), lineages: Iterable[str] = ()) -> None:
        """Look at these files / lineages soon (the store just wrote them)."""
        self._dirty.files.update(files)
        self._dirty.lineages.update(lineages)
        if self._dirty:
            self._wake.set()

    def publish(self, changes: Sequence[Change]) -> None:
        """Changes the store made that no file shows (issuance): into the log as they are."""
        self._emit(list(changes), False)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._drop_inotify()

    def abandon(self) -> None:
        """Release the inotify descriptor of a watcher whose event loop is gone."""
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    # --- main loop -----------------------------------------------------------------------

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The main loop only ends when cancelled; anything else is a bug: say so, fail lookups."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.critical("%s: the change watcher stopped", self.uri, exc_info=exc)
        self._error = StoreUnavailable(
            f"{self.uri}: the change watcher stopped ({exc!r}); restart the agent"
        )
        self._ready.set()
        self._drop_inotify()

    async def _main(self) -> None:
        while True:
            try:
                if self._inotify is None and self.poll_reason is None:
                    await self._arm()
                first, started = not self._built, self._loop.time()
                await self._rescan()
                if not first:  # the first one also reads every certificate: not a rescan
                    self._scan_seconds = self._loop.time() - started
                if first:
                    log.info(
                        "%s: indexed %d certbot lineages (%d names) and %d files in %.2fs; %s",
                        self.uri,
                        len(self.state.lineages),
                        self.state.names_indexed(),
                        len(self.state.files),
                        self._loop.time() - started,
                        "watching with inotify" if self._inotify else "polling",
                    )
                self._error = None
                self._ready.set()
                if self._inotify is not None:
                    await self._follow()
                else:
                    await self._poll()
            except _inotify.WatchLimit as exc:
                self._fall_back(str(exc.strerror))
            except StoreUnavailable as exc:
                if str(exc) != self._warned:
                    log.warning("%s; retrying every %.1fs", exc, self.poll_interval)
                    self._warned = str(exc)
                self._error = exc
                self._ready.set()
                self._drop_inotify()
                await self._nap(self.poll_interval)

    async def _arm(self) -> None:
        mountinfo = await self._blocking("reading /proc/self/mountinfo", _scan.read_mountinfo)
        kind = _scan.remote_filesystem(self.root, mountinfo)
        if kind is not None:
            self._fall_back(f"{self.root} is on a {kind} filesystem, whose changes made"
                            " elsewhere inotify does not report")
            return
        try:
            inotify = _inotify.open_inotify()
        except _inotify.InotifyUnavailable as exc:
            self._fall_back(f"inotify is unavailable: {exc.strerror}")
            return
        try:
            await self._blocking(
                f"watching {self.root}", functools.partial(inotify.add_watch, self.root, ROOT_TAG)
            )
        except _inotify.WatchLimit:
            inotify.close()
            raise
        except OSError as exc:
            inotify.close()
            raise StoreUnavailable(
                f"{self.uri}: cannot watch the directory: {exc.strerror}"
            ) from exc
        except BaseException:
            inotify.close()
            raise
        self._loop.add_reader(inotify.fileno(), self._on_events)
        self._inotify = inotify

    def _fall_back(self, reason: str) -> None:
        self._drop_inotify()
        self.poll_reason = reason
        log.warning(
            "%s: not watching with inotify: %s; polling every %.1fs instead (dir_poll_interval)",
            self.uri,
            reason,
            self.poll_interval,
        )

    def _drop_inotify(self) -> None:
        if self._inotify is not None:
            self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None

    async def _follow(self) -> None:
        """Apply events as they come; return when a full rescan is needed."""
        while True:
            await self._wake.wait()
            first = self._loop.time()
            while True:  # coalesce a burst: quiet for QUIET, at most MAX_DELAY
                now = self._loop.time()
                wait = min(self._last_event + QUIET, first + MAX_DELAY) - now
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            self._wake.clear()
            dirty, self._dirty = self._dirty, _Dirty()
            if dirty.full or self._inotify is None:
                return
            await self._refresh(dirty)

    async def _poll(self) -> None:
        """Wait until the next rescan (applying the store's own writes meanwhile), then return.

        ``poll_interval``, stretched so that rescans take at most 1/POLL_SHARE of the
        time: a slow filesystem is not scanned back to back.
        """
        deadline = self._loop.time() + max(self.poll_interval, POLL_SHARE * self._scan_seconds)
        while (left := deadline - self._loop.time()) > 0:
            await self._nap(left)
            if self._dirty:
                self._wake.clear()
                dirty, self._dirty = self._dirty, _Dirty()
                await self._refresh(dirty)

    async def _nap(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    def _on_events(self) -> None:
        assert self._inotify is not None
        dirty = self._dirty
        try:
            events = self._inotify.read()
        except OSError as exc:
            log.warning("%s: reading inotify events failed (%s); watching again", self.uri, exc)
            events = []
            dirty.full = True
            self._drop_inotify()
        for event in events:
            tag, name, mask = event.tag, event.name, event.mask
            if mask & _inotify.IN_Q_OVERFLOW:
                log.warning("%s: inotify queue overflow; rescanning everything", self.uri)
                dirty.full = True
            elif tag == ROOT_TAG:
                if mask & _SELF:
                    dirty.full = True  # root moved or deleted: arm again, or fail
                    self._drop_inotify()
                    break
                if name == LIVE:
                    dirty.live = True
                elif name.endswith(".pem") and name_of_stem(name[:-4]) is not None:
                    dirty.files.add(name)
                elif name.endswith(".pem.ocsp") and name_of_stem(name[:-9]) is not None:
                    dirty.files.add(name[:-5])  # the record whose response changed
            elif tag == LIVE:
                if mask & _SELF:
                    dirty.live = True
                elif name_of_stem(name) is not None:
                    dirty.lineages.add(name)
            elif tag is not None and (not name or name in (FULLCHAIN, PRIVKEY, OCSP_FILE)):
                dirty.lineages.add(tag[len(LIVE) + 1 :])
        if dirty:
            self._last_event = self._loop.time()
            self._wake.set()

    # --- scans ---------------------------------------------------------------------------

    async def _blocking(self, what: str, call: Callable[[], T], timeout: float = SCAN_TIMEOUT) -> T:
        return await self._run_blocking(what, call, timeout)

    def _emit(self, changes: list[Change], baseline: bool) -> None:
        if baseline or not changes:
            return
        self.log.append(changes)
        self._advanced.set()
        self._advanced = asyncio.Event()

    async def _rescan(self) -> None:
        """Look at every file and lineage; the first time, build the state without changes."""
        baseline = not self._built
        root, uri = self.root, self.uri
        filenames = await self._blocking(f"listing {root}", functools.partial(list_root, root, uri))
        for start in range(0, len(filenames), CHUNK):
            chunk = filenames[start : start + CHUNK]
            found = await self._blocking(
                f"looking at files in {root}", functools.partial(file_entries, root, chunk)
            )
            self._emit(self.state.update_files(found), baseline)
        gone = set(self.state.files) - set(filenames)
        self._emit(self.state.update_files(dict.fromkeys(gone)), baseline)
        dirnames = await self._blocking(
            f"listing {root / LIVE}", functools.partial(list_live, root, uri, self._inotify)
        )
        await self._lineages(dirnames, baseline)
        gone = set(self.state.lineages) - set(dirnames)
        self._emit(self.state.update_lineages(dict.fromkeys(gone)), baseline)
        self._built = True

    async def _lineages(self, dirnames: Sequence[str], baseline: bool) -> None:
        for start in range(0, len(dirnames), CHUNK):
            chunk = dirnames[start : start + CHUNK]
            known = {d: self.state.lineages.get(d) for d in chunk}
            look = functools.partial(
                lineage_entries, self.root, self.uri, chunk, known, self._inotify
            )
            found = await self._blocking(f"looking at lineages in {self.root / LIVE}", look)
            self._emit(self.state.update_lineages(found), baseline)

    async def _refresh(self, dirty: _Dirty) -> None:
        """Look again at what the events named."""
        root, uri = self.root, self.uri
        files = set(dirty.files)
        for filename in dirty.files:
            files.update(self.state.aliases_of(filename))
        if files:
            found = await self._blocking(
                f"looking at files in {root}", functools.partial(file_entries, root, sorted(files))
            )
            self._emit(self.state.update_files(found), False)
        lineages = set(dirty.lineages)
        if dirty.live:
            dirnames = await self._blocking(
                f"listing {root / LIVE}", functools.partial(list_live, root, uri, self._inotify)
            )
            present = set(dirnames)
            self._emit(
                self.state.update_lineages(dict.fromkeys(set(self.state.lineages) - present)),
                False,
            )
            lineages.update(present - set(self.state.lineages))
        await self._lineages(sorted(lineages), False)
