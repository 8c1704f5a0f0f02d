"""``idle`` and ``idle_ha``: CPU per second of the agent, HAProxy and the store at rest.

``idle`` on one Redis; ``idle_ha`` on a Sentinel-watched Redis and on a Redis
Cluster, every store process counted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench._certs import Leaves
from bench.scale.common import (
    Cpu,
    Env,
    Sizes,
    ensure_many,
    host,
    shared_key_bundles,
    spread,
    try_handshake,
)
from certagent.testing import RedisFixture
from certagent.testing.redisha import ClusterSet, SentinelSet


def idle_scenario(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    loaded = [host("i", i) for i in range(sizes.idle_loaded)]
    env.store.put(shared_key_bundles(leaves, loaded), concurrency=64)
    stack = env.stack("idle", capacity=sizes.idle_loaded)
    try:
        asyncio.run(ensure_many(stack.settings.agent_socket, loaded))
        ctx = env.ctx
        for h in loaded[:100]:
            try_handshake(stack.port, h, ctx)
        time.sleep(2.0)
        per_s = _at_rest(env.pids(stack), sizes)
        both = [a + h for a, h in zip(per_s["agent"], per_s["haproxy"], strict=True)]
        return {
            "store": "redis",
            "loaded": len(loaded),
            "window_s": sizes.idle_seconds,
            "agent_plus_haproxy_ms_per_s": spread(both, 4),
            **{f"{name}_ms_per_s": spread(v, 4) for name, v in per_s.items()},
        }
    finally:
        env.close(stack)


def _at_rest(pids: dict[str, int], sizes: Sizes) -> dict[str, list[float]]:
    """Each process's CPU in ms per second, over ``sizes.repeats`` windows of doing nothing."""
    per_s: dict[str, list[float]] = {name: [] for name in pids}
    for _ in range(sizes.repeats):
        cpu = Cpu(pids).start()
        time.sleep(sizes.idle_seconds)
        cpu.stop()
        for name in pids:
            per_s[name].append(cpu.ms[name] / cpu.seconds)
    return per_s


def idle_ha_scenario(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    """At rest on a Sentinel-watched Redis and on a Redis Cluster: agent, HAProxy, store."""
    out: dict[str, Any] = {}
    kinds: tuple[tuple[str, type[SentinelSet] | type[ClusterSet]], ...] = (
        ("sentinel", SentinelSet),
        ("cluster", ClusterSet),
    )
    for kind, make in kinds:
        with make(env.work / f"idle-{kind}") as ha:
            store = RedisFixture(ha.url, env.store.key_file, flusher=ha.flushall)
            loaded = [host(f"i{kind[0]}", i) for i in range(sizes.idle_ha_loaded)]
            store.put(shared_key_bundles(leaves, loaded), concurrency=16)
            stack = env.stack(f"idle-{kind}", capacity=len(loaded), store_url=ha.url)
            try:
                asyncio.run(ensure_many(stack.settings.agent_socket, loaded))
                for h in loaded[:50]:
                    try_handshake(stack.port, h, env.ctx)
                time.sleep(2.0)
                assert stack.agent is not None
                store_pids = {n.name: n.pid for n in ha.processes}
                pids = {"agent": stack.agent.pid, "haproxy": stack.worker_pid(), **store_pids}
                per_s = _at_rest(pids, sizes)
                both = [a + h for a, h in zip(per_s["agent"], per_s["haproxy"], strict=True)]
                store_total = [
                    sum(per_s[n][i] for n in store_pids) for i in range(sizes.repeats)
                ]
                out[kind] = {
                    "loaded": len(loaded),
                    "window_s": sizes.idle_seconds,
                    "store_processes": sorted(store_pids),
                    "agent_plus_haproxy_ms_per_s": spread(both, 4),
                    "agent_ms_per_s": spread(per_s["agent"], 4),
                    "haproxy_ms_per_s": spread(per_s["haproxy"], 4),
                    "store_ms_per_s": spread(store_total, 4),
                }
            finally:
                env.close(stack)
    return out
