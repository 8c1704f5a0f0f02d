"""The issuer against the in-memory store: one order per name, waits, backoff, pause, fencing.

``obtain_certificate`` (the ACME exchange, tested in tests/unit/acme and against
pebble) is replaced by a fake CA that issues from a test CA, counts orders and
can fail, be slow, or rate-limit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from certagent.acme import (
    AcmeClient,
    CaUnavailable,
    ChallengeSolver,
    IssuedCertificate,
    Problem,
    RateLimited,
)
from certagent.acme.csr import CertKeyType
from certagent.service import issuer as issuer_module
from certagent.service.acmeaccount import AccountKeeper, AccountSettings
from certagent.service.budget import BudgetSettings, IssueBudget
from certagent.service.issuer import (
    Budget,
    FirstConnection,
    Issuer,
    IssuerSettings,
    Outcome,
)
from certagent.service.orderfailure import backoff_delay, failure_reason
from certagent.service.permission import Permission
from certagent.store.issuance import ACME_MANAGED
from certagent.testing.certs import issue, make_ca
from tests.memstore import MemoryStore

NAME = "shop.issuer.test"
#: "now" for tests that move time: certificates the fake CA issues are valid then
T = float(int(time.time()))


@dataclass
class FakeCa:
    """Stands in for :func:`certagent.acme.obtain_certificate`."""

    orders: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # the key type of each order
    fail: list[BaseException] = field(default_factory=list)  # raised by the next orders
    delay: float = 0.0
    ca: Any = field(default_factory=make_ca)
    open_now: int = 0
    open_peak: int = 0

    async def obtain(
        self, client: object, names: Sequence[str], solver: object, **kwargs: Any
    ) -> IssuedCertificate:
        self.orders.append(names[0])
        key_type = kwargs.get("key_type", "ecdsa")
        self.kinds.append(key_type)
        self.open_now += 1
        self.open_peak = max(self.open_peak, self.open_now)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail:
                raise self.fail.pop(0)
            chain, key = issue(self.ca, *names, key_type="rsa" if key_type == "rsa" else "ec")
            return IssuedCertificate(tuple(names), key_type, chain, key, "https://ca/order/1")
        finally:
            self.open_now -= 1


class NoClient:
    """The account keeper's client factory: the fake CA never talks to it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.account_url = "https://ca/acct/1"
        self.account_key = None

    async def register(self, **kwargs: object) -> object:
        return type("Account", (), {"url": self.account_url})()

    async def directory(self) -> object:
        return type("Directory", (), {"renewal_info": None})()  # no ARI

    async def close(self) -> None:
        return None


def make_issuer(
    store: MemoryStore,
    ca: FakeCa,
    monkeypatch: pytest.MonkeyPatch,
    *,
    node: str = "node-1",
    allow: Callable[[str], bool] = lambda name: name.endswith(".issuer.test"),
    concurrency: int = 10,
    key_types: tuple[CertKeyType, ...] = ("ecdsa",),
    budget: Budget | None = None,
) -> Issuer:
    monkeypatch.setattr(issuer_module, "obtain_certificate", ca.obtain)
    issuance = store.issuance()
    suffixes = ("issuer.test",) if allow(NAME) else ("elsewhere.test",)
    accounts = AccountKeeper(
        AccountSettings("https://ca/dir"),
        issuance.accounts,
        issuance.locks,
        node,
        client_factory=NoClient,  # type: ignore[arg-type]
    )
    solver: ChallengeSolver = type("Solver", (), {"challenge_types": ("http-01",)})()  # type: ignore[assignment]
    return Issuer(
        issuance,
        store,
        Permission(suffixes=suffixes),
        accounts,
        solver,
        node,
        IssuerSettings(
            key_types=key_types,
            concurrency=concurrency,
            order_timeout=5,
            backoff_min=10,
            backoff_max=80,
        ),
        budget=budget,
        rand=lambda: 0.0,
    )


