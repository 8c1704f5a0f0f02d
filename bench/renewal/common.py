"""What the renewal scenarios share: sizes, a node with ACME on, CPU readings, the schedule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._proc import schedstat_ns
from certagent.store.renewals import Renewals
from certagent.testing import RedisFixture, RedisProcess, Stack, StackError
from certagent.testing.pebble import Pebble

DAY = 86400.0
#: the bench's names: ``r000042.renewal.bench``
SUFFIX = "renewal.bench"


def host(i: int, kind: str = "r") -> str:
    return f"{kind}{i:06d}.{SUFFIX}"


@dataclass(frozen=True)
class Sizes:
    scheduled: int = 100_000  # entries in the schedule at rest
    spread_days: float = 60.0  # their renewal times spread over this many days
    idle_seconds: float = 20.0  # one measured window at rest
    repeats: int = 3
    due_at_once: int = 100  # certificates made due at once (throughput)

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(scheduled=500, spread_days=1.0, idle_seconds=1.0, repeats=3, due_at_once=3)


def utime_stime_ticks(pid: int) -> int:
    """utime + stime of ``pid`` (all its threads) in clock ticks, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


TICK_MS = 1000.0 / 100  # os.sysconf("SC_CLK_TCK") is 100 on Linux


class Cpu:
    """CPU of named processes over a window, two ways: schedstat (ns) and utime+stime (ticks).

    schedstat counts every thread's on-CPU time in nanoseconds; utime+stime is what
    ``top`` and ``ps`` show, in 10 ms ticks: at 0.2 ms/s a 20 s window is 4 ms, under
    one tick, so it is recorded as a cross-check over the whole run, not per window.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.ns0: dict[str, int] = {}
        self.ticks0: dict[str, int] = {}
        self.t0 = 0.0
        self.ms: dict[str, float] = {}
        self.tick_ms: dict[str, float] = {}
        self.seconds = 0.0

    def start(self) -> Cpu:
        self.ns0 = {n: schedstat_ns(p) for n, p in self.pids.items()}
        self.ticks0 = {n: utime_stime_ticks(p) for n, p in self.pids.items()}
        self.t0 = time.perf_counter()
        return self

    def stop(self) -> Cpu:
        self.seconds = time.perf_counter() - self.t0
        self.ms = {n: (schedstat_ns(p) - self.ns0[n]) / 1e6 for n, p in self.pids.items()}
        self.tick_ms = {
            n: (utime_stime_ticks(p) - self.ticks0[n]) * TICK_MS for n, p in self.pids.items()
        }
        return self


@dataclass
class Env:
    """Scratch space, one Redis with its data key, one pebble, and a way to say things."""

    work: Path
    redis: RedisProcess
    store: RedisFixture
    pebble: Pebble
    say: Callable[[str], None]
    stacks: list[Stack] = field(default_factory=list)

    def node(self, name: str, env: dict[str, str] | None = None) -> Stack:
        """A node (HAProxy + agent) on the Redis, issuing from pebble, on pebble's ports."""
        ca = self.pebble
        stack = Stack.create(
            self.work / name,
            store=self.redis.url,
            cafile=ca.ca_file,
            key_file=self.store.key_file,
            capacity=1_000,
            port=ca.tls_port,
            init_args=[
                "--acme-directory",
                ca.directory_url,
                "--acme-ca-file",
                str(ca.ca_file),
                "--acme-email",
                "ops@renewal.bench",
                "--http-bind",
                f"127.0.0.1:{ca.http_port}",
            ],
            env={"CERTAGENT_ACME_ALLOW_SUFFIXES": SUFFIX, **(env or {})},
        )
        self.stacks.append(stack)
        stack.start_haproxy()
        stack.start_agent()
        return stack

    def pids(self, stack: Stack) -> dict[str, int]:
        """Every process of one node and its store: agent, HAProxy master and worker, Redis."""
        assert stack.agent is not None and self.redis.proc is not None
        assert stack.haproxy.proc is not None
        return {
            "agent": stack.agent.pid,
            "haproxy_master": stack.haproxy.proc.pid,
            "haproxy_worker": stack.worker_pid(),
            "redis": self.redis.proc.pid,
        }

    def close(self, stack: Stack) -> None:
        try:
            stack.close()
        except (OSError, StackError) as exc:
            self.say(f"bench.renewal: stopping {stack.directory.name} failed: {exc}")
        if stack in self.stacks:
            self.stacks.remove(stack)

    def close_all(self) -> None:
        for stack in list(self.stacks):
            self.close(stack)


async def schedule_all(
    renewals: Renewals, entries: Sequence[tuple[str, float, float]], concurrency: int = 200
) -> None:
    """``renewals.schedule`` for every (name, renew_at, not_after), ``concurrency`` at once."""
    for start in range(0, len(entries), concurrency):
        batch = entries[start : start + concurrency]
        await asyncio.gather(*(renewals.schedule(*entry) for entry in batch))
