"""Load generators: verified handshakes, a storm of new hosts, keep-alive requests.

All clients verify the server certificate against the bench CA with hostname
checking on (Python's ``ssl`` defaults), so a host served the default
certificate counts as a failure.  They are slow compared with HAProxy, which is
why the hop scenario measures HAProxy's CPU per operation rather than
throughput: the counts are exact, the client's speed does not matter.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certagent.testing import tlsclient

LOOPBACK = "127.0.0.1"
TIMEOUT = 10.0


def client_context(cafile: Path) -> ssl.SSLContext:
    """Verify against the bench root only; TLS 1.2+; no session reuse (never passed one)."""
    ctx = tlsclient.client_context(cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """count, p50, p90, p99, max and mean of latencies given in seconds, in ms."""
    ms = [s * 1000 for s in seconds]
    return {
        "count": len(ms),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
        "max": round(max(ms), 3) if ms else math.nan,
        "mean": round(sum(ms) / len(ms), 3) if ms else math.nan,
    }


def timed_handshake(port: int, host: str, ctx: ssl.SSLContext) -> float:
    """Seconds to a verified handshake for ``host`` (then one GET must answer 200)."""
    exchange = tlsclient.https_get(port, host, ctx, timeout=TIMEOUT)
    if host not in exchange.cert.san:
        raise ssl.SSLError(f"certificate for {exchange.cert.san}, not {host}")
    if exchange.status != 200:
        raise ssl.SSLError(f"HTTP status {exchange.status}")
    return exchange.handshake_seconds


def try_handshake(port: int, host: str, ctx: ssl.SSLContext) -> float | None:
    try:
        return timed_handshake(port, host, ctx)
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None


# --- HTTP/1.1 on asyncio streams ---------------------------------------------------------


async def _http_get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, close: bool
) -> None:
    connection = "close" if close else "keep-alive"
    writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: {connection}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ValueError(f"unexpected reply {head[:40]!r}")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)


async def _open(
    port: int, host: str, ctx: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            LOOPBACK, port, ssl=ctx, server_hostname=host, ssl_handshake_timeout=TIMEOUT
        ),
        TIMEOUT,
    )
    return reader, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)


@dataclass
class Counted:
    """Exact counts of one load run."""

    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, what: str) -> None:
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(what)


async def new_connections(
    port: int, hosts: Sequence[str], ctx: ssl.SSLContext, count: int, concurrency: int = 8
) -> Counted:
    """``count`` new TLS connections (full handshake, one GET, close), hosts round-robin."""
    result = Counted()
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            host = hosts[next_index % len(hosts)]
            next_index += 1
            try:
                reader, writer = await _open(port, host, ctx)
                try:
                    await asyncio.wait_for(_http_get(reader, writer, host, close=True), TIMEOUT)
                finally:
                    await _close(writer)
                result.ok += 1
            except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
                result.fail(f"{host}: {exc!r}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - started
    return result


async def keepalive_requests(
    port: int,
    hosts: Sequence[str],
    ctx: ssl.SSLContext,
    connections: int,
    requests: int,
    between: Callable[[], Any],
) -> tuple[Counted, Any, Any]:
    """Open ``connections`` (handshake + one GET each), call ``between()``, send
    ``requests`` more GETs on each (one at a time per connection), call
    ``between()`` again; return the counts of those requests and both samples."""
    opened: list[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for i in range(connections):
            host = hosts[i % len(hosts)]
            reader, writer = await _open(port, host, ctx)
            opened.append((host, reader, writer))
            await asyncio.wait_for(_http_get(reader, writer, host, close=False), TIMEOUT)
        result = Counted()

        async def run(host: str, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            for _ in range(requests):
                try:
                    await asyncio.wait_for(_http_get(reader, w, host, close=False), TIMEOUT)
                    result.ok += 1
                except (OSError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    result.fail(f"{host}: {exc!r}")
                    return

        before = between()
        started = time.perf_counter()
        await asyncio.gather(*(run(*conn) for conn in opened))
        result.seconds = time.perf_counter() - started
        after = between()
        return result, before, after
    finally:
        for _, _, writer in opened:
            await _close(writer)


# --- a storm of new hosts ----------------------------------------------------------------


@dataclass
class StormResult:
    ok: int
    failed: int
    latencies: list[float]  # verified handshakes only
    launch_span: float  # seconds from the first to the last connection attempt
    seconds: float  # until the last one finished
    errors: dict[str, int]
    t0: float = 0.0  # when it started, on time.monotonic()'s clock (CLOCK_MONOTONIC)


async def storm(
    port: int, hosts: Sequence[str], ctx: ssl.SSLContext, concurrency: int, spread: float
) -> StormResult:
    """A verified handshake for every host, started evenly over ``spread`` seconds,
    at most ``concurrency`` at once; handshake latency from connect()."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    launched: list[float] = []
    t0, started = time.perf_counter(), time.monotonic()

    async def one(i: int, host: str) -> None:
        await asyncio.sleep(max(0.0, t0 + spread * i / len(hosts) - time.perf_counter()))
        async with gate:
            launched.append(time.perf_counter())
            start = time.perf_counter()
            try:
                _reader, writer = await _open(port, host, ctx)
                latencies.append(time.perf_counter() - start)
                await _close(writer)
            except ssl.SSLCertVerificationError:
                errors["not verified (default certificate)"] = (
                    errors.get("not verified (default certificate)", 0) + 1
                )
            except (OSError, TimeoutError) as exc:
                kind = type(exc).__name__
                errors[kind] = errors.get(kind, 0) + 1

    await asyncio.gather(*(one(i, h) for i, h in enumerate(hosts)))
    return StormResult(
        ok=len(latencies),
        failed=len(hosts) - len(latencies),
        latencies=latencies,
        launch_span=(max(launched) - min(launched)) if launched else 0.0,
        seconds=time.perf_counter() - t0,
        errors=errors,
        t0=started,
    )


# --- a warm-host prober in its own process -----------------------------------------------


def _probe_loop(
    port: int, host: str, cafile: str, interval: float, conn: multiprocessing.connection.Connection
) -> None:
    """Child process: handshake every ``interval`` s until told to stop; send the samples."""
    ctx = client_context(Path(cafile))
    samples: list[float] = []
    failures = 0
    conn.send("ready")
    next_at = time.monotonic()
    while not conn.poll(max(0.0, next_at - time.monotonic())):
        latency = try_handshake(port, host, ctx)
        if latency is None:
            failures += 1
        else:
            samples.append(latency)
        next_at += interval
    conn.recv()
    conn.send((samples, failures))
    conn.close()


class Prober:
    """Verified handshakes for one warm host every ``interval`` s, from a separate process
    (so the storm's client-side CPU in this process does not delay it)."""

    def __init__(self, port: int, host: str, cafile: Path, interval: float = 0.01) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_probe_loop, args=(port, host, str(cafile), interval, child), daemon=True
        )
        self.samples: list[float] = []
        self.failures = 0

    def __enter__(self) -> Prober:
        self._proc.start()
        if not self._conn.poll(TIMEOUT):
            raise RuntimeError("the prober process did not start")
        self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send("stop")
        if self._conn.poll(TIMEOUT * 2):
            self.samples, self.failures = self._conn.recv()
        self._proc.join(TIMEOUT)
        if self._proc.is_alive() and self._proc.pid is not None:
            os.kill(self._proc.pid, 9)
            self._proc.join(TIMEOUT)
