"""The name filter and the flood guards: made-up names never reach the store in bulk."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable

import pytest

from certagent.service.flood import LookupBudget, UnknownNames
from certagent.service.namefilter import BloomFilter, NameFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def aiter_of(names: Iterable[str]) -> AsyncIterator[str]:
    for name in names:
        yield name


def test_bloom_filter_has_no_false_negatives_and_about_one_percent_false_positives() -> None:
    bloom = BloomFilter(20_000)
    members = [f"h{i}.example.test" for i in range(20_000)]
    for name in members:
        bloom.add(name)
    assert all(name in bloom for name in members)
    strangers = [f"x{i}.random.test" for i in range(20_000)]
    rate = sum(name in bloom for name in strangers) / len(strangers)
    assert rate < 0.02, rate
    assert bloom.memory < 30_000  # ≈ 9.6 bits a name


async def test_the_filter_admits_everything_until_built_then_only_store_names() -> None:
    names = NameFilter()
    assert names.may_hold("anything.test") and not names.ready
    await names.build(aiter_of(["a.example.test", "*.wild.test"]))
    assert names.ready and not names.stale()
    assert names.may_hold("a.example.test")
    assert names.may_hold("x.wild.test")  # through its wildcard
    assert names.exact("a.example.test") and not names.exact("x.wild.test")
    assert not names.may_hold("b.example.test")
    assert not names.may_hold("y.x.wild.test")  # a wildcard covers one label only
    names.add(("b.example.test",))
    assert names.may_hold("b.example.test")


async def test_names_added_during_a_build_are_not_lost() -> None:
    names = NameFilter()

    async def slow() -> AsyncIterator[str]:
        yield "a.example.test"
        names.add(("new.example.test",))  # a write arrives while the store is read
        yield "b.example.test"

    await names.build(slow())
    assert names.may_hold("new.example.test") and names.may_hold("b.example.test")


async def test_invalidating_asks_for_a_rebuild_and_admits_meanwhile() -> None:
    names = NameFilter()
    await names.build(aiter_of(["a.example.test"]))
    assert not names.wanted.is_set()
    names.invalidate()
    assert names.wanted.is_set() and names.may_hold("zzz.test")
    await asyncio.sleep(0)


def test_the_budget_lets_a_burst_through_then_the_rate() -> None:
    clock = Clock()
    budget = LookupBudget(rate=10, burst=20, clock=clock)
    assert sum(budget.take() for _ in range(50)) == 20
    clock.now += 1.0
    assert sum(budget.take() for _ in range(50)) == 10


def test_unknown_names_are_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    unknown = UnknownNames(interval=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="certagent.service.flood"):
        for i in range(1000):
            clock.now += 0.001
            unknown.note(f"r{i}.flood.test", looked_up=i % 100 == 0)
        assert caplog.records == []
        clock.now += 10
        unknown.note("last.flood.test", looked_up=False)
    (line,) = caplog.records
    assert "1001 names not in the store" in line.getMessage()
    assert "991 turned away by the name filter, 10 looked up" in line.getMessage()
    assert "e.g. r0.flood.test, r1.flood.test, r2.flood.test" in line.getMessage()
