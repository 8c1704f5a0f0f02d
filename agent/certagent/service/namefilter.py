"""Which names the store may hold: a Bloom filter, so floods of random names never reach it.

A flood of distinct made-up names (1,000 a second) costs one store lookup each
without this, and the negative cache cannot help: every name is new.  A plain
rate limit cannot tell the flood from a real new host.  The filter can: it
holds every name the store has (built at start from :meth:`Store.names`, kept
current from the change feed), answers "certainly not" for a name it never saw
and "maybe" for the rest (false positives ≈ ``FP_RATE``).  A name the store
deleted stays "maybe" until the next rebuild (after a lost change feed, or once
the names added since the build exceed the build's own count).

Memory: ≈ 9.6 bits per name at 1 % false positives (1.2 MB for 1,000,000
names); a query or an add is 7 bit probes over one BLAKE2b digest: O(1).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator

from certagent.certs import hostname
from certagent.certs.pem import CertBundle
from certagent.errors import AgentError
from certagent.store.base import CertRecord, Reader, Store, Writer
from certagent.store.view import StoreView

log = logging.getLogger(__name__)

FP_RATE = 0.01
MIN_CAPACITY = 1024
# Names added to a filter between two yields to the event loop while building.
CHUNK = 5_000


class BloomFilter:
    """Bits for about ``capacity`` names at ``fp_rate`` false positives."""

    def __init__(self, capacity: int, fp_rate: float = FP_RATE) -> None:
        capacity = max(MIN_CAPACITY, capacity)
        self.bits = max(64, math.ceil(-capacity * math.log(fp_rate) / math.log(2) ** 2))
        self.probes = max(1, round(self.bits / capacity * math.log(2)))
        self.capacity = capacity
        self.count = 0
        self._array = bytearray((self.bits + 7) // 8)

    def _positions(self, name: str) -> list[int]:
        digest = hashlib.blake2b(name.encode("ascii"), digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "little")
        h2 = int.from_bytes(digest[8:], "little") | 1
        return [(h1 + i * h2) % self.bits for i in range(self.probes)]

    def add(self, name: str) -> None:
        for p in self._positions(name):
            self._array[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def __contains__(self, name: str) -> bool:
        return all(self._array[p >> 3] & (1 << (p & 7)) for p in self._positions(name))

    @property
    def memory(self) -> int:
        return len(self._array)


class NameFilter:
    """The store's names as a Bloom filter; admits everything until it has been built."""

    def __init__(self) -> None:
        self._filter: BloomFilter | None = None
        self._built_with = 0
        self.rebuilds = 0
        self.wanted = asyncio.Event()  # set when a (re)build is due
        self.wanted.set()
        self._pending: list[str] | None = None  # names added while a build runs

    @property
    def ready(self) -> bool:
        return self._filter is not None

    def may_hold(self, name: str) -> bool:
        """False only if the store certainly has no record for ``name`` (or its wildcard)."""
        bloom = self._filter
        if bloom is None:
            return True
        if name in bloom:
            return True
        wildcard = hostname.wildcard_for(name)
        return wildcard is not None and wildcard in bloom

    def exact(self, name: str) -> bool:
        """Whether the store may hold a record under ``name`` itself (not its wildcard)."""
        return self._filter is None or name in self._filter

    def add(self, names: tuple[str, ...]) -> None:
        """Names a write added (from the change feed)."""
        if self._pending is not None:
            self._pending.extend(names)  # a build is running: add them to the new filter too
        if self._filter is None:
            return
        for name in names:
            self._filter.add(name)
        if self._filter.count > 2 * max(self._built_with, MIN_CAPACITY):
            self.invalidate()  # over capacity: admit everything until the next build

    def invalidate(self) -> None:
        """Forget the filter (the change feed lost writes, or it is outgrown); rebuild it."""
        self._filter = None
        self.wanted.set()

    def stale(self) -> bool:
        """Whether a rebuild is due (never built, outgrown or invalidated)."""
        return self._filter is None

    async def build(self, names: AsyncIterator[str], expected: int = 0) -> None:
        """Fill a new filter from ``names`` (the whole store), then swap it in.

        Yields to the event loop every CHUNK names, so a million names do not
        stall the agent; until the swap the previous filter (or none) answers.
        """
        started = time.monotonic()
        self._pending = []
        try:
            collected: list[str] = []
            async for name in names:
                collected.append(name)
                if len(collected) % CHUNK == 0:
                    await asyncio.sleep(0)
            bloom = BloomFilter(max(expected, 2 * len(collected)))
            for i, name in enumerate(collected):
                bloom.add(name)
                if i % CHUNK == CHUNK - 1:
                    await asyncio.sleep(0)
            for name in self._pending:
                bloom.add(name)
        finally:
            self._pending = None
        self._filter, self._built_with = bloom, len(collected)
        self.wanted.clear()
        self.rebuilds += 1
        log.info(
            "name filter: %d names of the store in %.1f s (%d KiB, %d probes)",
            len(collected),
            time.monotonic() - started,
            bloom.memory // 1024,
            bloom.probes,
        )


async def keep_built(names_filter: NameFilter, store: Reader, stop: asyncio.Event) -> None:
    """Build the filter at start and whenever it goes stale; nothing runs in between.

    A store that is down is retried with a growing delay (at most a minute)
    until the build succeeds; meanwhile every name is admitted.
    """
    delay = 1.0
    while not stop.is_set():
        if not names_filter.stale():
            waiter = asyncio.ensure_future(names_filter.wanted.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            continue
        try:
            await names_filter.build(store.names())
            delay = 1.0
        except AgentError as exc:
            log.warning("name filter: cannot read the store's names yet: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 60.0)


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
