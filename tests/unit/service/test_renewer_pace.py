"""The renewer's pace (issue 29): paced by work, most urgent first, faster when late,
timings scaled to the remaining lifetime, and the backlog and pace in ``status``.

Same fake CA and in-memory store as ``test_renewer.py``; the loop (:meth:`Renewer.run`)
runs for real with a tick far longer than the test, so whatever renews does so
because work freed a place, never because a tick came.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest

from certagent.acme import CaUnavailable
from certagent.certs.pem import parse_bundle
from certagent.cli.statustext import _print_renewal
from certagent.service.renewer import Renewer
from certagent.store.renewals import DueRenewal
from certagent.testing.certs import issue
from tests.memstore import MemoryStore
from tests.unit.service.test_renewer import T0, Clock, FakeCa, Node, make_node, make_store

#: longer than any test here: a renewal that waited for the tick would time the test out
LONG_TICK = 3600.0
#: how long a test waits for the loop to reach an outcome (real seconds)
OUTCOME = 10.0


async def issued_at(
    store: MemoryStore, ca: FakeCa, name: str, lifetime: float, renew_after: float
) -> DueRenewal:
    """``name`` issued now for ``lifetime`` s, scheduled ``renew_after`` s from now."""
    start = dt.datetime.fromtimestamp(ca.clock.now, dt.UTC)
    chain, key = issue(
        ca.ca, name, not_before=start, not_after=start + dt.timedelta(seconds=lifetime)
    )
    bundle = parse_bundle(chain, key)
    locks = store.issuance().locks
    lease = await locks.acquire(name, "setup", 30)
    assert lease is not None
    await locks.add_issued(bundle, lease, renew_at=ca.clock.now + renew_after)
    await locks.release(lease)
    entry = await store.issuance().renewals.entry(name)
    assert entry is not None
    return entry


def tune(renewer: Renewer, **changes: object) -> None:
    renewer.settings = dataclasses.replace(renewer.settings, tick=LONG_TICK, **changes)  # type: ignore[arg-type]


def one_node(
    monkeypatch: pytest.MonkeyPatch, ca: FakeCa | None = None, **changes: object
) -> tuple[Clock, MemoryStore, FakeCa, Node]:
    """A store, a CA and a node whose renewer has a one-hour tick and ``changes``."""
    clock = ca.clock if ca is not None else Clock()
    store = make_store(clock)
    ca = ca or FakeCa(clock)
    node = make_node(store, ca, monkeypatch)
    tune(node.renewer, **changes)
    return clock, store, ca, node


async def run_until(renewer: Renewer, done: object) -> None:
    """Run the renewer's loop until ``done()`` holds (OUTCOME s at most), then stop it."""
    stop = asyncio.Event()
    loop = asyncio.create_task(renewer.run(stop))
    try:
        async with asyncio.timeout(OUTCOME):
            while not done():  # type: ignore[operator]
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await loop
        await renewer.wait_idle()


async def test_due_renewals_run_back_to_back_not_one_batch_per_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """12 due names, 2 at once, a one-hour tick: all renewed within seconds."""
    clock, store, ca, node = one_node(monkeypatch, concurrency=2, late_concurrency=2)
    names = [f"n{i}.renew.test" for i in range(12)]
    for name in names:
        await issued_at(store, ca, name, 3000.0, 1500.0)
    clock.now += 1501
    await run_until(node.renewer, lambda: len(ca.orders) == len(names))
    assert sorted(ca.orders) == sorted(names)  # each once
    status = await node.renewer.status()
    assert status["backlog"] == 0 and status["clear_seconds"] == 0.0
    assert status["pace"] > 0 and status["done"] == len(names)


