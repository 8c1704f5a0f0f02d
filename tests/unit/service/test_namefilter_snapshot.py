"""The name filter's start from a snapshot: loaded and replayed, rebuilt only when it must be."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from certagent.errors import ChangesLost
from certagent.service import bloom, namefilter
from certagent.service.namefilter import NameFilter, keep_built, keep_saved
from certagent.store.base import Change
from tests.memstore import MemorySlot


class FeedStore:
    """Names, a change feed whose positions below ``kept_from`` are trimmed, a snapshot slot."""

    def __init__(self, names: list[str]) -> None:
        self.stored = list(names)
        self.events: list[Change] = []
        self.kept_from = 0
        self.names_reads = 0
        self.slot = MemorySlot()

    def put(self, *names: str) -> None:
        self.stored.extend(names)
        self.events.append(Change("put", f"id{len(self.events)}", names))

    async def names(self) -> AsyncIterator[str]:
        self.names_reads += 1
        for name in list(self.stored):
            yield name

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        if after is None:
            return (), str(len(self.events))
        if int(after) < self.kept_from:
            raise ChangesLost(f"memory://: {after} was trimmed")
        return tuple(self.events[int(after) : int(after) + 2]), str(
            min(len(self.events), int(after) + 2)
        )

    def filter_snapshot(self) -> MemorySlot:
        return self.slot


async def started(store: FeedStore, names: NameFilter) -> tuple[asyncio.Event, list[Any]]:
    """keep_built and keep_saved running against ``store``, the follower at the feed's end."""
    stop = asyncio.Event()
    names.followed(str(len(store.events)))
    tasks = [
        asyncio.create_task(keep_built(names, store, stop)),  # type: ignore[arg-type]
        asyncio.create_task(keep_saved(names, store.slot, stop, every=0.01)),
    ]
    async with asyncio.timeout(5):
        while not names.ready or names.stale():
            await asyncio.sleep(0.005)
    return stop, tasks


async def stopped(stop: asyncio.Event, tasks: list[Any]) -> None:
    stop.set()
    await asyncio.gather(*tasks)


STORE = [f"h{i}.example.test" for i in range(2000)]


async def test_a_second_agent_starts_from_the_first_ones_snapshot_without_reading_names() -> None:
    store = FeedStore(STORE)
    first = NameFilter()
    stop, tasks = await started(store, first)
    async with asyncio.timeout(5):
        while store.slot.data is None:
            await asyncio.sleep(0.005)
    await stopped(stop, tasks)
    assert store.names_reads == 1 and first.source == "built from the store: 2000 names"
    assert bloom.decode(store.slot.data).position == "0"
    # written after the snapshot: the next agent replays them from the feed
    store.put("new1.example.test", "*.wild.test")
    store.put("new2.example.test")
    store.put("new3.example.test")
    second = NameFilter()
    stop, tasks = await started(store, second)
    await stopped(stop, tasks)
    assert store.names_reads == 1  # not read again
    assert second.source == "loaded snapshot at 0, replayed 3 changes"
    assert second.status()["position"] == "3" and second.status()["names"] == 2004
    assert all(second.may_hold(n) for n in [*STORE, "new2.example.test", "x.wild.test"])
    assert not second.may_hold("stranger.example.test")
    assert store.slot.writes == 1  # three changes are not worth a write


async def test_a_snapshot_older_than_the_feed_keeps_is_rebuilt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FeedStore(STORE)
    store.slot.data = bloom.encode(bloom.BloomFilter(4000), "0", 1)
    store.put("new.example.test")
    store.kept_from = 1  # the feed no longer holds position 0
    names = NameFilter()
    with caplog.at_level(logging.INFO, logger="certagent.service.namefilter"):
        stop, tasks = await started(store, names)
        async with asyncio.timeout(5):
            while store.slot.writes == 0:
                await asyncio.sleep(0.005)
        await stopped(stop, tasks)
    assert "older than the change feed keeps" in caplog.text
    assert store.names_reads == 1 and names.source == "built from the store: 2001 names"
    assert names.may_hold("h7.example.test") and names.may_hold("new.example.test")
    assert bloom.decode(store.slot.data).position == "1"  # the rebuilt one replaced it


@pytest.mark.parametrize("data", [b"junk", b"CAGNFLT1" + b"\x00" * 100])
async def test_a_corrupt_snapshot_is_logged_and_rebuilt(
    data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store = FeedStore(STORE)
    store.slot.data = data
    names = NameFilter()
    with caplog.at_level(logging.WARNING, logger="certagent.service.namefilter"):
        stop, tasks = await started(store, names)
        await stopped(stop, tasks)
    assert "ignoring the snapshot in memory://namefilter" in caplog.text
    assert store.slot.reads == 1  # its header only: refused before being read whole
    assert store.names_reads == 1 and names.may_hold("h1.example.test")
    assert not names.may_hold("stranger.example.test")  # never "accept everything"


async def test_an_outgrown_snapshot_answers_while_a_bigger_filter_is_built() -> None:
    small = bloom.BloomFilter(1024)
    for name in STORE:
        small.add(name)
    assert small.full
    store = FeedStore(STORE)
    store.slot.data = bloom.encode(small, "0", 1)
    names = NameFilter()
    stop, tasks = await started(store, names)
    await stopped(stop, tasks)
    assert store.names_reads == 1 and names.source == "built from the store: 2000 names"
    assert names.status()["capacity"] == 4000


async def test_the_snapshot_is_written_again_only_when_enough_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(namefilter, "SAVE_AFTER_ADDS", 10)
    now = [1_000_000.0]
    names = NameFilter(clock=lambda: now[0])
    await names.build(_aiter(STORE))
    names.followed("5")
    slot = MemorySlot()
    assert names.worth_saving()  # after a build
    assert await names.save(slot) and slot.writes == 1
    names.add(("a.example.test",))
    assert not names.worth_saving()  # one name: not yet
    now[0] += namefilter.SAVE_AFTER_SECONDS
    assert names.worth_saving()  # ... but after a while, yes
    for i in range(25):  # max(SAVE_AFTER_ADDS, 1 % of the names)
        names.add((f"n{i}.example.test",))
    assert await names.save(slot) and slot.writes == 2
    # another agent wrote one a moment ago: this one leaves it
    slot.data = bloom.encode(bloom.BloomFilter(10), "9", int(now[0]) + 10)
    for i in range(25):
        names.add((f"m{i}.example.test",))
    assert names.worth_saving() and not await names.save(slot)
    assert slot.writes == 2 and not names.worth_saving()


async def _aiter(items: list[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


async def test_a_build_that_began_before_the_feed_lost_writes_is_not_used() -> None:
    names = NameFilter()

    async def losing() -> AsyncIterator[str]:
        yield "a.example.test"
        names.invalidate()  # the change feed lost writes while the store was read
        yield "b.example.test"

    await names.build(losing())
    assert not names.ready and names.stale() and names.rebuilds == 0


async def test_without_a_follower_of_the_feed_the_filter_is_built_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(namefilter, "FOLLOW_WAIT", 0.05)
    store = FeedStore(STORE)
    store.slot.data = bloom.encode(bloom.BloomFilter(4000), "0", 1)
    names, stop = NameFilter(), asyncio.Event()  # nobody calls names.followed()
    task = asyncio.create_task(keep_built(names, store, stop))  # type: ignore[arg-type]
    async with asyncio.timeout(5):
        while not names.ready:
            await asyncio.sleep(0.005)
    stop.set()
    await task
    assert names.source == "built from the store: 2000 names" and names.position is None
    assert not names.worth_saving()  # no position it is complete up to: nothing to save
