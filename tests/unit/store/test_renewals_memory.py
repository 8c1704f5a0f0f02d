"""The renewal schedule and budget of one node (store/localrenewals.py, store/renewing.py).

The sorted schedule and the fixed-window budget as pure objects, then the whole
:class:`~certagent.store.renewals.Renewals` role through tests/memstore.py (as
the directory store and the service's tests use it): a schedule only for names
a record holds, ``manage``, deletes that unschedule, ``add_issued`` that
schedules in its write, and nothing scheduled by a lease that lapsed.  Also the
Redis store's encoding of an entry (pure).
"""

from __future__ import annotations

import random

import pytest

from certagent.errors import InvalidHostname, LeaseLost, NotFound, StoreUnavailable
from certagent.store.issuance import ACME_MANAGED, Issuance
from certagent.store.localrenewals import LocalBudget, Schedule
from certagent.store.redis._renewals import decode_member, scheduled
from certagent.store.renewals import BudgetWindow, DueRenewal
from certagent.store.renewing import (
    check_due_limit,
    check_windows,
    format_time,
    window_index,
    window_wait,
)
from certagent.testing.certs import CA
from tests.memstore import MemoryStore
from tests.unit.store.memroles import NOW, Clock, bundle

# --- the sorted schedule ----------------------------------------------------------------------


def test_schedule_due_is_earliest_first_up_to_now_and_the_limit() -> None:
    schedule = Schedule([DueRenewal("b.test", 20.0, 1.0), DueRenewal("a.test", 20.0, 2.0)])
    schedule.set(DueRenewal("c.test", 10.0, 3.0))
    schedule.set(DueRenewal("d.test", 30.0, 4.0))
    assert [e.name for e in schedule.due(20.0, 10)] == ["c.test", "a.test", "b.test"]
    assert [e.name for e in schedule.due(20.0, 2)] == ["c.test", "a.test"]
    assert schedule.due(9.9, 10) == []
    assert schedule.count(20.0) == (4, 3)
    schedule.set(DueRenewal("c.test", 40.0, 5.0))  # moved: once, at its new place
    assert [e.name for e in schedule.entries()] == ["a.test", "b.test", "d.test", "c.test"]
    assert schedule.drop("a.test") == DueRenewal("a.test", 20.0, 2.0)
    assert schedule.drop("a.test") is None
    assert schedule.count(100.0) == (3, 3) and len(schedule) == 3


def test_schedule_agrees_with_sorting_after_random_moves() -> None:
    rng = random.Random(20)
    schedule = Schedule()
    model: dict[str, float] = {}
    for _ in range(2000):
        name = f"n{rng.randrange(200)}.test"
        if rng.random() < 0.2:
            schedule.drop(name)
            model.pop(name, None)
        else:
            at = float(rng.randrange(100))
            schedule.set(DueRenewal(name, at, 0.0))
            model[name] = at
    now = 50.0
    expected = sorted((at, name) for name, at in model.items() if at <= now)
    assert [(e.renew_at, e.name) for e in schedule.due(now, 10_000)] == expected
    assert schedule.count(now) == (len(model), len(expected))


# --- windows and the budget -------------------------------------------------------------------


