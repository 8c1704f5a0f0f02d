"""The warm-host prober of a storm cell: one ``tlsload probe`` through an idle phase and the
storm, its samples cut into the two phases by their start times.

The warm host's p99 used to come from one handshake every 10 ms: about 100 samples at idle
and 120-200 during a storm, so "p99" was the second-slowest sample and one slow handshake
moved a run's ratio from x5.5 to x13.  Here the prober starts ``rate`` handshakes a second on
a fixed schedule (open loop: a handshake slowed by the storm does not delay the next start),
up to ``connections`` in flight.  The storm's samples are those that started between the
storm's first launch and its last host served (tlsload's own clock); the idle samples are
those of the last equally long stretch of the idle phase just before, at the same rate, so
both percentiles rest on about the same number of samples.

The prober's handshakes cost HAProxy CPU too.  The idle phase measures that cost per second
(HAProxy has nothing else to do then), so a cell can also report HAProxy's CPU per new host
net of the prober's share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _native
from bench._load import percentile
from bench.scale.common import Cpu


@dataclass(frozen=True)
class ProbeSettings:
    rate: float = 150.0  # warm handshakes started per second
    connections: int = 64  # most in flight at once
    idle_s: float = 2.5  # the idle phase before the storm (cut to the storm's length)


@dataclass
class Phases:
    """What the prober saw: each phase's latencies (s) and the CPU read over it."""

    idle: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    during_at: list[float] = field(default_factory=list)  # their starts, s after the storm's
    idle_cpu: Cpu | None = None
    failures: int = 0
    late: int = 0
    prober_cpu_s: float = 0.0


def window(
    samples: Sequence[float], starts: Sequence[float], begin: float, end: float
) -> list[float]:
    """The samples whose handshake started within [begin, end]."""
    return [s for s, t in zip(samples, starts, strict=True) if begin <= t <= end]


def stats_ms(seconds: Sequence[float]) -> dict[str, Any]:
    """count, p50, p90 and p99 in ms (nearest rank, as every bench here)."""
    ms = [s * 1000 for s in seconds]
    if not ms:
        return {"count": 0, "p50": None, "p90": None, "p99": None}
    return {
        "count": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
    }


@contextmanager
def probing(
    native: Path,
    port: int,
    host: str,
    cafile: Path,
    pids: dict[str, int],
    settings: ProbeSettings,
    on_start: Callable[[int], None] | None = None,
) -> Iterator[tuple[Phases, Callable[[float, float], None], dict[str, int]]]:
    """Start the prober, run the idle phase (CPU of ``pids`` and the prober read over it),
    then yield (phases, mark_storm, pids with the prober's).  The body runs the storm and
    calls ``mark_storm(t0, seconds)`` with the storm's start (time.monotonic()'s clock) and
    duration; on exit the prober stops and ``phases`` is filled."""
    storm: list[tuple[float, float]] = []
    phases = Phases()
    with _native.NativeProber(
        native,
        port,
        host,
        cafile,
        interval=1.0 / settings.rate,
        connections=settings.connections,
    ) as prober:
        assert prober.pid is not None
        if on_start is not None:
            on_start(prober.pid)
        with_prober = {**pids, "prober": prober.pid}
        phases.idle_cpu = Cpu(with_prober).start()
        idle_begin = time.monotonic()
        time.sleep(settings.idle_s)
        idle_end = time.monotonic()
        phases.idle_cpu.stop()
        yield phases, lambda t0, seconds: storm.append((t0, seconds)), with_prober
    phases.failures, phases.late, phases.prober_cpu_s = prober.failures, prober.late, prober.cpu_s
    if not storm:
        return
    t0, seconds = storm[0]
    phases.during = window(prober.samples, prober.starts, t0, t0 + seconds)
    phases.during_at = [t - t0 for t in window(prober.starts, prober.starts, t0, t0 + seconds)]
    begin = max(idle_begin, idle_end - seconds)
    phases.idle = window(prober.samples, prober.starts, begin, idle_end)
