"""The fleet's issuance budget: windows, renewal reserve, registered domains, several nodes."""

from __future__ import annotations

import pytest

from certagent import config
from certagent.errors import ConfigError
from certagent.service.budget import (
    HOUR,
    WEEK,
    BudgetSettings,
    IssueBudget,
    new_share,
    public_suffix_list,
    registered_domain,
)
from certagent.service.metrics import render
from certagent.store.renewals import BudgetWindow, Renewals
from tests.memstore import MemoryStore
from tests.unit.service.test_metrics_text import samples, snapshot
from tests.unit.service.test_renewal_metrics import issuance

T0 = 1_800_000_000.0  # a whole hour (and a whole week) in Unix seconds
SUFFIXES = public_suffix_list()


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


def renewals_of(store: MemoryStore) -> Renewals:
    return store.issuance().renewals


def budget(store: MemoryStore, clock: Clock, **settings: float) -> IssueBudget:
    return IssueBudget(
        renewals_of(store),
        BudgetSettings(**settings),  # type: ignore[arg-type]
        suffixes=SUFFIXES,
        clock=clock,
    )


async def take_all(b: IssueBudget, names: list[str], *, renewal: bool) -> list[float]:
    return [await b.take(n, renewal=renewal) for n in names]


def names(prefix: str, n: int, domain: str = "budget.test") -> list[str]:
    return [f"{prefix}{i}.{domain}" for i in range(n)]


# --- pure parts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("a.example.co.uk", "example.co.uk"),
        ("b.example.co.uk", "example.co.uk"),
        ("deep.shop.example.com", "example.com"),
        ("*.example.com", "example.com"),
        ("Shop.Example.COM", "example.com"),
        ("one.github.io", "one.github.io"),  # the list's private section counts too
        ("shop.ondemand.test", "ondemand.test"),  # a TLD the list lacks: its own suffix
        ("co.uk", "co.uk"),  # a public suffix: its own group
    ],
)
def test_registered_domain_groups_names_by_etld_plus_one(name: str, group: str) -> None:
    assert registered_domain(SUFFIXES, name) == group


def test_new_names_get_the_share_outside_the_reserve_and_at_least_one() -> None:
    assert new_share(10, 0.2) == 8
    assert new_share(10, 0.0) == 10
    assert new_share(3, 0.5) == 1
    assert new_share(1, 0.9) == 1


def test_windows_of_a_new_name_and_of_a_renewal(store: MemoryStore, clock: Clock) -> None:
    b = budget(store, clock, rate_per_hour=10, domain_per_week=5, renewal_reserve=0.4)
    assert b.windows("a.example.co.uk", renewal=False) == (
        BudgetWindow("rate:all", 10, HOUR),
        BudgetWindow("rate:new", 6, HOUR),
        BudgetWindow("domain:all:example.co.uk", 5, WEEK),
        BudgetWindow("domain:new:example.co.uk", 3, WEEK),
    )
    assert b.windows("b.example.co.uk", renewal=True) == (
        BudgetWindow("rate:all", 10, HOUR),
        BudgetWindow("domain:all:example.co.uk", 5, WEEK),
    )
    assert budget(store, clock).windows("a.example.co.uk", renewal=False) == ()


# --- against the in-memory store ---------------------------------------------------------------


async def test_no_limits_always_go(store: MemoryStore, clock: Clock) -> None:
    b = budget(store, clock)
    assert await take_all(b, names("n", 50), renewal=False) == [0.0] * 50
    assert b.counters.taken["new"] == 50


async def test_the_hourly_rate_refuses_then_opens_with_the_next_window(
    store: MemoryStore, clock: Clock
) -> None:
    b = budget(store, clock, rate_per_hour=5, renewal_reserve=0.0)
    clock.now = T0 + 600
    assert await take_all(b, names("n", 5), renewal=False) == [0.0] * 5
    wait = await b.take("late.budget.test", renewal=False)
    assert wait == pytest.approx(HOUR - 600, abs=1)  # until the window starts afresh
    assert b.counters.refused["new"] == 1
    clock.now += wait
    assert await b.take("late.budget.test", renewal=False) == 0.0


async def test_renewals_keep_the_reserve_new_names_cannot_use(
    store: MemoryStore, clock: Clock
) -> None:
    b = budget(store, clock, rate_per_hour=10, renewal_reserve=0.3)
    # new names stop at 7 of 10
    new = await take_all(b, names("new", 9), renewal=False)
    assert new[:7] == [0.0] * 7 and all(w > 0 for w in new[7:])
    # renewals still get the other 3, then the hour is spent for them too
    renewed = await take_all(b, names("renew", 4), renewal=True)
    assert renewed[:3] == [0.0] * 3 and renewed[3] > 0


