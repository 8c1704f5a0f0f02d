"""``storm``: 1,000 never-seen hosts within 1 s at capacity 500.

Verified handshakes, default certificates, how long after the last arrival the
last host is served, a warm host's p99 during the storm against idle, and the CPU
of every server process and of the whole machine meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import _native
from bench._certs import Leaves
from bench._load import StormResult, storm
from bench._proc import cpu_ticks
from bench.scale.common import (
    Cpu,
    Env,
    Sizes,
    ensure_many,
    host,
    latency_ms,
    ratio,
    shared_key_bundles,
    spread,
    try_handshake,
)
from certagent.testing import Stack


def storm_scenario(env: Env, sizes: Sizes, leaves: Leaves, native: Path | None) -> dict[str, Any]:
    resident = [host("s", i) for i in range(sizes.storm_capacity)]
    waves = [[host(f"w{r}", i) for i in range(sizes.storm_hosts)] for r in range(sizes.repeats)]
    env.store.put(
        shared_key_bundles(leaves, [*resident, *(h for w in waves for h in w)]), concurrency=64
    )
    stack = env.stack("storm", capacity=sizes.storm_capacity)
    try:
        asyncio.run(ensure_many(stack.settings.agent_socket, resident))
        warm_host = resident[0]
        pids = env.pids(stack)
        runs = []
        for r, wave in enumerate(waves):
            idle = probe(env, stack, warm_host, native, lambda: time.sleep(1.0))
            result: list[StormResult] = []
            used: list[tuple[Cpu, float]] = []

            def body(
                w: list[str] = wave,
                out: list[StormResult] = result,
                cpus: list[tuple[Cpu, float]] = used,
            ) -> None:
                cpu, (busy0, total0) = Cpu(pids).start(), cpu_ticks()
                out.append(one_storm(env, stack, w, native, sizes))
                busy1, total1 = cpu_ticks()
                cpus.append((cpu.stop(), (busy1 - busy0) / max(1, total1 - total0)))

            during = probe(env, stack, warm_host, native, body)
            res = result[0]
            cpu, machine_busy = used[0]
            status = stack.status()
            runs.append(
                {
                    "verified": res.ok,
                    "failed": res.failed,
                    "errors": res.errors,
                    "served_after_last_arrival_s": round(res.seconds - res.launch_span, 3),
                    "latency_ms": latency_ms(res.latencies),
                    "warm_idle_p99_ms": latency_ms(idle)["p99"],
                    "warm_during_p99_ms": latency_ms(during)["p99"],
                    "warm_p99_ratio": ratio(latency_ms(during)["p99"], latency_ms(idle)["p99"]),
                    "busy": status["ensure"]["busy"],
                    "recycles": status["loader"]["recycles"],
                    # CPU while the storm ran: the server's processes, and the whole machine
                    # (load generator and warm prober included), 100 % = every CPU busy
                    "cpu_ms": {name: round(ms, 1) for name, ms in cpu.ms.items()},
                    "server_cpus_busy": round(sum(cpu.ms.values()) / 1000 / cpu.seconds, 2),
                    "machine_busy_pct": round(100 * machine_busy, 1),
                }
            )
            env.say(f"bench.scale: storm {r + 1}: {runs[-1]}")
        return {
            "client": _native.LABEL if native is not None else "Python asyncio",
            "runs": runs,
            "verified_pct": spread([100 * x["verified"] / sizes.storm_hosts for x in runs], 1),
            "served_after_last_arrival_s": spread([x["served_after_last_arrival_s"] for x in runs]),
            "warm_p99_ratio": spread([x["warm_p99_ratio"] or float("nan") for x in runs], 2),
            "machine_busy_pct": spread([x["machine_busy_pct"] for x in runs], 1),
            "server_cpus_busy": spread([x["server_cpus_busy"] for x in runs], 2),
            "default_cert": sum(
                x["errors"].get("not verified (default certificate)", 0) for x in runs
            ),
        }
    finally:
        env.close(stack)


def one_storm(
    env: Env, stack: Stack, wave: list[str], native: Path | None, sizes: Sizes
) -> StormResult:
    """Every host of ``wave`` at once, spread over ``sizes.storm_spread`` s."""
    if native is not None:
        return asyncio.run(
            _native.storm_native(
                native, stack.port, wave, env.pki.cafile, len(wave), sizes.storm_spread, 15.0
            )
        )
    return asyncio.run(storm(stack.port, wave, env.ctx, len(wave), sizes.storm_spread))


def probe(
    env: Env, stack: Stack, warm_host: str, native: Path | None, body: Callable[[], object]
) -> list[float]:
    """Handshake latencies of ``warm_host`` every 10 ms while ``body()`` runs."""
    if native is not None:
        with _native.NativeProber(native, stack.port, warm_host, env.pki.cafile) as probe:
            body()
        return probe.samples
    samples: list[float] = []
    stop = threading.Event()
    ctx = env.ctx

    def loop() -> None:
        while not stop.wait(0.01):
            result = try_handshake(stack.port, warm_host, ctx)
            if isinstance(result, float):
                samples.append(result)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        body()
    finally:
        stop.set()
        thread.join(10)
    return samples
