"""Recycled hosts that come back within the Alt-Svc max-age (pure bookkeeping)."""

from __future__ import annotations

from certagent.runtime.recycles import RecycleLog


def test_a_host_back_within_the_window_counts_once() -> None:
    log = RecycleLog(window=60.0)
    log.recycled({"a.test", "b.test"}, idle=30.0, now=100.0)
    assert log.loaded("a.test", 150.0) is True
    assert log.loaded("a.test", 151.0) is False  # counted once per recycle
    assert log.loaded("b.test", 161.0) is False  # back after the window
    assert log.loaded("never.test", 100.0) is False
    assert log.status()["returns"] == 1


def test_idle_times_of_recycled_slots_are_summarised() -> None:
    log = RecycleLog(window=60.0)
    assert log.status()["recycled_idle_s"] == {
        "recycles": 0, "min": None, "p10": None, "median": None
    }  # fmt: skip
    for idle in (5.0, 1.0, 3.0, -2.0):  # a clock step backwards counts as 0
        log.recycled((), idle, now=10.0)
    assert log.status()["recycled_idle_s"] == {"recycles": 4, "min": 0.0, "p10": 0.0, "median": 2.0}


def test_memory_is_bounded_and_window_zero_remembers_no_host() -> None:
    log = RecycleLog(window=60.0, keep=3)
    for i in range(10):
        log.recycled({f"h{i}.test"}, 1.0, now=float(i))
    assert not log.loaded("h0.test", 10.0)  # forgotten: only the latest 3 are kept
    assert log.loaded("h9.test", 10.0)
    off = RecycleLog(window=0.0)
    off.recycled({"a.test"}, 1.0, now=0.0)
    assert not off.loaded("a.test", 0.0)
    assert off.status()["recycled_idle_s"]["recycles"] == 1
