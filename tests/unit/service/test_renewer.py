"""The renewer against the in-memory store: due entries, leases, failures, pauses, ARI, permission.

The ACME exchange is a fake CA (``obtain_certificate`` replaced) issuing certificates
of a chosen lifetime from a test CA; ARI answers come from a fake client.  Time is
the store's clock, moved by the tests.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import pytest

from certagent.acme import CaUnavailable, ChallengeSolver, IssuedCertificate, RenewalInfo
from certagent.acme.csr import CertKeyType
from certagent.certs.pem import parse_bundle
from certagent.service import issuer as issuer_module
from certagent.service.acmeaccount import AccountKeeper, AccountSettings
from certagent.service.issuer import Issuer, IssuerSettings
from certagent.service.permission import Permission
from certagent.service.renewer import Renewer, RenewerSettings
from certagent.service.renewtime import RenewPolicy
from certagent.store.renewals import DueRenewal
from certagent.testing.certs import issue, make_ca
from tests.memstore import MemoryStore

NAME = "shop.renew.test"
T0 = 1_900_000_000.0
LIFETIME = 90 * 86400.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeCa:
    """Stands in for :func:`certagent.acme.obtain_certificate`: certificates from ``clock`` on."""

    clock: Clock
    lifetime: float = LIFETIME
    orders: list[str] = field(default_factory=list)
    replaces: list[str | None] = field(default_factory=list)
    fail: list[BaseException] = field(default_factory=list)
    ca: Any = field(default_factory=make_ca)

    def certificate(self, name: str) -> tuple[bytes, bytes]:
        start = dt.datetime.fromtimestamp(self.clock.now, dt.UTC)
        return issue(
            self.ca, name, not_before=start, not_after=start + dt.timedelta(seconds=self.lifetime)
        )

    async def obtain(
        self, client: object, names: Sequence[str], solver: object, **kwargs: Any
    ) -> IssuedCertificate:
        self.orders.append(names[0])
        self.replaces.append(kwargs.get("replaces"))
        await asyncio.sleep(0)
        if self.fail:
            raise self.fail.pop(0)
        chain, key = self.certificate(names[0])
        return IssuedCertificate(tuple(names), "ecdsa", chain, key, "https://ca/order/1")


@dataclass
class Directory:
    renewal_info: str | None


class FakeClient:
    """The account keeper's client: a directory with or without ARI, and its answers."""

    ari: ClassVar[Callable[[str], RenewalInfo] | None] = None
    asked: ClassVar[list[str]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.account_url = "https://ca/acct/1"
        self.account_key = None

    async def register(self, **kwargs: object) -> object:
        return type("Account", (), {"url": self.account_url})()

    async def directory(self) -> Directory:
        return Directory("https://ca/ari" if FakeClient.ari is not None else None)

    async def renewal_info(self, ident: str) -> RenewalInfo:
        assert FakeClient.ari is not None
        FakeClient.asked.append(ident)
        return FakeClient.ari(ident)

    async def close(self) -> None:
        return None


@pytest.fixture(autouse=True)
def no_ari() -> None:
    FakeClient.ari = None
    FakeClient.asked = []


@dataclass
class Node:
    issuer: Issuer
    renewer: Renewer


def make_node(
    store: MemoryStore,
    ca: FakeCa,
    monkeypatch: pytest.MonkeyPatch,
    *,
    node: str = "node-1",
    permission: Permission | None = None,
    budget: Any = None,
    key_types: tuple[CertKeyType, ...] = ("ecdsa",),
) -> Node:
    monkeypatch.setattr(issuer_module, "obtain_certificate", ca.obtain)
    issuance = store.issuance()
    accounts = AccountKeeper(
        AccountSettings("https://ca/dir"),
        issuance.accounts,
        issuance.locks,
        node,
        client_factory=FakeClient,  # type: ignore[arg-type]
    )
    solver: ChallengeSolver = type("Solver", (), {"challenge_types": ("http-01",)})()  # type: ignore[assignment]
    policy = RenewPolicy(jitter=0.0, retry_min=60.0, retry_max=3600.0, margin=3600.0)
    issuer = Issuer(
        issuance,
        store,
        permission or Permission(suffixes=("renew.test",)),
        accounts,
        solver,
        node,
        IssuerSettings(
            key_types=key_types, order_timeout=5, backoff_min=10, backoff_max=80, renew=policy
        ),
        budget=budget,
        clock=ca.clock,
        rand=lambda: 0.0,
    )
    renewer = Renewer(
        issuer,
        issuance.renewals,
        RenewerSettings(tick=1.0, batch=10, concurrency=4, overdue_grace=600.0, policy=policy),
        writer=store,
        clock=ca.clock,
        rand=lambda: 0.0,
    )
    return Node(issuer, renewer)


async def issued(store: MemoryStore, ca: FakeCa, name: str = NAME) -> DueRenewal:
    """A certificate for ``name`` issued now through the store's fenced path, scheduled."""
    chain, key = ca.certificate(name)
    bundle = parse_bundle(chain, key)
    locks = store.issuance().locks
    lease = await locks.acquire(name, "setup", 30)
    assert lease is not None
    renew_at = bundle.not_before.timestamp() + 2 / 3 * LIFETIME
    await locks.add_issued(bundle, lease, renew_at=renew_at)
    await locks.release(lease)
    entry = await store.issuance().renewals.entry(name)
    assert entry is not None
    return entry


async def run_tick(renewer: Renewer) -> int:
    started = await renewer.tick()
    await renewer.wait_idle()
    return started


def make_store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


class Scene(NamedTuple):
    clock: Clock
    store: MemoryStore
    ca: FakeCa
    node: Node
    old: DueRenewal  # NAME's schedule entry


async def scene(
    monkeypatch: pytest.MonkeyPatch, *, fail: Sequence[BaseException] = (), **node: Any
) -> Scene:
    """A store, a CA (failing with ``fail`` first) and a node (``node``: make_node's
    options), with NAME issued and scheduled."""
    clock = Clock()
    store = make_store(clock)
    ca = FakeCa(clock, fail=list(fail))
    made = make_node(store, ca, monkeypatch, **node)
    return Scene(clock, store, ca, made, await issued(store, ca))


# --- the schedule --------------------------------------------------------------------------


async def test_a_tick_with_nothing_due_renews_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, _, ca, node, _ = await scene(monkeypatch)
    clock.now = T0 + 59 * 86400
    assert await run_tick(node.renewer) == 0
    assert ca.orders == []
    assert node.renewer.counters.due_seen == 0


async def test_a_due_certificate_is_renewed_and_scheduled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 5
    assert await run_tick(node.renewer) == 1
    assert ca.orders == [NAME]
    assert ca.replaces == [None]  # no ARI at this CA
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None
    assert entry.renew_at == pytest.approx(clock.now + 2 / 3 * LIFETIME, abs=2)
    assert entry.not_after == pytest.approx(clock.now + LIFETIME, abs=2)
    best = (await store.lookup_all(NAME))[0]
    assert best.bundle.not_after.timestamp() == pytest.approx(entry.not_after, abs=1)
    assert node.renewer.counters.done == 1
    assert sum(node.renewer.renew_seconds.snapshot()["counts"]) == 1
    # renewed: the next tick finds nothing due
    assert await run_tick(node.renewer) == 0 and ca.orders == [NAME]


async def test_the_replaced_record_is_deleted_after_a_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, _, node, old = await scene(monkeypatch)
    (before,) = await store.lookup_all(NAME)
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    (after,) = await store.lookup_all(NAME)
    assert after.id != before.id
    assert [c.kind for c in store.events[-2:]] == ["put", "delete"]  # the new one first


async def test_two_nodes_renew_a_due_name_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, store, ca, first, old = await scene(monkeypatch, node="node-1")
    second = make_node(store, ca, monkeypatch, node="node-2")
    clock.now = old.renew_at + 1
    await asyncio.gather(first.renewer.tick(), second.renewer.tick())
    await asyncio.gather(first.renewer.wait_idle(), second.renewer.wait_idle())
    assert ca.orders == [NAME]
    # and later ticks of either find the name scheduled far ahead
    for node in (first, second):
        await run_tick(node.renewer)
    assert ca.orders == [NAME]


async def test_a_name_leased_elsewhere_is_left_to_that_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 1
    held = await store.issuance().locks.acquire(NAME, "node-dead", 75)
    assert held is not None
    await run_tick(node.renewer)
    assert ca.orders == [] and node.renewer.counters.elsewhere == 1
    # the dead node's lease lapses: this node renews
    clock.now += 80
    await run_tick(node.renewer)
    assert ca.orders == [NAME]


async def test_an_entry_renewed_meanwhile_is_not_ordered_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 1
    stale = DueRenewal(NAME, old.renew_at, old.not_after)
    await issued(store, ca)  # another node renewed it: a later entry
    await node.renewer.renew(stale)
    assert ca.orders == []


# --- failures ------------------------------------------------------------------------------


async def test_a_failing_renewal_backs_off_and_retries_until_it_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(
        monkeypatch, fail=[CaUnavailable("connection refused")] * 3
    )
    clock.now = old.renew_at + 1
    waits = []
    for _ in range(3):
        await run_tick(node.renewer)
        entry = await store.issuance().renewals.entry(NAME)
        assert entry is not None
        waits.append(entry.renew_at - clock.now)
        clock.now = entry.renew_at + 1
    assert len(ca.orders) == 3
    assert waits[0] >= 60 and waits[1] > waits[0] and waits[2] > waits[1]  # backing off
    status = await node.renewer.status()
    assert status["failing"] == 1 and status["failed"] == 3
    assert node.renewer.failing_for(NAME) is not None
    await run_tick(node.renewer)
    assert len(ca.orders) == 4 and node.renewer.counters.done == 1
    assert node.renewer.failing_for(NAME) is None


async def test_retries_near_expiry_are_never_planned_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, _, node, old = await scene(monkeypatch, fail=[CaUnavailable("down")] * 50)
    clock.now = old.not_after - 1800  # half an hour left, inside the margin
    await run_tick(node.renewer)
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None
    assert entry.renew_at <= max(clock.now + 80, old.not_after)  # the issuer's backoff at most


async def test_while_the_ca_asked_to_wait_no_renewal_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 1
    await store.issuance().limits.pause(clock.now + 30)
    assert await run_tick(node.renewer) == 0
    assert ca.orders == []
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None and entry.renew_at <= clock.now  # still due
    clock.now += 31
    assert await run_tick(node.renewer) == 1
    assert ca.orders == [NAME]


class Budget:
    def __init__(self, waits: list[float]) -> None:
        self.waits = waits
        self.asked: list[tuple[str, bool]] = []

    async def take(self, name: str, *, renewal: bool) -> float:
        self.asked.append((name, renewal))
        return self.waits.pop(0) if self.waits else 0.0


async def test_an_empty_budget_postpones_the_renewal(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = Budget([40.0])
    clock, store, ca, node, old = await scene(monkeypatch, budget=budget)
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    assert ca.orders == [] and budget.asked == [(NAME, True)]
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None and entry.renew_at == pytest.approx(clock.now + 40)
    assert node.renewer.counters.postponed == 1
    clock.now += 41
    await run_tick(node.renewer)
    assert ca.orders == [NAME]


async def test_a_budget_refusal_after_the_first_kind_postpones_the_renewal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budget = Budget([0.0, 40.0])  # the first kind's unit, then none for the second
    clock, store, ca, node, old = await scene(
        monkeypatch, budget=budget, key_types=("ecdsa", "rsa")
    )
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    assert ca.orders == [NAME] and budget.asked == [(NAME, True)] * 2
    kept = {s.id for s in await store.lookup_all(NAME)}
    assert len(kept) == 2  # the new one stored, the old one kept
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None and entry.renew_at == pytest.approx(clock.now + 40)
    assert node.renewer.counters.postponed == 1
    clock.now += 41
    await run_tick(node.renewer)  # both kinds ordered, what they replace retired
    assert ca.orders == [NAME] * 3 and node.renewer.counters.done == 1
    renewed = {s.id for s in await store.lookup_all(NAME)}
    assert len(renewed) == 2 and not renewed & kept


# --- permission ----------------------------------------------------------------------------


async def test_a_name_denied_now_is_taken_off_the_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(
        monkeypatch, permission=Permission(suffixes=("other.test",))
    )
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    assert ca.orders == []
    assert await store.issuance().renewals.entry(NAME) is None
    assert node.renewer.counters.unscheduled == 1
    assert await store.lookup_all(NAME)  # still served until it expires


async def test_an_unreachable_ask_endpoint_postpones(monkeypatch: pytest.MonkeyPatch) -> None:
    ask = Permission(ask_url="http://127.0.0.1:9/ask", ask_timeout=0.5)
    clock, store, ca, node, old = await scene(monkeypatch, permission=ask)
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    await ask.close()
    assert ca.orders == []
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None and entry.renew_at == pytest.approx(clock.now + 60)


async def test_a_deleted_certificate_is_not_renewed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    (record,) = await store.lookup_all(NAME)
    await store.delete(record.id)
    clock.now = old.renew_at + 1
    await run_tick(node.renewer)
    assert ca.orders == []
    assert await store.issuance().renewals.entry(NAME) is None


# --- ARI -----------------------------------------------------------------------------------


def window(start: float, end: float, retry_after: float | None = 3600.0) -> RenewalInfo:
    return RenewalInfo(
        dt.datetime.fromtimestamp(start, dt.UTC),
        dt.datetime.fromtimestamp(end, dt.UTC),
        retry_after=retry_after,
    )


async def test_ari_window_ahead_moves_the_entry_without_ordering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 1
    FakeClient.ari = lambda ident: window(clock.now + 7200, clock.now + 7300)
    await run_tick(node.renewer)
    assert ca.orders == [] and len(FakeClient.asked) == 1
    entry = await store.issuance().renewals.entry(NAME)
    # asked again after its Retry-After (1 h), sooner than the window
    assert entry is not None and entry.renew_at == pytest.approx(clock.now + 3600)
    assert node.renewer.counters.ari_moved == 1


async def test_ari_window_moved_earlier_renews_in_it_and_says_what_it_replaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = T0 + 86400  # long before the default moment ...
    await store.issuance().renewals.schedule(NAME, clock.now, old.not_after)  # ... ARI asks
    FakeClient.ari = lambda ident: window(clock.now - 600, clock.now - 60)  # an incident
    await run_tick(node.renewer)
    assert ca.orders == [NAME]
    assert ca.replaces == [FakeClient.asked[0]]
    assert FakeClient.asked[0].count(".") == 1  # AKI.serial


async def test_ari_window_in_a_later_check_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = start = old.renew_at + 1
    FakeClient.ari = lambda ident: window(start + 100, start + 200, retry_after=10 * 3600)
    await run_tick(node.renewer)
    entry = await store.issuance().renewals.entry(NAME)
    assert entry is not None and start + 100 <= entry.renew_at < start + 200
    clock.now = entry.renew_at + 1
    await run_tick(node.renewer)
    assert ca.orders == [NAME]


# --- status --------------------------------------------------------------------------------


async def test_status_counts_scheduled_due_and_overdue(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    store = make_store(clock)
    ca = FakeCa(clock)
    node = make_node(store, ca, monkeypatch)
    for i in range(3):
        await issued(store, ca, f"n{i}.renew.test")
    renewals = store.issuance().renewals
    await renewals.schedule("n0.renew.test", T0 - 3600, T0 + LIFETIME)  # overdue (grace 600)
    await renewals.schedule("n1.renew.test", T0 - 60, T0 + LIFETIME)  # due, not overdue
    status = await node.renewer.status()
    assert (status["scheduled"], status["due"], status["overdue"]) == (3, 2, 1)
    assert [e["name"] for e in status["overdue_names"]] == ["n0.renew.test"]  # type: ignore[union-attr]


async def test_a_renewal_with_a_shorter_lifetime_still_replaces_the_old_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node, old = await scene(monkeypatch)
    clock.now = old.renew_at + 1
    ca.lifetime = 6 * 86400.0  # a shorter profile: expires before the old one
    await run_tick(node.renewer)
    (after,) = await store.lookup_all(NAME)
    assert after.bundle.not_after.timestamp() == pytest.approx(clock.now + 6 * 86400, abs=2)


async def test_an_ask_endpoint_answering_5xx_postpones_and_403_unschedules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiohttp import web

    status = {"now": 503}

    async def ask(request: web.Request) -> web.Response:
        return web.Response(status=status["now"])

    app = web.Application()
    app.router.add_get("/ask", ask)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        permission = Permission(ask_url=f"http://127.0.0.1:{port}/ask", deny_ttl=0)
        clock, store, ca, node, old = await scene(monkeypatch, permission=permission)
        clock.now = old.renew_at + 1
        await run_tick(node.renewer)
        entry = await store.issuance().renewals.entry(NAME)
        assert entry is not None and entry.renew_at == pytest.approx(clock.now + 60)
        status["now"] = 403
        clock.now += 61
        await run_tick(node.renewer)
        assert await store.issuance().renewals.entry(NAME) is None
        assert ca.orders == []
        await permission.close()
    finally:
        await runner.cleanup()