async def test_renewals_first_can_spend_the_whole_window_and_shut_new_names_out(
    store: MemoryStore, clock: Clock
) -> None:
    b = budget(store, clock, rate_per_hour=10, renewal_reserve=0.3)
    assert await take_all(b, names("renew", 10), renewal=True) == [0.0] * 10
    assert await b.take("new.budget.test", renewal=False) > 0
    assert b.counters.taken["renewal"] == 10 and b.counters.refused["new"] == 1


async def test_a_refused_order_spends_nothing(store: MemoryStore, clock: Clock) -> None:
    # the new-name window is spent; the refusal leaves rate:all untouched for renewals
    b = budget(store, clock, rate_per_hour=4, renewal_reserve=0.5)
    assert await take_all(b, names("new", 2), renewal=False) == [0.0, 0.0]
    for _ in range(20):
        assert await b.take("more.budget.test", renewal=False) > 0
    assert await take_all(b, names("renew", 2), renewal=True) == [0.0, 0.0]
    assert await b.take("renew9.budget.test", renewal=True) > 0


async def test_names_under_one_registered_domain_share_its_weekly_limit(
    store: MemoryStore, clock: Clock
) -> None:
    b = budget(store, clock, domain_per_week=2, renewal_reserve=0.0)
    assert await b.take("a.example.co.uk", renewal=False) == 0.0
    assert await b.take("b.example.co.uk", renewal=False) == 0.0
    wait = await b.take("c.shop.example.co.uk", renewal=False)
    assert 0 < wait <= WEEK
    # another registered domain under the same public suffix has its own budget
    assert await b.take("a.other.co.uk", renewal=False) == 0.0
    clock.now += wait
    assert await b.take("c.shop.example.co.uk", renewal=False) == 0.0


async def test_the_domain_reserve_is_kept_for_renewals(store: MemoryStore, clock: Clock) -> None:
    b = budget(store, clock, domain_per_week=4, renewal_reserve=0.5)
    assert await take_all(b, ["a.example.com", "b.example.com"], renewal=False) == [0.0, 0.0]
    assert await b.take("c.example.com", renewal=False) > 0
    assert await take_all(b, ["a.example.com", "b.example.com"], renewal=True) == [0.0, 0.0]
    assert await b.take("c.example.com", renewal=True) > 0


async def test_nodes_sharing_a_store_share_one_budget(store: MemoryStore, clock: Clock) -> None:
    nodes = [budget(store, clock, rate_per_hour=6, renewal_reserve=0.0) for _ in range(3)]
    answers = [await nodes[i % 3].take(f"n{i}.budget.test", renewal=True) for i in range(12)]
    assert answers.count(0.0) == 6
    assert sum(n.counters.taken["renewal"] for n in nodes) == 6


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [{"acme_rate_per_hour": -1}, {"acme_domain_per_week": -5}, {"acme_renewal_reserve": 1.0}],
)
def test_budget_settings_are_checked(bad: dict[str, float]) -> None:
    acme = {
        "acme_directory": "https://ca.budget.test/dir",
        "acme_allow_suffixes": "budget.test",
        "acme_challenge": "tls-alpn-01",
        "acme_wait": 1.0,
    }
    config.Settings(**acme)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=next(iter(bad))):
        config.Settings(**acme, **bad)  # type: ignore[arg-type]


def test_budget_settings_come_from_the_agent_settings() -> None:
    settings = config.load(
        None,
        environ={
            "CERTAGENT_ACME_RATE_PER_HOUR": "100",
            "CERTAGENT_ACME_DOMAIN_PER_WEEK": "50",
            "CERTAGENT_ACME_RENEWAL_RESERVE": "0.25",
        },
    )
    assert BudgetSettings.from_settings(settings) == BudgetSettings(100, 50, 0.25)
    assert not BudgetSettings.from_settings(config.Settings()).limited


# --- status and metrics ------------------------------------------------------------------------


async def test_status_and_metrics_count_answers_by_kind(store: MemoryStore, clock: Clock) -> None:
    b = budget(store, clock, rate_per_hour=3, renewal_reserve=0.4)
    await take_all(b, names("new", 3), renewal=False)  # 1 taken (3 x 0.6), 2 refused
    await take_all(b, names("renew", 3), renewal=True)  # 2 taken, 1 refused
    status = b.status()
    assert status["taken"] == {"new": 1, "renewal": 2}
    assert status["refused"] == {"new": 2, "renewal": 1}
    got = samples(render(snapshot(issuance=issuance(None) | {"budget": status})))
    family = "certagent_acme_budget_orders_total"
    assert got[(family, (("answer", "taken"), ("kind", "new")))] == 1
    assert got[(family, (("answer", "refused"), ("kind", "new")))] == 2
    assert got[(family, (("answer", "taken"), ("kind", "renewal")))] == 2
    assert got[(family, (("answer", "refused"), ("kind", "renewal")))] == 1
