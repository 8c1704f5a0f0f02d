"""The loads and their CPU: HTTP/3 through aioquic, TCP through the shared asyncio client.

aioquic is pure Python and far slower than HAProxy, so what is measured is the CPU
HAProxy's worker (every thread, ``/proc/<pid>/task/*/schedstat``) spent between two
readings taken around the load, divided by the operations done; the client's own CPU
is never counted.  For certagent, the agent's and Redis' CPU over the same phase is
counted too (they have nothing to do on these paths: a check that it stays so).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._load import keepalive_requests, new_connections
from bench._proc import schedstat_ns
from certagent.testing import StackError
from certagent.testing.h3client import H3Client, H3Error


@dataclass(frozen=True)
class Target:
    """One side of the comparison: where it listens and the processes whose CPU counts."""

    label: str
    port: int
    haproxy_pid: int
    other_pids: tuple[int, ...] = ()  # the agent and Redis (certagent's side)

    def sample(self) -> tuple[int, int]:
        """(HAProxy worker ns, other processes' ns) on CPU so far."""
        return schedstat_ns(self.haproxy_pid), sum(schedstat_ns(p) for p in self.other_pids)


@dataclass(frozen=True)
class Figure:
    """CPU per operation of one phase, in microseconds."""

    ops: int
    haproxy_us: float
    others_us: float
    client_s: float

    def as_dict(self) -> dict[str, float]:
        return {
            "ops": self.ops,
            "haproxy_us": round(self.haproxy_us, 2),
            "others_us": round(self.others_us, 2),
            "client_s": round(self.client_s, 3),
        }


def _figure(target: Target, ops: int, run: Callable[[], int]) -> Figure:
    before = target.sample()
    started = time.perf_counter()
    done = run()
    seconds = time.perf_counter() - started
    time.sleep(0.05)  # the last closes
    after = target.sample()
    if done != ops:
        raise StackError(f"{target.label}: {done} of {ops} operations succeeded")
    return Figure(
        ops,
        (after[0] - before[0]) / ops / 1e3,
        (after[1] - before[1]) / ops / 1e3,
        seconds,
    )


def h3_keepalive(
    target: Target, hosts: Sequence[str], cafile: Path, connections: int, requests: int
) -> Figure:
    """``requests`` GETs on each of ``connections`` open QUIC connections (hosts in turn)."""
    clients = [
        H3Client(target.port, hosts[i % len(hosts)], cafile).connect() for i in range(connections)
    ]
    try:
        for client in clients:  # every connection set up and used once before measuring
            if client.get("/").status != 200:
                raise StackError(f"{target.label}: HTTP/3 GET not 200")

        def run() -> int:
            ok = 0
            for _ in range(requests):
                for client in clients:
                    ok += client.get("/").status == 200
            return ok

        return _figure(target, connections * requests, run)
    finally:
        for client in clients:
            client.close()


def h3_handshakes(target: Target, hosts: Sequence[str], cafile: Path, count: int) -> Figure:
    """``count`` new QUIC connections: full handshake (no ticket), one GET, close."""

    def run() -> int:
        ok = 0
        for i in range(count):
            host = hosts[i % len(hosts)]
            try:
                with H3Client(target.port, host, cafile) as client:
                    ok += client.get("/").status == 200 and client.cert.san == (host,)
            except H3Error as exc:
                raise StackError(f"{target.label}: HTTP/3 to {host}: {exc}") from exc
        return ok

    return _figure(target, count, run)


def tcp_keepalive(
    target: Target, hosts: Sequence[str], ctx: ssl.SSLContext, connections: int, requests: int
) -> Figure:
    """HTTP/1.1 keep-alive GETs over TLS (certagent: through fe_sni and the hop)."""
    counted, before, after = asyncio.run(
        keepalive_requests(target.port, hosts, ctx, connections, requests, target.sample)
    )
    if counted.failed:
        raise StackError(f"{target.label}: {counted.failed} requests failed: {counted.errors}")
    return Figure(
        counted.ok,
        (after[0] - before[0]) / counted.ok / 1e3,
        (after[1] - before[1]) / counted.ok / 1e3,
        counted.seconds,
    )


def tcp_handshakes(
    target: Target, hosts: Sequence[str], ctx: ssl.SSLContext, count: int
) -> Figure:
    """New TLS connections: full handshake, one GET, close."""

    def run() -> int:
        counted = asyncio.run(new_connections(target.port, hosts, ctx, count))
        if counted.failed:
            raise StackError(f"{target.label}: {counted.failed} failed: {counted.errors}")
        return counted.ok

    return _figure(target, count, run)