async def test_an_allowed_name_is_issued_once_for_many_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, ca = MemoryStore(), FakeCa(delay=0.05)
    issuer = make_issuer(store, ca, monkeypatch)
    results = await asyncio.gather(*(issuer.first_connection(NAME, 2.0) for _ in range(20)))
    assert results == [FirstConnection.ISSUED] * 20
    assert ca.orders == [NAME]
    (stored,) = await store.lookup_all(NAME)
    record = await store.get(stored.id)
    assert record is not None and record.managed == ACME_MANAGED
    # the name has its certificate now: a new issuance checks the store and orders nothing
    await issuer.request(NAME)
    assert ca.orders == [NAME]
    await issuer.close()


async def test_a_denied_name_never_reaches_the_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa()
    issuer = make_issuer(store, ca, monkeypatch)
    assert await issuer.first_connection("stranger.other.test", 1.0) == FirstConnection.DENIED
    assert ca.orders == []
    await issuer.close()


async def test_past_the_wait_the_issuance_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa(delay=0.3)
    issuer = make_issuer(store, ca, monkeypatch)
    assert await issuer.first_connection(NAME, 0.05) == FirstConnection.PENDING
    assert issuer.counters.fallbacks == 1
    await asyncio.sleep(0.4)
    assert await store.lookup_all(NAME)  # issued meanwhile: the next connection is served
    assert await issuer.first_connection(NAME, 0.05) == FirstConnection.ISSUED
    assert ca.orders == [NAME]
    await issuer.close()


async def test_two_nodes_one_order_the_other_waits_for_the_feed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, ca = MemoryStore(), FakeCa(delay=0.2)
    first = make_issuer(store, ca, monkeypatch, node="node-1")
    second = make_issuer(store, ca, monkeypatch, node="node-2")

    async def feed_to_second() -> None:  # the change feed: node-2 learns of node-1's put
        seen = 0
        while True:
            await asyncio.sleep(0.01)
            for change in store.events[seen:]:
                if change.kind == "put":
                    second.stored(change.names)
            seen = len(store.events)

    follower = asyncio.create_task(feed_to_second())
    a = asyncio.create_task(first.first_connection(NAME, 2.0))
    await asyncio.sleep(0.05)  # node-1 holds the lease now
    b = await second.first_connection(NAME, 2.0)
    assert (await a, b) == (FirstConnection.ISSUED, FirstConnection.ISSUED)
    assert ca.orders == [NAME]
    assert second.counters.waited_elsewhere == 1
    follower.cancel()
    await first.close()
    await second.close()


async def test_a_failure_backs_the_name_off_for_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [T]
    store = MemoryStore(clock=lambda: clock[0])
    ca = FakeCa(fail=[CaUnavailable("connection refused"), CaUnavailable("connection refused")])
    first = make_issuer(store, ca, monkeypatch, node="node-1")
    first._clock = lambda: clock[0]
    second = make_issuer(store, ca, monkeypatch, node="node-2")
    second._clock = lambda: clock[0]
    assert await first.first_connection(NAME, 1.0) == FirstConnection.PENDING
    state = await store.issuance().limits.name_state(NAME)
    assert state is not None and state.failures == 1 and state.not_before == T + 10
    assert "ca-unavailable" in state.last_error
    # no new order before the backoff ends, from either node
    for node in (first, second):
        assert await node.first_connection(NAME, 0.2) == FirstConnection.PENDING
    assert len(ca.orders) == 1
    clock[0] = T + 11
    assert await second.first_connection(NAME, 0.5) == FirstConnection.PENDING  # fails again
    state = await store.issuance().limits.name_state(NAME)
    assert state is not None and state.failures == 2 and state.not_before == T + 11 + 20
    clock[0] = T + 32
    assert await first.first_connection(NAME, 1.0) == FirstConnection.ISSUED
    assert len(ca.orders) == 3
    assert await store.issuance().limits.name_state(NAME) is None  # cleared by the success
    assert first.counters.failed_by_reason == {"ca-unavailable": 1}
    await first.close()
    await second.close()


