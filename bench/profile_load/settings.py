"""Sizes of a run (full or ``--quick``), its time budget, and progress lines."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass


def say(msg: str) -> None:
    """A progress line on stderr, with the time."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class OutOfTime(RuntimeError):
    """The run's time budget is spent."""


@dataclass(frozen=True)
class Params:
    """How big and how often; the JSON result lists them under ``params``."""

    k_small: int  # the small pool: slots, map entries, table entries
    k_large: int  # the large pool, if the budget allows filling it
    reps: int  # repetitions of every measurement
    n_cert: int  # operations per batch for certificate commands
    n_cheap: int  # operations per batch for map / table commands
    n_variant: int  # operations per batch for the payload variants (q2)
    hs_hosts: int  # q3: certificates (hosts) per round
    hs_rounds: int  # q3: rounds
    perf_seconds: float  # q4: length of each profiled stream
    perf_handshakes: int  # q4: profiled handshakes (first, then second), at most k_small - 1
    budget_s: float  # hard bound for the whole run
    k_large_fallback: int  # the large pool when filling k_large does not fit the budget


FULL = Params(
    k_small=1000,
    k_large=100_000,
    reps=7,
    n_cert=100,
    n_cheap=1000,
    n_variant=60,
    hs_hosts=200,
    hs_rounds=7,
    perf_seconds=5.0,
    perf_handshakes=600,
    budget_s=570.0,
    k_large_fallback=30_000,
)
QUICK = Params(
    k_small=200,
    k_large=2000,
    reps=5,
    n_cert=20,
    n_cheap=200,
    n_variant=15,
    hs_hosts=30,
    hs_rounds=5,
    perf_seconds=1.5,
    perf_handshakes=150,
    budget_s=58.0,
    k_large_fallback=1000,
)


class Budget:
    """Wall time since the start against the run's bound."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def check(self, what: str, need: float = 0.0) -> None:
        """Raise :class:`OutOfTime` unless ``need`` seconds are left for ``what``."""
        if self.left() < need:
            raise OutOfTime(f"time budget spent before {what} ({self.elapsed():.0f}s elapsed)")
