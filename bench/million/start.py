"""The agent's start with N stored certificates, and a flood of made-up names at start.

``one_start``: spawn ``certagent run`` against the running HAProxy and Redis and,
for ``window`` s, retry a verified handshake of one never-seen host every 20 ms
(its first success: start → first verified handshake) while polling ``status``
(start → name filter ready); then the on-CPU time of the agent, Redis and
HAProxy's worker over that window (schedstat, all threads; the agent's Python
start included) and the agent's peak RSS (VmHWM).

``flood``: made-up names at ``rate`` a second to the agent's socket
(:func:`bench.filter_start.flood_names`) for ``seconds``, from the agent's first
accepted connection (``at_start``) or on a settled agent, with real new hosts
arriving meanwhile (verified handshakes through HAProxy, ``bench/tlsload.c``):
the store lookups per second (``ensure.store_lookups``) and the real hosts'
latencies.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from pathlib import Path
from typing import Any

from bench._native import storm_native
from bench._proc import hwm_kb, schedstat_ns
from bench.filter_start import flood_names, store_lookups
from bench.scale.common import latency_ms, try_handshake
from certagent.testing import Stack


def filter_status(stack: Stack) -> dict[str, Any] | None:
    try:
        names: dict[str, Any] = stack.status()["name_filter"]
    except (OSError, ValueError, KeyError):
        return None
    return names


def one_start(
    stack: Stack, pids: dict[str, int], new_host: str, ctx: ssl.SSLContext, window: float
) -> dict[str, Any]:
    """One start: first verified handshake of ``new_host``, filter ready, CPU over ``window``."""
    before = {name: schedstat_ns(pid) for name, pid in pids.items()}
    spawned = time.monotonic()
    proc = stack.start_agent(wait=False)
    handshake_s: float | None = None
    ready_s: float | None = None
    names: dict[str, Any] | None = None
    while (elapsed := time.monotonic() - spawned) < window:
        if handshake_s is None and isinstance(try_handshake(stack.port, new_host, ctx), float):
            handshake_s = time.monotonic() - spawned
        if ready_s is None and (names := filter_status(stack)) is not None and names["ready"]:
            ready_s = time.monotonic() - spawned
        time.sleep(0.02 if handshake_s is None or ready_s is None else 0.1)
    cpu_ms = {name: (schedstat_ns(pid) - before[name]) / 1e6 for name, pid in pids.items()}
    cpu_ms["agent"] = schedstat_ns(proc.pid) / 1e6
    peak_kb = hwm_kb(proc.pid)
    if proc.poll() is not None:
        raise RuntimeError(f"the agent exited with {proc.returncode}:\n{stack.agent_log()[-2000:]}")
    stack.stop_agent()
    return {
        "window_s": round(elapsed, 2),
        "first_verified_handshake_s": None if handshake_s is None else round(handshake_s, 3),
        "filter_ready_s": None if ready_s is None else round(ready_s, 3),
        "filter": names,
        "cpu_ms": {name: round(ms, 1) for name, ms in cpu_ms.items()},
        "agent_peak_rss_mb": round(peak_kb / 1024, 1),
    }


async def _accepting(socket: str) -> None:
    while True:
        try:
            _, writer = await asyncio.open_unix_connection(socket)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.01)


def flood(
    stack: Stack,
    native: Path,
    cafile: Path,
    real_hosts: list[str],
    *,
    at_start: bool,
    rate: float,
    seconds: int,
) -> dict[str, Any]:
    """Made-up names at ``rate``/s for ``seconds`` with ``real_hosts`` spread over them."""
    if at_start:
        stack.start_agent(wait=False)
    socket = str(stack.settings.agent_socket)
    counts: list[int] = []

    async def main() -> tuple[int, Any]:
        await _accepting(socket)
        while (first := await asyncio.to_thread(store_lookups, stack)) is None:
            await asyncio.sleep(0.01)
        counts.append(first)
        made_up = asyncio.create_task(flood_names(socket, rate, seconds))
        real = asyncio.create_task(
            storm_native(native, stack.port, real_hosts, cafile, 8, float(seconds))
        )
        for _ in range(seconds):
            await asyncio.sleep(1.0)
            now: int | None = await asyncio.to_thread(store_lookups, stack)
            counts.append(counts[-1] if now is None else now)
        return await made_up, await real

    sent, real = asyncio.run(main())
    if at_start:
        stack.stop_agent()
    per_second = [b - a for a, b in itertools.pairwise(counts)]
    lookups = counts[-1] - (0 if at_start else counts[0])
    return {
        "made_up_sent": sent,
        "store_lookups": lookups,
        # each real new host costs one lookup too
        "made_up_reaching_store": max(0, lookups - real.ok),
        "lookups_per_second": per_second,
        "real_hosts": len(real_hosts),
        "real_verified": real.ok,
        "real_latency_ms": latency_ms(real.latencies),
        "real_latencies_s": real.latencies,
    }
