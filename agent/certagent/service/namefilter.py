"""Which names the store may hold: a Bloom filter, so floods of random names never reach it.

A flood of distinct made-up names (1,000 a second) costs one store lookup each
without this, and the negative cache cannot help: every name is new.  A plain
rate limit cannot tell the flood from a real new host.  The filter can: it
holds every name the store has, answers "certainly not" for a name it never saw
and "maybe" for the rest (false positives ≤ ``FP_RATE`` while it holds no more
than its capacity).  A name the store deleted stays "maybe" until the next rebuild.

Start in O(filter size), not O(N): :func:`keep_built` loads the snapshot the
agents keep in the store (:meth:`Store.filter_snapshot`, :mod:`certagent.service.bloom`)
and replays the change feed from the position it reflects.  It reads every name
(:meth:`Store.names`, O(N)) only when there is no snapshot, it is corrupt, the
feed no longer reaches back to its position, or the filter is outgrown; then in
the background, the previous filter (or none) answering meanwhile.  Until a
filter is ready, store lookups are bounded by the ensure path
(:data:`certagent.service.flood.UNFILTERED_RATE`).  :func:`keep_saved` writes
the snapshot after a rebuild and then only when enough has changed.

Memory: ≈ 19 bits per stored name (sized for twice the store's names at
1 % false positives: 2.4 MB for 1,000,000 names); a query or an add is 7 bit
probes over one BLAKE2b digest: O(1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from certagent.certs import hostname
from certagent.certs.pem import CertBundle
from certagent.errors import AgentError, ChangesLost, StoreCorrupt
from certagent.service import bloom
from certagent.service.bloom import FP_RATE, MIN_CAPACITY, BloomFilter
from certagent.store.base import CertRecord, ChangeFeed, SnapshotSlot, Store, Writer
from certagent.store.view import StoreView

__all__ = [
    "FP_RATE",
    "MIN_CAPACITY",
    "BloomFilter",
    "NameFilter",
    "NotingStore",
    "NotingWriter",
    "keep_built",
    "keep_saved",
]

log = logging.getLogger(__name__)

#: Names added to a filter between two yields to the event loop while building.
CHUNK = 5_000
#: A filter is sized for this many times the names it is built with.
HEADROOM = 2
#: Names added (a put each) after which the snapshot is worth writing again ...
SAVE_AFTER_ADDS = 10_000
#: ... or after this many seconds, if anything was added at all.
SAVE_AFTER_SECONDS = 6 * 3600.0
#: A snapshot another agent wrote less than this many seconds ago is left as it is.
SAVE_MIN_AGE = 300.0
#: Seconds between two checks of whether the snapshot is worth writing.
SAVE_CHECK = 60.0
#: Names kept for the next filter while none is ready, at most.
PENDING_MAX = 1_000_000
#: Seconds a build waits for the change feed's follower before it goes ahead without it.
FOLLOW_WAIT = 10.0


class NameFilter:
    """The store's names as a Bloom filter; admits everything until it is ready.

    ``position`` is the change-feed position the filter is complete up to: the
    change feed's follower (:class:`~certagent.service.live.LiveUpdater`) adds
    the names of every ``put`` and then reports its position (:meth:`followed`).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._filter: BloomFilter | None = None
        self._clock = clock
        self.rebuilds = 0
        self.wanted = asyncio.Event()  # set when a (re)build is due
        self.wanted.set()
        #: set once the feed's follower has a position (and again after it lost one)
        self.following = asyncio.Event()
        self._live_position: str | None = None
        self.position: str | None = None
        self._pending: list[str] | None = []  # names added while no filter is ready
        self._generation = 0  # + 1 on every invalidation: a build begun before is discarded
        #: how the filter came to be, for status and the log
        self.source = "not built yet"
        self.adds_since_save = 0
        self.saved_at = clock()
        self.saves = 0
        self.save_due = asyncio.Event()

    @property
    def ready(self) -> bool:
        return self._filter is not None

    def may_hold(self, name: str) -> bool:
        """False only if the store certainly has no record for ``name`` (or its wildcard)."""
        bloom_filter = self._filter
        if bloom_filter is None:
            return True
        if name in bloom_filter:
            return True
        wildcard = hostname.wildcard_for(name)
        return wildcard is not None and wildcard in bloom_filter

    def exact(self, name: str) -> bool:
        """Whether the store may hold a record under ``name`` itself (not its wildcard)."""
        return self._filter is None or name in self._filter

    def add(self, names: tuple[str, ...]) -> None:
        """Names a write added (from the change feed, or a write through this agent)."""
        self.adds_since_save += 1
        if self._pending is not None and len(self._pending) < PENDING_MAX:
            self._pending.extend(names)  # a build runs: add them to the new filter too
        if self._filter is None:
            return
        for name in names:
            self._filter.add(name)
        if self._filter.full and not self.wanted.is_set():
            log.info(
                "name filter: %d names, more than the %d it was sized for; rebuilding",
                self._filter.count,
                self._filter.capacity,
            )
            self.wanted.set()  # outgrown: rebuild, this one answers meanwhile

    def followed(self, position: str) -> None:
        """The feed's follower has added every change up to ``position``."""
        self._live_position = position
        if self._filter is not None:
            self.position = position
        self.following.set()

    def invalidate(self) -> None:
        """Forget the filter (the change feed lost writes); rebuild it, admitting meanwhile."""
        self._filter = None
        self.position = None
        self._pending = []
        self._generation += 1
        self.following.clear()
        self.wanted.set()

    def stale(self) -> bool:
        """Whether a rebuild is due (never built, outgrown or invalidated)."""
        return self.wanted.is_set()

    def status(self) -> dict[str, Any]:
        current = self._filter
        return {
            "ready": current is not None,
            "rebuilds": self.rebuilds,
            "source": self.source,
            "position": self.position,
            "names": None if current is None else current.count,
            "capacity": None if current is None else current.capacity,
            "bytes": None if current is None else current.memory,
            "snapshot_saves": self.saves,
        }

    def _swap(self, new: BloomFilter, source: str, generation: int) -> bool:
        """Make ``new`` (plus what was added meanwhile) the filter; False if invalidated since."""
        if generation != self._generation:
            log.info("name filter: the change feed lost writes meanwhile; not using %s", source)
            return False
        for name in self._pending or ():
            new.add(name)
        self._pending = None
        self._filter = new
        self.position = self._live_position
        self.source = source
        if new.full:
            log.info("name filter: %s holds more names than it was sized for", source)
        else:
            self.wanted.clear()
        return True

    async def build(self, names: AsyncIterator[str], expected: int = 0) -> None:
        """Fill a new filter from ``names`` (the whole store), then swap it in.

        Yields to the event loop every CHUNK names, so a million names do not
        stall the agent; until the swap the previous filter (or none) answers.
        """
        started = time.monotonic()
        generation = self._generation
        if self._pending is None:
            self._pending = []
        collected: list[str] = []
        async for name in names:
            collected.append(name)
            if len(collected) % CHUNK == 0:
                await asyncio.sleep(0)
        new = BloomFilter(max(expected, HEADROOM * len(collected)))
        for i, name in enumerate(collected):
            new.add(name)
            if i % CHUNK == CHUNK - 1:
                await asyncio.sleep(0)
        del collected
        if not self._swap(new, f"built from the store: {new.count} names", generation):
            return
        self.rebuilds += 1
        self.save_due.set()
        log.info(
            "name filter: %d names of the store in %.1f s (%d KiB, %d probes)",
            new.count,
            time.monotonic() - started,
            new.memory // 1024,
            new.probes,
        )

    async def load(self, slot: SnapshotSlot, feed: ChangeFeed) -> bool:
        """Load the snapshot in ``slot`` and replay the feed from its position.

        False (the caller rebuilds) if there is none, it does not validate, or
        the feed no longer holds its position.  O(filter size + changes since).
        """
        started = time.monotonic()
        head = await slot.read(bloom.HEADER_SIZE)
        if head is None:
            log.info("name filter: no snapshot in %s yet", slot.describe())
            return False
        try:
            bloom.decode_header(head)  # a wrong one is refused before it is read whole
            data = await slot.read()
            if data is None:
                return False
            snapshot = bloom.decode(data)
        except StoreCorrupt as exc:
            log.warning("name filter: ignoring the snapshot in %s: %s", slot.describe(), exc)
            return False
        del data
        try:  # replay up to at least where the follower starts
            await asyncio.wait_for(self.following.wait(), FOLLOW_WAIT)
        except TimeoutError:
            log.warning("name filter: the change feed is not followed; not using the snapshot")
            return False
        generation = self._generation
        if self._pending is None:
            self._pending = []
        position, replayed = snapshot.position, 0
        try:
            while True:
                changes, after = await feed.changes(position, 0)
                for change in changes:
                    if change.kind == "put":
                        for name in change.names:
                            snapshot.bloom.add(name)
                        replayed += 1
                if not changes or after == position:
                    break
                position = after
        except ChangesLost as exc:
            log.info(
                "name filter: the snapshot at %s is older than the change feed keeps (%s)",
                snapshot.position,
                exc,
            )
            return False
        source = f"loaded snapshot at {snapshot.position}, replayed {replayed} changes"
        if not self._swap(snapshot.bloom, source, generation):
            return False
        self.saved_at = float(snapshot.written)
        self.adds_since_save = replayed
        log.info(
            "name filter: %s in %.2f s (%d names, %d KiB)",
            source,
            time.monotonic() - started,
            snapshot.bloom.count,
            snapshot.bloom.memory // 1024,
        )
        return True

    def worth_saving(self) -> bool:
        """Whether the snapshot should be written: after a build, or once enough changed."""
        if self._filter is None or self.position is None:
            return False
        if self.save_due.is_set():
            return True
        if self.adds_since_save >= max(SAVE_AFTER_ADDS, self._filter.count // 100):
            return True
        return self.adds_since_save > 0 and self._clock() - self.saved_at >= SAVE_AFTER_SECONDS

    async def save(self, slot: SnapshotSlot) -> bool:
        """Write the snapshot unless another agent wrote one moments ago; True if written.

        O(filter size), in one write; the bits are copied before any await.
        """
        current, position = self._filter, self.position
        if current is None or position is None:
            return False
        now = self._clock()
        if not self.save_due.is_set():
            head = await slot.read(bloom.HEADER_SIZE)
            with contextlib.suppress(StoreCorrupt):
                if head is not None and now - bloom.decode_header(head).written < SAVE_MIN_AGE:
                    self.adds_since_save, self.saved_at = 0, now
                    return False
        data = bloom.encode(current, position, int(now))
        self.adds_since_save, self.saved_at = 0, now
        self.save_due.clear()
        await slot.write(data)
        self.saves += 1
        log.info(
            "name filter: snapshot at %s written to %s (%d KiB)",
            position,
            slot.describe(),
            len(data) // 1024,
        )
        return True


async def _wait_either(event: asyncio.Event, stop: asyncio.Event, timeout: float | None) -> None:
    waiter = asyncio.ensure_future(event.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    stopper.cancel()


async def keep_built(names_filter: NameFilter, store: Store, stop: asyncio.Event) -> None:
    """Have a filter: the snapshot at start, else (and whenever it goes stale) a rebuild.

    A store that is down is retried with a growing delay (at most a minute)
    until it answers; meanwhile every name is admitted (within the ensure
    path's budget for an agent without a filter).
    """
    slot = store.filter_snapshot()
    try_snapshot = slot is not None
    delay = 1.0
    while not stop.is_set():
        if not names_filter.stale():
            await _wait_either(names_filter.wanted, stop, None)
            continue
        try:
            loaded = False
            if try_snapshot and slot is not None:
                loaded = await names_filter.load(slot, store)
                try_snapshot = False  # once: a later rebuild is due to a stale filter
            if not loaded or names_filter.stale():
                # the follower's position first, so that no write falls between the two;
                # without a follower (a feed that fails) the filter is built all the same
                await _wait_either(names_filter.following, stop, FOLLOW_WAIT)
                await names_filter.build(store.names())
            delay = 1.0
        except AgentError as exc:
            log.warning("name filter: cannot read the store's names yet: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 60.0)


async def keep_saved(
    names_filter: NameFilter, slot: SnapshotSlot, stop: asyncio.Event, every: float = SAVE_CHECK
) -> None:
    """Write the snapshot after each build, then when enough changed (bounded writes)."""
    while not stop.is_set():
        await _wait_either(names_filter.save_due, stop, every)
        if stop.is_set() or not names_filter.worth_saving():
            continue
        try:
            await names_filter.save(slot)
        except AgentError as exc:
            log.warning("name filter: cannot write the snapshot: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)


class NotingWriter:
    """A :class:`~certagent.store.base.Writer` adding the names of its writes to a name filter.

    The names go in before the write: a host uploaded on this node passes the
    filter on its very first connection, without waiting for the change feed
    to come back (a write that then fails leaves a harmless "maybe").
    """

    def __init__(self, writer: Writer, names: NameFilter) -> None:
        self._writer = writer
        self._names = names

    async def put(self, bundle: CertBundle) -> str:
        self._names.add(bundle.names)
        return await self._writer.put(bundle)

    async def add(self, bundle: CertBundle) -> CertRecord:
        self._names.add(bundle.names)
        return await self._writer.add(bundle)

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        self._names.add(bundle.names)
        return await self._writer.replace(cert_id, bundle)

    async def delete(self, cert_id: str) -> CertRecord:
        return await self._writer.delete(cert_id)


class NotingStore(StoreView):
    """``store`` whose writes go through a :class:`NotingWriter`; every other role its own.

    The REST API writes through it.
    """

    def __init__(self, store: Store, names: NameFilter) -> None:
        super().__init__(store, writer=NotingWriter(store, names))