async def test_a_429_pauses_the_whole_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [T]
    store = MemoryStore(clock=lambda: clock[0])
    limited = RateLimited(
        Problem("urn:ietf:params:acme:error:rateLimited", "slow down"),
        "https://ca/new-order",
        retry_after=120,
    )
    ca = FakeCa(fail=[limited])
    issuer = make_issuer(store, ca, monkeypatch)
    issuer._clock = lambda: clock[0]
    assert await issuer.first_connection(NAME, 1.0) == FirstConnection.PENDING
    assert await store.issuance().limits.paused_until() == T + 120
    other = "other.issuer.test"
    assert await issuer.first_connection(other, 0.2) == FirstConnection.PENDING
    assert ca.orders == [NAME]  # paused: nothing reached the CA
    clock[0] = T + 121
    assert await issuer.first_connection(other, 1.0) == FirstConnection.ISSUED
    await issuer.close()


async def test_open_orders_stay_within_the_fleet_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa(delay=0.05)
    nodes = [make_issuer(store, ca, monkeypatch, node=f"n{i}", concurrency=3) for i in range(2)]
    names = [f"n{i}.issuer.test" for i in range(12)]
    results = await asyncio.gather(
        *(nodes[i % 2].first_connection(name, 5.0) for i, name in enumerate(names))
    )
    assert results == [FirstConnection.ISSUED] * 12
    assert sorted(ca.orders) == sorted(names)
    assert ca.open_peak <= 3
    for node in nodes:
        await node.close()


# --- the budget and the order slots ------------------------------------------------------------


def hourly_budget(store: MemoryStore, per_hour: int) -> IssueBudget:
    """The fleet budget over the in-memory store, its clock still (one hourly window)."""
    return IssueBudget(
        store.issuance().renewals, BudgetSettings(rate_per_hour=per_hour), clock=lambda: T
    )


class SlotProbe:
    """A budget that notes whether the order slot (fleet cap 1) is held when it is asked."""

    def __init__(self, store: MemoryStore, wait: float, block: bool = False) -> None:
        self.limits = store.issuance().limits
        self.wait = wait
        self.block = block
        self.slot_held: list[bool] = []

    async def take(self, name: str, *, renewal: bool) -> float:
        probe = "probe.issuer.test"
        got = await self.limits.take_order_slot(probe, 1, 60)
        self.slot_held.append(not got)
        if got:
            await self.limits.free_order_slot(probe)
        if self.block:
            await asyncio.Event().wait()
        return self.wait


async def slot_free(store: MemoryStore) -> bool:
    """True if another name gets the fleet's only order slot (and gives it back)."""
    limits = store.issuance().limits
    got = await limits.take_order_slot("other.issuer.test", 1, 60)
    await limits.free_order_slot("other.issuer.test")
    return got


async def test_no_free_order_slot_spends_no_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa()
    budget = hourly_budget(store, 1)
    issuer = make_issuer(store, ca, monkeypatch, concurrency=1, budget=budget)
    assert await store.issuance().limits.take_order_slot("busy.issuer.test", 1, 60)
    lease = await store.issuance().locks.acquire(NAME, "node-1", 1.0)  # too short to wait
    assert lease is not None
    ordered = await issuer.order(NAME, lease, renewal=False)
    assert (ordered.outcome, ordered.reason) == (Outcome.WAITING, "slots")
    assert ca.orders == [] and budget.counters.taken == {}
    assert await budget.take(NAME, renewal=False) == 0.0  # the unit is still there
    await issuer.close()


