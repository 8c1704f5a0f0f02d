"""The ensure path's decisions, with an in-memory store and a recording loader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.ensure import Ensurer, NegativeCache, Outcome
from agent.errors import Busy, HAProxyUnavailable, StoreUnavailable
from agent.pem import parse_bundle
from agent.pool import Slot, SlotPool
from agent.store.base import StoredCertificate
from tests.certs import issue, make_ca, shared_key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class MemoryStore:
    def __init__(self, certs: dict[str, StoredCertificate]) -> None:
        self.certs = certs
        self.lookups: list[str] = []
        self.fail = False

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        self.lookups.append(hostname)
        await asyncio.sleep(0.01)
        if self.fail:
            raise StoreUnavailable("redis down")
        found = self.certs.get(hostname)
        return () if found is None else (found,)


class RecordingLoader:
    def __init__(self) -> None:
        self.pool = SlotPool(10, "/certagent/slot-")
        self.installs: list[str] = []
        self.error: Exception | None = None
        self.current = True
        self.resets: list[str] = []

    async def install(
        self, host: str, certs: tuple[StoredCertificate, ...], start_deadline: float
    ) -> tuple[Slot, ...]:
        self.installs.append(host)
        await asyncio.sleep(0.01)
        if self.error is not None:
            raise self.error
        slots = []
        for cert in certs:
            s = Slot(self.pool.slot_name(len(self.pool) + 1), cert.bundle.fingerprint_sha1, cert.id)
            self.pool.place(s)
            slots.append(s)
        self.pool.map_host(host, slots)
        return tuple(slots)

    async def still_current(self) -> bool:
        return self.current

    async def reset(self, reason: str) -> None:
        self.resets.append(reason)
        self.pool.clear()


@pytest.fixture(scope="module")
def stored() -> StoredCertificate:
    chain, key = issue(make_ca(), "a.example.test", key=shared_key())
    return StoredCertificate("id-a", parse_bundle(chain, key))


def make(stored: StoredCertificate, ttl: float = 30.0) -> tuple[Ensurer, MemoryStore, Any, Clock]:
    store = MemoryStore({"a.example.test": stored})
    loader = RecordingLoader()
    clock = Clock()
    ensurer = Ensurer(store, loader, NegativeCache(ttl, 100, clock), load_deadline=0.5)  # type: ignore[arg-type]
    return ensurer, store, loader, clock


async def test_loads_once_then_hits(stored: StoredCertificate) -> None:
    ensurer, store, loader, _ = make(stored)
    assert await ensurer.ensure(b"A.Example.Test") == Outcome.OK
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    assert loader.installs == ["a.example.test"]
    assert store.lookups == ["a.example.test"]
    assert ensurer.counters.hits == 1
    assert ensurer.counters.loaded == 1


@pytest.mark.parametrize(
    "raw",
    [b"", b"a;b.test", b"a b.test", b"a\r\nb.test", b"%41.test", "é.test".encode(), b"x" * 300],
)
async def test_invalid_names_never_reach_store_or_haproxy(
    stored: StoredCertificate, raw: bytes
) -> None:
    ensurer, store, loader, _ = make(stored)
    assert await ensurer.ensure(raw) == Outcome.INVALID
    assert store.lookups == []
    assert loader.installs == []


async def test_concurrent_first_requests_load_once(stored: StoredCertificate) -> None:
    ensurer, store, loader, _ = make(stored)
    outcomes = await asyncio.gather(*(ensurer.ensure(b"a.example.test") for _ in range(50)))
    assert set(outcomes) == {Outcome.OK}
    assert loader.installs == ["a.example.test"]
    assert store.lookups == ["a.example.test"]


async def test_negative_cache_until_ttl(stored: StoredCertificate) -> None:
    ensurer, store, _, clock = make(stored, ttl=30)
    assert await ensurer.ensure(b"nope.example.test") == Outcome.UNKNOWN
    assert await ensurer.ensure(b"nope.example.test") == Outcome.UNKNOWN
    assert store.lookups == ["nope.example.test"]
    assert ensurer.counters.negative_hits == 1
    clock.now += 31
    assert await ensurer.ensure(b"nope.example.test") == Outcome.UNKNOWN
    assert store.lookups == ["nope.example.test", "nope.example.test"]


def test_negative_cache_is_bounded() -> None:
    cache = NegativeCache(60, 3, Clock())
    for i in range(5):
        cache.add(f"h{i}.test")
    assert len(cache) == 3
    assert "h0.test" not in cache
    assert "h4.test" in cache


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(Busy("queue full"), Outcome.BUSY), (HAProxyUnavailable("down"), Outcome.ERROR)],
)
async def test_loader_failures_become_fallback_answers(
    stored: StoredCertificate, error: Exception, outcome: Outcome
) -> None:
    ensurer, _, loader, _ = make(stored)
    loader.error = error
    assert await ensurer.ensure(b"a.example.test") == outcome
    loader.error = None
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK  # not cached as negative


async def test_store_down_is_an_error_not_a_negative(stored: StoredCertificate) -> None:
    ensurer, store, _, _ = make(stored)
    store.fail = True
    assert await ensurer.ensure(b"a.example.test") == Outcome.ERROR
    store.fail = False
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK


async def test_mapped_host_asked_again_after_unnoticed_reload_is_reloaded(
    stored: StoredCertificate,
) -> None:
    ensurer, _, loader, _ = make(stored)
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    loader.current = False  # HAProxy was reloaded: its map no longer has the host
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    assert loader.installs == ["a.example.test", "a.example.test"]
    assert len(loader.resets) == 1