async def test_the_most_urgent_renews_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Due together, one at a time: earliest expiry first, whatever the renewal times."""
    clock, store, ca, node = one_node(monkeypatch, concurrency=1, late_concurrency=1)
    # renewal times in the opposite order of the expiries
    for name, lifetime, renew_after in (
        ("late.renew.test", 9000.0, 100.0),
        ("soon.renew.test", 3000.0, 300.0),
        ("mid.renew.test", 6000.0, 200.0),
    ):
        await issued_at(store, ca, name, lifetime, renew_after)
    clock.now += 400
    await run_until(node.renewer, lambda: len(ca.orders) == 3)
    assert ca.orders == ["soon.renew.test", "mid.renew.test", "late.renew.test"]


@pytest.mark.parametrize(("waited", "late"), [(1.0, False), (600.0, True)])
async def test_late_renewals_raise_the_concurrency_to_the_late_ceiling(
    monkeypatch: pytest.MonkeyPatch, waited: float, late: bool
) -> None:
    clock, store, ca, node = one_node(monkeypatch, concurrency=2, late_concurrency=5)
    for i in range(8):
        await issued_at(store, ca, f"n{i}.renew.test", 86400.0, 3600.0)
    clock.now += 3600 + waited
    started = await node.renewer.tick()
    await node.renewer.wait_idle()
    assert started == (5 if late else 2)
    assert (await node.renewer.status())["concurrency"] == (5 if late else 2)


async def test_a_short_certificate_takes_a_short_lease_and_a_short_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 s certificate at half its life: a 25 s lease, the issuer's backoff capped at
    1/8 of the 150 s left (not the issuer's 80 s), the retry planned within it."""
    failing = FakeCa(Clock(), lifetime=300.0, fail=[CaUnavailable("down")] * 4)
    clock, store, ca, node = one_node(monkeypatch, failing)
    # the settings' lease: a 60 s order timeout's 75 s
    node.issuer.settings = dataclasses.replace(node.issuer.settings, order_timeout=60.0)
    name = "short.renew.test"
    entry = await issued_at(store, ca, name, 300.0, 150.0)
    ttls: list[float] = []
    locks = node.issuer.issuance.locks
    acquire = locks.acquire

    async def recording(leased: str, node: str, ttl: float):  # type: ignore[no-untyped-def]
        if leased == name:  # not the account's lock
            ttls.append(ttl)
        return await acquire(leased, node, ttl)

    monkeypatch.setattr(locks, "acquire", recording)
    for failures in range(1, 5):
        clock.now = max(clock.now, (await store.issuance().renewals.entry(name)).renew_at)  # type: ignore[union-attr]
        await node.renewer.tick()
        await node.renewer.wait_idle()
        left = entry.not_after - clock.now
        state = await store.issuance().limits.name_state(name)
        assert state is not None and state.failures == failures
        assert state.not_before - clock.now <= left / 8 * 1.1 + 0.001
        retry = await store.issuance().renewals.entry(name)
        assert retry is not None and retry.renew_at - clock.now <= left / 8 * 1.1 + 0.001
    assert len(ttls) == 4 and ttls[0] == 25.0  # 150 s left / 6, not the settings' 75 s
    assert all(20.0 <= ttl <= 25.0 for ttl in ttls)  # shrinking with what is left
    assert clock.now < entry.not_after - 30  # four failures cost a fraction of the margin
    # the CA is back: renewed before expiry
    clock.now = (await store.issuance().renewals.entry(name)).renew_at  # type: ignore[union-attr]
    await node.renewer.tick()
    await node.renewer.wait_idle()
    assert node.renewer.counters.done == 1
    assert (await store.lookup_all(name))[0].bundle.not_after.timestamp() > entry.not_after


async def test_status_shows_the_backlog_and_the_time_to_clear_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node = one_node(monkeypatch, concurrency=1, late_concurrency=1)
    for i in range(4):
        await issued_at(store, ca, f"n{i}.renew.test", 86400.0, 3600.0)
    clock.now = T0 + 3601
    status = await node.renewer.status()
    assert status["backlog"] == 4 and status["pace"] == 0.0
    assert status["clear_seconds"] is None  # nothing renewed here yet: no pace to divide by
    await node.renewer.tick()
    await node.renewer.wait_idle()
    clock.now += 10  # one renewal in the pace window (the last 300 s)
    status = await node.renewer.status()
    assert status["backlog"] == 3 and status["done"] == 1
    assert status["pace"] == pytest.approx(1 / 300, rel=0.01)
    assert status["clear_seconds"] == pytest.approx(900, rel=0.01)
    clock.now += 300  # out of the window: no pace, nothing to divide by
    assert (await node.renewer.status())["clear_seconds"] is None


async def test_status_text_says_the_pace_and_the_backlog(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock, store, ca, node = one_node(monkeypatch, concurrency=1, late_concurrency=3)
    for i in range(5):
        await issued_at(store, ca, f"n{i}.renew.test", 86400.0, 3600.0)
    clock.now = T0 + 4200  # due for 600 s: late, so 3 start at once
    await node.renewer.tick()
    await node.renewer.wait_idle()
    clock.now += 60
    _print_renewal(await node.renewer.status())
    text = capsys.readouterr().out
    assert "5 scheduled, 2 due" in text
    assert "pace       0.6 renewals a minute here (last 5 min), 0 running of 3" in text
    assert "(renewals late: raised); backlog 2, cleared in 200 s at this pace" in text


async def test_status_with_the_fleet_pace_clears_at_the_fleet_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, store, ca, node = one_node(monkeypatch)
    for i in range(6):
        await issued_at(store, ca, f"n{i}.renew.test", 86400.0, 3600.0)
    clock.now = T0 + 3601
    status = await node.renewer.status(fleet=(0.5, 2))  # two nodes, one renewal every 2 s
    assert status["fleet_pace"] == 0.5 and status["fleet_renewing_nodes"] == 2
    assert status["fleet_clear_seconds"] == 12.0 and status["clear_seconds"] is None
    assert (await node.renewer.status(fleet=(0.0, 0)))["fleet_clear_seconds"] is None
    assert "fleet_pace" not in await node.renewer.status()  # no board asked


async def test_the_loop_wakes_when_the_next_entry_comes_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing due, a one-hour tick, an entry due in half a second: renewed then, not an
    hour later (a read looks a tick ahead), and without polling meanwhile."""
    clock, store, ca, node = one_node(monkeypatch)
    await issued_at(store, ca, "soon.renew.test", 3000.0, 0.5)

    async def time_passes() -> None:
        while True:
            await asyncio.sleep(0.05)
            clock.now += 0.05

    ticker = asyncio.create_task(time_passes())
    try:
        await run_until(node.renewer, lambda: ca.orders == ["soon.renew.test"])
    finally:
        ticker.cancel()
    assert node.renewer.counters.ticks <= 5, node.renewer.counters
