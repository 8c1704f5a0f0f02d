"""bench.versions.warm: the prober's samples cut into phases by their start times."""

from __future__ import annotations

from bench.versions import warm


def test_window_keeps_the_samples_started_within_it() -> None:
    samples = [0.001, 0.002, 0.003, 0.004]
    starts = [10.0, 10.5, 11.0, 11.5]
    assert warm.window(samples, starts, 10.5, 11.0) == [0.002, 0.003]
    assert warm.window(samples, starts, 12.0, 13.0) == []


def test_stats_in_ms_by_nearest_rank() -> None:
    got = warm.stats_ms([0.001] * 98 + [0.010, 0.100])
    assert got == {"count": 100, "p50": 1.0, "p90": 1.0, "p99": 10.0}
    assert warm.stats_ms([])["p99"] is None
