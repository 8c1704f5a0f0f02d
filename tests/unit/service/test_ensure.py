"""The ensure path's decisions, with an in-memory store and a recording loader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from certagent.certs.pem import parse_bundle
from certagent.errors import Busy, HAProxyUnavailable, StoreUnavailable
from certagent.runtime.client import Identity
from certagent.runtime.pool import Slot, SlotPool
from certagent.service.ensure import Ensurer, NegativeCache, Outcome
from certagent.store.base import StoredCertificate
from certagent.testing.certs import issue, make_ca, shared_key


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
        self.remarks: list[str] = []
        self.error: Exception | None = None
        self.current = True
        self.switches: list[str] = []
        self.identity: Identity | None = Identity(111, 1, "2.6.12")
        self.next_identity = Identity(222, 2, "2.6.12")
        self.rewarms: list[list[str]] = []

    async def install(
        self, host: str, certs: tuple[StoredCertificate, ...], hold: float
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
        self.pool.mark_host(host, slots)
        return tuple(slots)

    async def remark(self, host: str, deadline: float) -> bool:
        self.remarks.append(host)
        return self.pool.is_marked(host)

    async def still_current(self) -> bool:
        return self.current

    async def sync(self) -> Identity:
        self.identity = self.next_identity
        return self.identity

    async def switch_worker(self, reason: str) -> list[str]:
        self.switches.append(reason)
        hosts = sorted(h for s in self.pool.slots for h in s.hosts)
        self.pool.clear()
        self.identity = self.next_identity
        self.current = True
        return hosts


@pytest.fixture(scope="module")
def stored() -> StoredCertificate:
    chain, key = issue(make_ca(), "a.example.test", key=shared_key())
    return StoredCertificate("id-a", parse_bundle(chain, key))


def make(stored: StoredCertificate, ttl: float = 30.0) -> tuple[Ensurer, MemoryStore, Any, Clock]:
    store = MemoryStore({"a.example.test": stored})
    loader = RecordingLoader()
    clock = Clock()
    ensurer = Ensurer(
        store,  # type: ignore[arg-type]
        loader,  # type: ignore[arg-type]
        NegativeCache(ttl, 100, clock),
        hold=0.5,
        on_reload=loader.rewarms.append,
        clock=clock,
    )
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
    [(Busy("queue full", "queue"), Outcome.BUSY), (HAProxyUnavailable("down"), Outcome.ERROR)],
)
async def test_loader_failures_become_fallback_answers(
    stored: StoredCertificate, error: Exception, outcome: Outcome
) -> None:
    ensurer, _, loader, _ = make(stored)
    loader.error = error
    assert await ensurer.ensure(b"a.example.test") == outcome
    busy = {"queue": 1} if outcome is Outcome.BUSY else {}
    assert ensurer.counters.busy_by_reason == busy  # /metrics: which limit, how many
    loader.error = None
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK  # not cached as negative


async def test_store_down_is_an_error_not_a_negative(stored: StoredCertificate) -> None:
    ensurer, store, _, _ = make(stored)
    store.fail = True
    assert await ensurer.ensure(b"a.example.test") == Outcome.ERROR
    store.fail = False
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK


async def test_a_loaded_host_whose_mark_expired_is_marked_again_without_a_load(
    stored: StoredCertificate,
) -> None:
    ensurer, store, loader, _ = make(stored)
    assert await ensurer.ensure(b"a.example.test", 111) == Outcome.OK
    # HAProxy asks again: the table entry expired, the certificate is still in its slot
    assert await ensurer.ensure(b"a.example.test", 111) == Outcome.OK
    assert loader.installs == ["a.example.test"]
    assert loader.remarks == ["a.example.test"]
    assert store.lookups == ["a.example.test"]


async def test_a_request_from_a_new_worker_switches_once_and_rewarms(
    stored: StoredCertificate,
) -> None:
    ensurer, _, loader, _ = make(stored)
    assert await ensurer.ensure(b"a.example.test", 111) == Outcome.OK
    loader.current = False  # HAProxy was reloaded: pid 222 serves new connections
    outcomes = await asyncio.gather(*(ensurer.ensure(b"a.example.test", 222) for _ in range(5)))
    assert set(outcomes) == {Outcome.OK}
    assert loader.switches == ["HAProxy pid 111 was replaced"]
    assert loader.rewarms == [["a.example.test"]]
    assert loader.installs == ["a.example.test", "a.example.test"]


async def test_a_request_from_the_replaced_worker_is_loaded_into_the_newest(
    stored: StoredCertificate,
) -> None:
    """Its connection's hop lands in the newest worker's fe_tls: load it there."""
    ensurer, _store, loader, _ = make(stored)
    # the loader already talks to the current worker (111); pid 99 is on its way out
    assert await ensurer.ensure(b"a.example.test", 99) == Outcome.OK
    assert loader.switches == [] and loader.installs == ["a.example.test"]


async def test_a_marked_host_asked_again_after_an_unnoticed_reload_is_loaded_again(
    stored: StoredCertificate,
) -> None:
    ensurer, _, loader, _ = make(stored)
    assert await ensurer.ensure(b"a.example.test", 111) == Outcome.OK
    loader.current = False  # reloaded; this request still names the old worker
    assert await ensurer.ensure(b"a.example.test", 111) == Outcome.OK
    assert len(loader.switches) == 1 and loader.remarks == []
    assert loader.installs == ["a.example.test", "a.example.test"]
    assert ensurer.counters.reloads == 1


async def test_a_store_lookup_that_eats_the_hold_is_busy(stored: StoredCertificate) -> None:
    ensurer, store, loader, clock = make(stored)

    async def slow(hostname: str) -> tuple[StoredCertificate, ...]:
        clock.now += 1.0  # longer than the hold (0.5 s)
        return (stored,)

    store.lookup_all = slow  # type: ignore[method-assign]
    assert await ensurer.ensure(b"a.example.test") == Outcome.BUSY
    assert loader.installs == []
    assert ensurer.counters.busy_by_reason == {"hold": 1}


class NothingFilter:
    """A name filter that has seen no names yet (the change feed is behind)."""

    ready = True

    def may_hold(self, name: str) -> bool:
        return False

    def exact(self, name: str) -> bool:
        return False


async def test_filter_rejections_are_rechecked_a_few_times_a_second(
    stored: StoredCertificate,
) -> None:
    from certagent.service.ensure import RECHECKS

    ensurer, store, loader, clock = make(stored)
    ensurer.names = NothingFilter()  # type: ignore[assignment]
    # a name written a moment ago, not yet in the filter, is still found and loaded
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    assert loader.installs == ["a.example.test"]
    # a flood of unknown names: the recheck budget, then the filter answers alone
    names = [f"n{i}.flood.test".encode() for i in range(100)]
    outcomes = [await ensurer.ensure(n) for n in names]
    assert set(outcomes) == {Outcome.UNKNOWN}
    assert len(store.lookups) == int(RECHECKS)  # the first one plus RECHECKS - 1
    assert ensurer.counters.filtered == 100 - (int(RECHECKS) - 1)
    clock.now += 1.0  # a second later: RECHECKS more
    for n in names[:50]:
        await ensurer.ensure(n)
    assert len(store.lookups) <= 2 * int(RECHECKS)


async def test_an_expired_certificate_in_the_store_is_served_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import datetime as dt

    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    chain, key = issue(
        make_ca(), "a.example.test", key=shared_key(),
        not_before=past - dt.timedelta(days=90), not_after=past,
    )  # fmt: skip
    expired = StoredCertificate("id-old", parse_bundle(chain, key))
    ensurer, _, loader, _ = make(expired)
    with caplog.at_level("WARNING"):
        assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    assert loader.installs == ["a.example.test"]
    assert "certificate id-old, which expired on" in caplog.text
    assert "renew it, or delete it" in caplog.text


async def test_until_the_name_filter_is_ready_lookups_are_bounded_at_the_unfiltered_rate(
    stored: StoredCertificate,
) -> None:
    from certagent.service.flood import UNFILTERED_RATE
    from certagent.service.namefilter import NameFilter

    ensurer, store, loader, clock = make(stored)
    ensurer.names = NameFilter()  # not built yet: it admits every name
    flood = [f"n{i}.flood.test".encode() for i in range(300)]
    outcomes = [await ensurer.ensure(n) for n in flood]
    assert len(store.lookups) == int(UNFILTERED_RATE)
    assert outcomes.count(Outcome.BUSY) == 300 - int(UNFILTERED_RATE)
    clock.now += 1.0  # a second later: as many again, real hosts among them
    assert await ensurer.ensure(b"a.example.test") == Outcome.OK
    for n in flood[:200]:
        await ensurer.ensure(n)
    assert len(store.lookups) == 2 * int(UNFILTERED_RATE)
    assert loader.installs == ["a.example.test"]
