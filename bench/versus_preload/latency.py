"""Scenarios 3 and 4: the latency a cold load adds, one host at a time and in a storm.

Both run on one fresh stack with room for every host they load (:func:`latency`);
the preload side is the HAProxy that scenario 1 left running with every certificate.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench._load import summary_ms, timed_handshake
from bench._proc import schedstat_ns
from bench.versus_preload.context import Bench
from certagent.testing import Stack


def cold_warm(bench: Bench, stack: Stack) -> dict[str, Any]:
    """Each never-seen host: a cold handshake, then a warm one; then, in a second pass,
    one against the preload.  (Interleaving the preload's handshakes, on a process holding
    2.5 GB of certificates, slowed the cold ones by ≈0.25 ms in ad-hoc runs: cache
    pollution that a production HAProxy would not see.)"""
    pre = bench.preload_big
    assert pre is not None
    cold: list[float] = []
    warm: list[float] = []
    preload: list[float] = []
    added: list[float] = []
    failures = 0
    hosts = bench.cold_warm_hosts()
    for host in hosts:
        try:
            c = timed_handshake(stack.port, host, bench.ctx)
            w = timed_handshake(stack.port, host, bench.ctx)
        except (OSError, ValueError):
            failures += 1
            continue
        cold.append(c)
        warm.append(w)
        added.append(c - w)
    for host in hosts:
        try:
            preload.append(timed_handshake(pre.port, host, bench.ctx))
        except (OSError, ValueError):
            failures += 1
    result = {
        "hosts": bench.sizes.cold_warm,
        "failures": failures,
        "certagent_cold_ms": summary_ms(cold),
        "certagent_warm_ms": summary_ms(warm),
        "preload_ms": summary_ms(preload),
        "added_ms": summary_ms(added),
    }
    bench.say(f"bench: cold/warm: {result}")
    return result


def _counters(stack: Stack | None) -> dict[str, int]:
    """The agent's ensure and loader counters (for what happened during a storm)."""
    if stack is None:
        return {}
    status = stack.status()
    ensure = {f"ensure_{k}": v for k, v in status["ensure"].items()}
    return ensure | {f"loader_{k}": v for k, v in status["loader"].items()}


def _storm_against(
    bench: Bench,
    port: int,
    hosts: Sequence[str],
    warm_host: str,
    haproxy_pid: int,
    stack: Stack | None = None,
) -> dict[str, Any]:
    with bench.prober(port, warm_host) as idle:
        time.sleep(bench.sizes.idle_probe_seconds)
    before = _counters(stack)
    pids = {"haproxy": haproxy_pid} | ({"agent": stack.agent.pid} if stack and stack.agent else {})
    cpu_before = {name: schedstat_ns(pid) for name, pid in pids.items()}
    with bench.prober(port, warm_host) as during:
        result = bench.storm(port, hosts)
    # on-CPU time of HAProxy's worker (and the agent) during the storm, per host
    cpu = {
        f"{name}_cpu_ms_per_host": round(
            (schedstat_ns(pid) - cpu_before[name]) / 1e6 / len(hosts), 3
        )
        for name, pid in pids.items()
    }
    after = _counters(stack)
    idle_ms = summary_ms(idle.samples)
    during_ms = summary_ms(during.samples)
    return {
        "agent_counters": {
            k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)
        },
        "hosts": len(hosts),
        "verified": result.ok,
        "failed": result.failed,
        "success_pct": round(100 * result.ok / len(hosts), 2),
        "errors": result.errors,
        "launch_span_s": round(result.launch_span, 3),
        "duration_s": round(result.seconds, 3),
        "latency_ms": summary_ms(result.latencies),
        "warm_idle_ms": idle_ms,
        "warm_during_ms": during_ms,
        "warm_probe_failures": idle.failures + during.failures,
        "warm_p99_ratio": round(during_ms["p99"] / idle_ms["p99"], 2),
        "cpu": cpu,
    }


def cold_storm(bench: Bench, stack: Stack) -> dict[str, Any]:
    """New hosts started within ``storm_spread`` s, ``storm_concurrency`` at once; a warm
    host probed every 10 ms from another process, idle and during the storm."""
    pre = bench.preload_big
    assert pre is not None
    warm_host = bench.cold_warm_hosts()[0]
    out: dict[str, Any] = {
        "concurrency": bench.sizes.storm_concurrency,
        "spread_s": bench.sizes.storm_spread,
    }
    out["certagent"] = _storm_against(
        bench, stack.port, bench.storm_hosts(0), warm_host, stack.worker_pid(), stack
    )
    bench.say(f"bench: storm: certagent {out['certagent']}")
    out["preload"] = _storm_against(
        bench, pre.port, bench.storm_hosts(0), warm_host, pre.worker_pid()
    )
    bench.say(f"bench: storm: preload {out['preload']}")
    # The same storm with loads sent to HAProxy one at a time (load_batch 1): fewer
    # loads per second, so more CPU left for the hosts already served.
    stack.stop_agent()
    stack.env["CERTAGENT_LOAD_BATCH"] = "1"
    stack.start_agent()
    out["certagent_batch_1"] = _storm_against(
        bench, stack.port, bench.storm_hosts(1), warm_host, stack.worker_pid(), stack
    )
    bench.say(f"bench: storm: certagent, load_batch 1 {out['certagent_batch_1']}")
    return out


def latency(bench: Bench) -> tuple[dict[str, Any], dict[str, Any]]:
    """Scenarios 3 and 4 on one fresh stack with room for every host they load."""
    sizes = bench.sizes
    stack = bench.new_stack("latency", capacity=sizes.cold_warm + 2 * sizes.storm_hosts + 100)
    stack.start_haproxy()
    stack.start_agent()
    try:
        return cold_warm(bench, stack), cold_storm(bench, stack)
    finally:
        stack.close()
