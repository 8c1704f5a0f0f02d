"""The store cannot cause an outage: only explicit deletes unload, and bursts are held."""

from __future__ import annotations

import asyncio

from certagent.runtime.pool import Slot, SlotPool
from certagent.service.ensure import NegativeCache
from certagent.service.live import BURST_MIN, LiveUpdater
from certagent.store.base import Change, StoredCertificate


class EmptyStore:
    """A store that lost everything (Redis restarted empty)."""

    def __init__(self) -> None:
        self.records: dict[str, StoredCertificate] = {}

    def describe(self) -> str:
        return "redis://empty"

    async def lookup_all(self, host: str) -> tuple[StoredCertificate, ...]:
        return ()

    async def get(self, cert_id: str) -> None:
        return None


class Loader:
    def __init__(self, slots: int) -> None:
        self.pool = SlotPool(1000, "/certagent/slot-")
        for i in range(slots):
            slot = Slot(self.pool.slot_name(i + 1), f"FP{i}", f"id{i}")
            self.pool.place(slot)
            self.pool.mark_host(f"h{i}.test", (slot,))
        self.unloaded: list[str] = []
        self.unmarked: list[str] = []

    async def unload(self, name: str, deadline: float) -> bool:
        self.unloaded.append(name)
        return True

    async def unmark(self, host: str, deadline: float) -> None:
        self.unmarked.append(host)


def make(slots: int, hold: float = 0.05) -> tuple[LiveUpdater, Loader]:
    loader = Loader(slots)
    live = LiveUpdater(
        EmptyStore(),  # type: ignore[arg-type]
        loader,  # type: ignore[arg-type]
        NegativeCache(30, 100),
        unload_hold=hold,
    )
    return live, loader


async def test_a_resync_against_an_empty_store_unloads_nothing() -> None:
    live, loader = make(30)
    await live.reconcile(loader.pool.slots)
    assert loader.unloaded == [] and loader.unmarked == []
    assert live.counters.orphans == 30


async def test_a_put_event_for_a_name_the_store_lacks_unloads_nothing() -> None:
    live, loader = make(3)
    await live.apply([Change("put", "id1", ("h1.test",))])
    assert loader.unloaded == [] and live.counters.orphans == 1


async def test_an_explicit_delete_unloads_its_slot_only() -> None:
    live, loader = make(30)
    await live.apply([Change("delete", "id1", ("h1.test",))])
    assert loader.unloaded == [loader.pool.slot_name(2)]


async def test_a_delete_names_an_adopted_slot_by_its_hosts() -> None:
    live, loader = make(3)
    slot = loader.pool.get(loader.pool.slot_name(3))
    assert slot is not None
    slot.cert_id = None  # adopted after a restart: the record id is unknown
    await live.apply([Change("delete", "id2", ("h2.test",))])
    assert loader.unloaded == [slot.name]


async def test_a_burst_of_deletes_is_held_then_checked_again() -> None:
    live, loader = make(100)
    burst = [Change("delete", f"id{i}", (f"h{i}.test",)) for i in range(BURST_MIN + 30)]
    await live.apply(burst)
    assert loader.unloaded == [] and live.counters.held == len(burst)
    await asyncio.sleep(0.2)  # the hold (0.05 s here): the store still lacks them
    assert len(loader.unloaded) == len(burst)


async def test_a_small_batch_of_deletes_is_not_held() -> None:
    live, loader = make(100)
    await live.apply([Change("delete", f"id{i}", (f"h{i}.test",)) for i in range(BURST_MIN)])
    assert len(loader.unloaded) == BURST_MIN and live.counters.held == 0


async def test_a_tls_keys_event_calls_the_keeper_and_touches_no_slot() -> None:
    live, loader = make(3)
    calls: list[int] = []

    async def refreshed() -> None:
        calls.append(1)

    live.on_tickets = refreshed
    await live.apply([Change("tls-keys", "", ())])
    assert calls == [1] and loader.unloaded == [] and live.counters.orphans == 0