def test_windows_are_fixed_from_the_epoch() -> None:
    minute = BudgetWindow("global", 1, 60)
    assert window_index(minute, 119.9) == 1 and window_index(minute, 120.0) == 2
    assert window_wait(minute, 130.0) == pytest.approx(50.0)
    assert window_wait(minute, 120.0) == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("window", "error"),
    [
        (BudgetWindow("", 1, 60), "budget key"),
        (BudgetWindow("a b", 1, 60), "budget key"),
        (BudgetWindow("{tag}", 1, 60), "budget key"),
        (BudgetWindow("ok", -1, 60), "limit"),
        (BudgetWindow("ok", 1, 0), "seconds"),
        (BudgetWindow("ok", 1, float("inf")), "seconds"),
        (BudgetWindow("ok", 1, 400 * 86_400), "seconds"),
    ],
)
def test_bad_windows_are_refused(window: BudgetWindow, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_windows((window,))


def test_the_same_window_twice_is_refused_and_limits_are_bounded() -> None:
    window = BudgetWindow("global", 1, 60)
    with pytest.raises(ValueError, match="twice"):
        check_windows((window, window))
    assert check_windows((window, BudgetWindow("global", 1, 3600))) != ()
    with pytest.raises(ValueError):
        check_due_limit(0)
    with pytest.raises(ValueError):
        check_due_limit(10_001)


def test_budget_is_all_or_nothing_and_says_how_long_to_wait() -> None:
    budget = LocalBudget()
    hour, minute = BudgetWindow("global", 2, 3600), BudgetWindow("domain:x.test", 1, 60)
    t = NOW + 10  # 10 s into a minute and an hour
    assert budget.spend((hour, minute), t) == 0.0
    assert budget.spend((hour, minute), t + 5) == pytest.approx(45.0)
    assert budget.spend((hour,), t + 6) == 0.0  # the refusal took nothing from the hour
    assert budget.spend((hour, minute), t + 7) == pytest.approx(3600 - 17)  # both: the longer
    assert budget.spend((minute,), t + 50) == 0.0  # a new minute
    assert budget.spend((BudgetWindow("zero", 0, 60),), t) == pytest.approx(50.0)
    assert budget.spend((), t) == 0.0


def test_budget_forgets_windows_that_ended() -> None:
    budget = LocalBudget()
    for i in range(3000):
        assert budget.spend((BudgetWindow(f"domain:{i}.test", 1, 60),), NOW + i) == 0.0
    assert len(budget._used) < 1100  # the ended minutes were dropped as it grew


# --- the Renewals role, through the memory store ----------------------------------------------


async def test_only_a_name_a_record_holds_is_scheduled(
    store: MemoryStore, roles: Issuance, ca: CA
) -> None:
    renewals = roles.renewals
    await renewals.schedule("nobody.test", NOW, NOW + 10)
    assert await renewals.entry("nobody.test") is None
    await store.add(bundle(ca, "a.test", "b.test"))
    await renewals.schedule("A.test", NOW + 5, NOW + 100)
    assert await renewals.entry("a.test") == DueRenewal("a.test", NOW + 5, NOW + 100)
    assert await renewals.due(NOW + 5, 10) == [DueRenewal("a.test", NOW + 5, NOW + 100)]
    assert await renewals.due(NOW + 4, 10) == []
    assert await renewals.count(NOW) == (1, 0)
    with pytest.raises(InvalidHostname):
        await renewals.schedule("not a name", NOW, NOW)
    with pytest.raises(ValueError, match="renew_at"):
        await renewals.schedule("a.test", float("nan"), NOW)


async def test_a_delete_unschedules_only_the_names_left_without_a_record(
    store: MemoryStore, roles: Issuance, ca: CA
) -> None:
    renewals = roles.renewals
    first = await store.add(bundle(ca, "x.test", "y.test"))
    await store.add(bundle(ca, "y.test"))
    await renewals.schedule("x.test", NOW, NOW)
    await renewals.schedule("y.test", NOW, NOW)
    await store.delete(first.id)
    assert [e.name for e in await renewals.due(NOW, 10)] == ["y.test"]


async def test_manage_marks_the_records_of_a_name_and_schedules_it(
    store: MemoryStore, roles: Issuance, ca: CA
) -> None:
    imported = await store.add(bundle(ca, "imp.test"))
    assert imported.managed == ""
    await roles.renewals.manage("imp.test", NOW + 60)
    got = await store.get(imported.id)
    assert got is not None and got.managed == ACME_MANAGED
    assert await roles.renewals.entry("imp.test") == DueRenewal(
        "imp.test", NOW + 60, imported.not_after.timestamp()
    )
    with pytest.raises(NotFound):
        await roles.renewals.manage("missing.test", NOW)


async def test_add_issued_schedules_unless_its_lease_lapsed(
    roles: Issuance, clock: Clock, ca: CA
) -> None:
    issued = bundle(ca, "iss.test")
    stale = await roles.locks.acquire("iss.test", "node-1", 10)
    assert stale is not None
    clock.now += 11
    current = await roles.locks.acquire("iss.test", "node-2", 10)
    assert current is not None
    with pytest.raises(LeaseLost):
        await roles.locks.add_issued(issued, stale, renew_at=NOW + 100)
    assert await roles.renewals.count(NOW + 1e9) == (0, 0)
    with pytest.raises(ValueError, match="renew_at"):
        await roles.locks.add_issued(issued, current, renew_at=float("inf"))
    await roles.locks.add_issued(issued, current, renew_at=NOW + 100)
    assert await roles.renewals.entry("iss.test") == DueRenewal(
        "iss.test", NOW + 100, issued.not_after.timestamp()
    )


async def test_the_schedule_is_unavailable_with_the_store(
    store: MemoryStore, roles: Issuance
) -> None:
    store.available = False
    with pytest.raises(StoreUnavailable):
        await roles.renewals.due(NOW, 10)


# --- the Redis store's encoding of an entry ---------------------------------------------------


def test_a_redis_member_carries_the_name_and_not_after() -> None:
    entry = scheduled(DueRenewal("a.test", 1_800_000_000.0, 1_800_086_400.5))
    assert (entry.name, entry.score, entry.member) == (
        "a.test",
        "1800000000",
        "a.test 1800086400.5",
    )
    assert decode_member(b"a.test 1800086400.5", 1_800_000_000.0) == DueRenewal(
        "a.test", 1_800_000_000.0, 1_800_086_400.5
    )
    assert decode_member(b"*.b.test 7", b"3.25") == DueRenewal("*.b.test", 3.25, 7.0)
    for bad in (b"a.test", b"a.test x", b"not a name 5", b""):
        with pytest.raises(ValueError):
            decode_member(bad, 1.0)
    assert format_time(5.0) == "5" and format_time(0.1) == "0.1"
