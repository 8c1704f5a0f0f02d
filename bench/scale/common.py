"""What the scale scenarios share: sizes, CPU and memory readings, clients, stores."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import socket
import ssl
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench._certs import Leaves
from bench._load import client_context, percentile
from bench._proc import schedstat_ns
from certagent.certs.pem import CertBundle, parse_bundle
from certagent.runtime import protocol
from certagent.testing import PKI, RedisFixture, RedisProcess, Stack, StackError, rss_kb
from certagent.testing.certs import cert_pem, issue_cert, key_pem, make_key

TIMEOUT = 10.0


@dataclass(frozen=True)
class Sizes:
    capacities: tuple[int, ...] = (1_000, 10_000, 100_000)
    recycles: int = 300  # cold hosts per repeat in the capacity scenario
    repeats: int = 3
    new_host_capacity: int = 300
    new_host_count: int = 150  # per repeat, each with a key of its own
    storm_capacity: int = 500
    storm_hosts: int = 1_000
    storm_spread: float = 1.0
    reload_hot: int = 2_000
    idle_loaded: int = 1_000
    idle_seconds: float = 10.0
    idle_ha_loaded: int = 200
    kinds_capacity: int = 1_000
    sim_hosts: int = 20_000
    sim_capacity: int = 1_000
    sim_requests: int = 200_000

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            capacities=(100, 400),
            recycles=30,
            repeats=2,
            new_host_capacity=40,
            new_host_count=20,
            storm_capacity=50,
            storm_hosts=100,
            storm_spread=0.3,
            reload_hot=60,
            idle_loaded=50,
            idle_seconds=2.0,
            idle_ha_loaded=20,
            kinds_capacity=100,
            sim_hosts=2_000,
            sim_capacity=100,
            sim_requests=10_000,
        )


# --- readings ------------------------------------------------------------------------------


class Cpu:
    """On-CPU time of named processes between :meth:`start` and :meth:`stop`, in ms."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._t0: dict[str, int] = {}
        self.ms: dict[str, float] = {}
        self.seconds = 0.0
        self._clock = 0.0

    def start(self) -> Cpu:
        self._t0 = {name: schedstat_ns(pid) for name, pid in self.pids.items()}
        self._clock = time.perf_counter()
        return self

    def stop(self) -> Cpu:
        self.seconds = time.perf_counter() - self._clock
        self.ms = {
            name: (schedstat_ns(pid) - self._t0[name]) / 1e6 for name, pid in self.pids.items()
        }
        return self


def memory_mb(pids: dict[str, int]) -> dict[str, float]:
    return {name: round(rss_kb(pid) / 1024, 1) for name, pid in pids.items()}


def host(kind: str, i: int) -> str:
    """The ``i``-th bench host name of a kind: ``k000042.scale.test``."""
    return f"{kind}{i:06d}.scale.test"


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 2 digits; None without both."""
    return round(a / b, 2) if a is not None and b else None


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Median of repeats with min and max (never the best run alone)."""
    clean = [v for v in values if v == v]  # drop NaN
    if not clean:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {
        "median": round(statistics.median(clean), digits),
        "min": round(min(clean), digits),
        "max": round(max(clean), digits),
        "runs": [round(v, digits) for v in values],
    }


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "count": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p99": round(percentile(ms, 99), 3),
    }


# --- clients --------------------------------------------------------------------------------


@dataclass
class Outcomes:
    """Verified handshakes and what went wrong with the others."""

    ok: int = 0
    default_cert: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def note(self, host: str, result: float | BaseException) -> None:
        if isinstance(result, ssl.SSLCertVerificationError):
            self.default_cert += 1
        elif isinstance(result, BaseException):
            self.failed += 1
            if len(self.errors) < 5:
                self.errors.append(f"{host}: {result!r}")
        else:
            self.ok += 1
            self.seconds.append(result)


def handshake(port: int, host: str, ctx: ssl.SSLContext) -> float:
    """Seconds to a verified TLS handshake for ``host`` (from connect())."""
    start = time.perf_counter()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        ctx.wrap_socket(raw, server_hostname=host),
    ):
        return time.perf_counter() - start


def try_handshake(port: int, host: str, ctx: ssl.SSLContext) -> float | BaseException:
    try:
        return handshake(port, host, ctx)
    except OSError as exc:  # ssl errors included
        return exc


async def ensure_many(
    socket_path: str, hosts: Iterable[str], concurrency: int = 64
) -> dict[str, int]:
    """Ask the agent for ``hosts`` over its unix socket (no TLS): fill slots fast."""
    answers: dict[str, int] = {}
    todo = iter(hosts)

    async def worker() -> None:
        for host in todo:
            reader, writer = await asyncio.open_unix_connection(socket_path)
            writer.write(f"ensure {host}\n".encode())
            answer = (await asyncio.wait_for(reader.readline(), 30)).decode().strip()
            writer.close()
            answers[answer] = answers.get(answer, 0) + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


def marked(stack: Stack) -> int:
    """How many hosts fe_sni's table marks loaded."""
    reply = stack.admin(api.line(api.show_loaded(stack.settings.usage_table)))
    return len(protocol.parse_show_table(reply))


# --- certificates and stores -------------------------------------------------------------------


_FORKED_PKI: list[PKI] = []  # the CA the forked workers sign with (keys do not pickle)


def _own_key_bundle(name: str) -> CertBundle:
    pki = _FORKED_PKI[0]
    key = make_key(pki.key_type)
    cert = issue_cert(pki.ca, name, key=key)
    return parse_bundle(cert_pem(cert) + pki.ca.chain_pem, key_pem(key))


def own_key_bundles(pki: PKI, names: Sequence[str]) -> list[CertBundle]:
    """One fresh key per leaf (RSA-2048 keys take ~60 ms each: in forked processes)."""
    _FORKED_PKI[:] = [pki]
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 2, mp_context=context) as pool:
        return list(pool.map(_own_key_bundle, names, chunksize=16))


def shared_key_bundles(leaves: Leaves, names: Sequence[str]) -> Iterable[CertBundle]:
    return (leaves.bundle(n) for n in names)


@dataclass
class Env:
    """Scratch space, a CA, one Redis with its data key, and a way to say things."""

    work: Path
    redis: RedisProcess
    store: RedisFixture
    pki: PKI
    say: Callable[[str], None]
    stacks: list[Stack] = field(default_factory=list)

    @property
    def ctx(self) -> ssl.SSLContext:
        return client_context(self.pki.cafile)

    def stack(self, name: str, capacity: int, store_url: str | None = None) -> Stack:
        stack = Stack.create(
            self.work / name,
            store=store_url or self.redis.url,
            cafile=self.pki.cafile,
            key_file=self.store.key_file,
            capacity=capacity,
        )
        self.stacks.append(stack)
        stack.start_haproxy()
        stack.start_agent()
        return stack

    def close(self, stack: Stack) -> None:
        try:
            stack.close()
        except (OSError, StackError) as exc:
            self.say(f"bench: stopping {stack.directory.name} failed: {exc}")
        if stack in self.stacks:
            self.stacks.remove(stack)

    def close_all(self) -> None:
        for stack in list(self.stacks):
            self.close(stack)

    def pids(self, stack: Stack) -> dict[str, int]:
        assert stack.agent is not None
        assert self.redis.proc is not None
        return {
            "haproxy": stack.worker_pid(),
            "agent": stack.agent.pid,
            "redis": self.redis.proc.pid,
        }
