"""Every ~10 s: RSS, open descriptors and CPU seconds of every process the fleet needs.

Read from /proc (``VmRSS``, ``/proc/<pid>/fd``, utime + stime).  A role (``node0.agent``,
``node1.haproxy_worker``, ``pebble``...) keeps one series across restarts; each sample
names its PID, so the summaries can keep to one process where that matters: RSS trends
are computed over the samples of the role's last PID (a restarted agent starts small),
from its second minute on.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from certagent.testing import cpu_seconds, rss_kb

WINDOW = 600.0  # s: "the last 10 minutes vs the 10 before"
MIN_RUN_FOR_WINDOWS = 1200.0
PROCESS_WARMUP = 60.0  # s: a (re)started process's first minute is not "warm"


@dataclass(frozen=True)
class Sample:
    t: float  # seconds into the run
    pid: int
    rss_kb: int
    fds: int
    cpu_s: float


def read(pid: int, t: float) -> Sample | None:
    """One sample of ``pid``; None if it has gone meanwhile."""
    try:
        return Sample(t, pid, rss_kb(pid), len(os.listdir(f"/proc/{pid}/fd")), cpu_seconds(pid))
    except (OSError, ValueError):
        return None


class Sampler:
    """A thread sampling ``pids()`` every ``every`` seconds until stopped."""

    def __init__(self, pids: Callable[[], dict[str, int]], every: float, t0: float) -> None:
        self.pids, self.every, self.t0 = pids, every, t0
        self.series: dict[str, list[Sample]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def sample(self) -> None:
        t = time.time() - self.t0
        for role, pid in self.pids().items():
            got = read(pid, t)
            if got is not None:
                self.series.setdefault(role, []).append(got)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.sample()  # the last one, at the end of the run

    def summaries(self, duration: float) -> dict[str, dict[str, Any]]:
        return {role: summarize(samples, duration) for role, samples in sorted(self.series.items())}


def slope_mb_per_10min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, kB) points, in MB per 10 minutes."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return round(sxy / sxx * 600.0 / 1024.0, 3)


def _mean_mb(samples: list[Sample]) -> float | None:
    return round(sum(s.rss_kb for s in samples) / len(samples) / 1024, 2) if samples else None


def summarize(samples: list[Sample], duration: float) -> dict[str, Any]:
    """First/last/min/max RSS (MB), the warm slope, last 10 min vs the 10 before, fds, CPU."""
    mb = [round(s.rss_kb / 1024, 2) for s in samples]
    pids = list(dict.fromkeys(s.pid for s in samples))
    last_pid = [s for s in samples if s.pid == pids[-1]]
    # warm: after the first third of the run, and after the process's own first minute
    warm_from = max(duration / 3, last_pid[0].t + PROCESS_WARMUP)
    warm = [s for s in last_pid if s.t >= warm_from]
    # CPU: the last reading of each process (they only grow), summed over restarts
    cpu = sum(max(s.cpu_s for s in samples if s.pid == p) for p in pids)
    out: dict[str, Any] = {
        "samples": len(samples),
        "pids": len(pids),
        "rss_mb": {"first": mb[0], "last": mb[-1], "min": min(mb), "max": max(mb)},
        "rss_slope_mb_per_10min_warm": slope_mb_per_10min([(s.t, s.rss_kb) for s in warm]),
        "slope_samples": len(warm),
        "fds": {"min": min(s.fds for s in samples), "max": max(s.fds for s in samples)},
        "cpu_seconds": round(cpu, 1),
        "last10_vs_prev10_mb": None,
    }
    end = samples[-1].t
    if duration >= MIN_RUN_FOR_WINDOWS:
        last = [s for s in last_pid if s.t > end - WINDOW]
        prev = [s for s in last_pid if end - 2 * WINDOW < s.t <= end - WINDOW]
        last_mean, prev_mean = _mean_mb(last), _mean_mb(prev)
        if last_mean is not None and prev_mean is not None:
            out["last10_vs_prev10_mb"] = round(last_mean - prev_mean, 2)
        else:
            out["last10_vs_prev10_note"] = "the last process did not live 20 minutes (restarted)"
    return out