async def test_the_budget_is_asked_holding_the_slot_and_a_refusal_frees_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, ca = MemoryStore(), FakeCa()
    budget = SlotProbe(store, wait=40.0)
    issuer = make_issuer(store, ca, monkeypatch, concurrency=1, budget=budget)
    lease = await store.issuance().locks.acquire(NAME, "node-1", issuer.settings.lease_seconds)
    assert lease is not None
    ordered = await issuer.order(NAME, lease, renewal=True)
    assert (ordered.outcome, ordered.reason) == (Outcome.WAITING, "budget")
    assert ordered.retry_at >= time.time() + 39
    assert budget.slot_held == [True]
    assert ca.orders == [] and issuer.counters.budget_waits == 1
    assert await slot_free(store)
    await issuer.close()


async def test_a_cancelled_order_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa()
    budget = SlotProbe(store, wait=0.0, block=True)
    issuer = make_issuer(store, ca, monkeypatch, concurrency=1, budget=budget)
    lease = await store.issuance().locks.acquire(NAME, "node-1", issuer.settings.lease_seconds)
    assert lease is not None
    task = asyncio.create_task(issuer.order(NAME, lease, renewal=False))
    async with asyncio.timeout(5):
        while not budget.slot_held:
            await asyncio.sleep(0.01)
    assert not await slot_free(store)  # held while the budget is asked
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await slot_free(store)
    await issuer.close()


async def test_both_key_types_spend_one_budget_unit_each(monkeypatch: pytest.MonkeyPatch) -> None:
    store, ca = MemoryStore(), FakeCa()
    budget = hourly_budget(store, 2)
    issuer = make_issuer(store, ca, monkeypatch, key_types=("ecdsa", "rsa"), budget=budget)
    lease = await store.issuance().locks.acquire(NAME, "node-1", issuer.settings.lease_seconds)
    assert lease is not None
    assert (await issuer.order(NAME, lease, renewal=False)).outcome is Outcome.ISSUED
    assert ca.kinds == ["ecdsa", "rsa"]
    assert budget.counters.taken == {"new": 2}
    assert await budget.take("other.issuer.test", renewal=False) > 0  # both units spent
    await issuer.close()


async def test_a_budget_refusal_between_key_types_keeps_the_first_and_retries_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, ca = MemoryStore(), FakeCa()
    budget = hourly_budget(store, 1)
    issuer = make_issuer(store, ca, monkeypatch, key_types=("ecdsa", "rsa"), budget=budget)
    lease = await store.issuance().locks.acquire(NAME, "node-1", issuer.settings.lease_seconds)
    assert lease is not None
    ordered = await issuer.order(NAME, lease, renewal=False)
    assert (ordered.outcome, ordered.reason) == (Outcome.WAITING, "budget")
    assert "ecdsa issued" in ordered.detail
    assert ca.kinds == ["ecdsa"]  # no RSA order without its budget unit
    (stored,) = await store.lookup_all(NAME)  # the ECDSA certificate is served meanwhile
    assert stored.bundle.key_type.startswith("ECDSA")
    entry = await store.issuance().renewals.entry(NAME)  # the renewer orders again then
    assert entry is not None and entry.renew_at == pytest.approx(ordered.retry_at, abs=1)
    assert await slot_free(store)
    await issuer.close()


def test_backoff_doubles_to_the_maximum_with_jitter() -> None:
    assert [backoff_delay(n, 10, 80, 0.0) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 80, 80]
    assert backoff_delay(1, 10, 80, 0.999) == pytest.approx(10.999)


def test_failure_reasons() -> None:
    problem = Problem("urn:ietf:params:acme:error:rateLimited", "x")
    assert failure_reason(RateLimited(problem, "u", retry_after=None)) == "rate-limited"
    assert failure_reason(CaUnavailable("down")) == "ca-unavailable"
    assert failure_reason(TimeoutError()) == "timeout"
    assert failure_reason(ValueError()) == "error"


def test_the_client_factory_is_the_acme_client() -> None:
    assert AccountKeeper.__init__.__kwdefaults__["client_factory"] is AcmeClient  # type: ignore[index]
