"""The permission policy: suffixes, registered names, the ask endpoint; caching and rates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from certagent.errors import ConfigError, StoreUnavailable
from certagent.service.flood import LookupBudget
from certagent.service.permission import By, Permission, parse_suffixes, suffix_allows
from tests.memstore import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, dict[str, int], set[str]]]:
    """An ask endpoint: 200 for names in ``allowed``, 403 otherwise, 500 for ``boom.test``."""
    asked: dict[str, int] = {}
    allowed: set[str] = set()

    async def ask(request: web.Request) -> web.Response:
        name = request.query.get("domain", "")
        asked[name] = asked.get(name, 0) + 1
        if name == "boom.test":
            return web.Response(status=500)
        if name == "slow.test":
            await asyncio.sleep(2)
        return web.Response(status=204 if name in allowed else 403)

    app = web.Application()
    app.router.add_get("/ask", ask)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/ask")), asked, allowed
    finally:
        await server.close()


def test_suffixes_are_validated_and_match_names_under_them() -> None:
    assert parse_suffixes("example.com, .Customers.example.NET *.x.org") == (
        "example.com",
        "customers.example.net",
        "x.org",
    )
    with pytest.raises(ConfigError, match="not a domain name"):
        parse_suffixes("example.com bad_name!")
    suffixes = ("example.com",)
    assert suffix_allows(suffixes, "example.com")
    assert suffix_allows(suffixes, "a.b.example.com")
    assert not suffix_allows(suffixes, "badexample.com")
    assert not suffix_allows(suffixes, "example.com.evil.test")


def test_no_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs a permission policy"):
        Permission()


async def test_suffix_rules_decide_without_any_request() -> None:
    permission = Permission(suffixes=("example.com",))
    assert (await permission.decide("shop.example.com")).by == By.SUFFIX
    denied = await permission.decide("other.test")
    assert not denied.allowed and denied.by == By.NONE


async def test_registered_names_are_read_once_per_ttl_and_forgotten_on_change() -> None:
    store = MemoryStore()
    domains = store.issuance().domains
    clock = Clock()
    permission = Permission(registry=domains, allow_ttl=60, deny_ttl=10, clock=clock)
    assert not (await permission.decide("new.test")).allowed
    await domains.register("new.test")
    assert not (await permission.decide("new.test")).allowed  # the denial is cached ...
    permission.forget("new.test")  # ... until the feed's domain change drops it
    decision = await permission.decide("new.test")
    assert decision.allowed and decision.by == By.REGISTERED and not decision.cached
    assert (await permission.decide("new.test")).cached
    clock.now += 61  # the allowed answer lapsed: asked again
    assert not (await permission.decide("new.test")).cached


async def test_the_store_budget_bounds_registry_reads() -> None:
    clock = Clock()
    permission = Permission(
        registry=MemoryStore().issuance().domains,
        store_budget=LookupBudget(1.0, 2.0, clock=clock),
        clock=clock,
    )
    reasons = [(await permission.decide(f"n{i}.test")).reason for i in range(4)]
    assert reasons[:2] == ["not registered"] * 2
    assert reasons[2:] == ["over the store-lookup budget"] * 2


async def test_an_unreachable_registry_is_an_error_not_a_denial() -> None:
    store = MemoryStore()
    permission = Permission(registry=store.issuance().domains)
    store.available = False
    with pytest.raises(StoreUnavailable):
        await permission.decide("any.test")


async def test_the_ask_endpoint_any_2xx_allows_and_answers_are_cached(
    endpoint: tuple[str, dict[str, int], set[str]],
) -> None:
    url, asked, allowed = endpoint
    allowed.add("yes.test")
    permission = Permission(ask_url=url, ask_rate=100)
    for _ in range(3):
        assert (await permission.decide("yes.test")).allowed  # 204 is a 2xx
        assert not (await permission.decide("no.test")).allowed
    assert asked == {"yes.test": 1, "no.test": 1}
    failed = await permission.decide("boom.test")
    assert not failed.allowed and "answered 500" in failed.reason
    await permission.close()


async def test_concurrent_questions_share_one_request(
    endpoint: tuple[str, dict[str, int], set[str]],
) -> None:
    url, asked, allowed = endpoint
    allowed.add("busy.test")
    permission = Permission(ask_url=url, ask_rate=100)
    answers = await asyncio.gather(*(permission.decide("busy.test") for _ in range(20)))
    assert all(a.allowed for a in answers)
    assert asked == {"busy.test": 1}
    await permission.close()


async def test_a_timeout_denies_without_caching_and_the_rate_bounds_the_endpoint(
    endpoint: tuple[str, dict[str, int], set[str]],
) -> None:
    url, asked, _ = endpoint
    clock = Clock()
    permission = Permission(ask_url=url, ask_timeout=0.2, ask_rate=2, clock=clock)
    slow = await permission.decide("slow.test")
    assert not slow.allowed and "did not answer" in slow.reason
    assert permission.counters.ask_errors == 1
    # not cached: the next question asks again (within the rate)
    await permission.decide("slow.test")
    assert asked["slow.test"] == 2
    # the rate: at most 2 a second (the burst is spent): made-up names are denied unasked
    flood = [await permission.decide(f"r{i}.test") for i in range(10)]
    assert all(not d.allowed for d in flood)
    assert sum(1 for name in asked if name.startswith("r")) == 0
    assert permission.counters.over_budget == 10
    await permission.close()
