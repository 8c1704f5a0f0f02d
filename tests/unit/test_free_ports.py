"""Free loopback ports for the test harness: one slice of the range per pytest-xdist worker."""

from __future__ import annotations

from certagent.testing.processes import worker_slice

TWO = {"PYTEST_XDIST_WORKER_COUNT": "2"}


def test_outside_xdist_the_whole_range_is_used() -> None:
    assert worker_slice(10000, 32768, {}) == (10000, 32768)


def test_two_workers_get_disjoint_halves_that_cover_the_range() -> None:
    first = worker_slice(10000, 32768, {**TWO, "PYTEST_XDIST_WORKER": "gw0"})
    second = worker_slice(10000, 32768, {**TWO, "PYTEST_XDIST_WORKER": "gw1"})
    assert first == (10000, 21384)
    assert second == (21384, 32768)


def test_odd_values_fall_back_to_the_whole_range() -> None:
    for env in (
        {"PYTEST_XDIST_WORKER": "master", "PYTEST_XDIST_WORKER_COUNT": "2"},
        {"PYTEST_XDIST_WORKER": "gw2", "PYTEST_XDIST_WORKER_COUNT": "2"},
        {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "0"},
        {"PYTEST_XDIST_WORKER": "gw0"},
    ):
        assert worker_slice(10000, 32768, env) == (10000, 32768), env
