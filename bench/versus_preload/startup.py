"""Scenario 1, startup: process start to the first verified handshake of a random host.

certagent (HAProxy + agent, the certificates in Redis) against HAProxy preloading
the first N certificates from files, at each N of ``sizes.startup``; HAProxy's
worker RSS once it serves.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any

from bench._load import try_handshake
from bench.versus_preload.context import Bench, mb
from certagent.testing import StackError, rss_kb


def _first_verified(
    port: int, host: str, ctx: ssl.SSLContext, t0: float, timeout: float, alive: Callable[[], None]
) -> float:
    """Seconds from ``t0`` to the first verified handshake for ``host``; poll every 5 ms."""
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        alive()
        if try_handshake(port, host, ctx) is not None:
            return time.perf_counter() - t0
        time.sleep(0.005)
    raise StackError(f"no verified handshake for {host} within {timeout:.0f} s")


def startup(bench: Bench) -> dict[str, Any]:
    """Process start to the first verified handshake of a random host; worker RSS then."""
    rows = []
    for n in bench.sizes.startup:
        host = bench.rng.choice(bench.names[:n])
        stack = bench.new_stack(f"startup-{n}", capacity=bench.sizes.churn_capacity)
        t0 = time.perf_counter()
        stack.haproxy.start(wait=False)
        stack.start_agent(wait=False)
        agent_s = _first_verified(stack.port, host, bench.ctx, t0, 60.0, stack.check_alive)
        stack.haproxy.worker_pids.add(stack.worker_pid())
        agent_rss = stack.worker_rss_kb()
        agent_py_rss = rss_kb(stack.agent.pid) if stack.agent else 0
        stack.close()

        bench.say(f"bench: startup: preloading {n} certificates ...")
        pre = bench.preload(n)
        t0 = time.perf_counter()
        pre.start(wait=False)
        preload_s = _first_verified(pre.port, host, bench.ctx, t0, 1200.0, pre.check_alive)
        pre.worker_pids.add(pre.worker_pid())
        preload_rss = pre.worker_rss_kb()
        if n == bench.sizes.preload_max:
            bench.preload_big = pre  # kept for the preload side of scenarios 2-4
        else:
            pre.stop()
        row = {
            "n": n,
            "preload_s": round(preload_s, 3),
            "preload_rss_mb": mb(preload_rss),
            "certagent_s": round(agent_s, 3),
            "certagent_haproxy_rss_mb": mb(agent_rss),
            "certagent_agent_rss_mb": mb(agent_py_rss),
            "speedup": round(preload_s / agent_s, 1),
        }
        bench.say(f"bench: startup: {row}")
        rows.append(row)
    return {"store_hosts": len(bench.names), "rows": rows}
