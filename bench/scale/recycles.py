"""Recycles: cold hosts that each take a slot of a full pool, measured per batch.

``capacity`` (K = 1k, 10k, 100k on one Redis, one K after the other) and
``store_kinds`` (one K on one Redis, Sentinel and Cluster, side by side) share
:class:`_Recycles`: a stack with K slots full and the figures of its batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench._certs import Leaves
from bench.scale.common import (
    Cpu,
    Env,
    Outcomes,
    Sizes,
    ensure_many,
    host,
    latency_ms,
    memory_mb,
    ratio,
    shared_key_bundles,
    spread,
    try_handshake,
)
from certagent.testing import RedisFixture
from certagent.testing.redisha import ClusterSet, SentinelSet

# --- capacity: a recycle at K = 1k, 10k, 100k ---------------------------------------------------


def capacity(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    """Fill K slots, then cold hosts that each recycle one: CPU, latency, memory per K."""
    biggest = max(sizes.capacities)
    fill = [host("k", i) for i in range(biggest)]
    cold = [host("c", i) for i in range(sizes.recycles * sizes.repeats)]
    env.say(f"bench.scale: capacity: storing {len(fill) + len(cold):,} certificates")
    started = time.perf_counter()
    env.store.put(shared_key_bundles(leaves, [*fill, *cold]), concurrency=64)
    stored_s = time.perf_counter() - started
    rows = []
    for k in sizes.capacities:
        rows.append(_capacity_row(env, sizes, k, fill[:k], cold))
    first, last = rows[0], rows[-1]
    return {
        "stored": len(fill) + len(cold),
        "store_fill_s": round(stored_s, 1),
        "rows": rows,
        "ratio_last_first": {
            key: ratio(last[key]["median"], first[key]["median"])
            for key in (
                "agent_ms_per_recycle",
                "haproxy_ms_per_recycle",
                "haproxy_ms_per_cold_host",
            )
        },
    }


def _capacity_row(
    env: Env, sizes: Sizes, k: int, fill: Sequence[str], cold: Sequence[str]
) -> dict[str, Any]:
    """One K: every repeat on one stack."""
    run = _Recycles(env, k, fill, label="capacity")
    try:
        for r in range(sizes.repeats):
            run.measure(cold[r * sizes.recycles : (r + 1) * sizes.recycles])
        row = run.row()
        env.say(f"bench.scale: capacity K={k:,}: {row}")
        return row
    finally:
        run.close()


class _Recycles:
    """A stack with K slots full, measuring batches of cold hosts that each recycle a slot.

    ``store``: another store's URL and the PIDs of its processes (default: env's Redis).
    """

    def __init__(
        self,
        env: Env,
        k: int,
        fill: Sequence[str],
        label: str,
        store: tuple[str, dict[str, int]] | None = None,
    ) -> None:
        self.env, self.k = env, k
        url = None if store is None else store[0]
        self.stack = stack = env.stack(f"{label}-{k}", capacity=k, store_url=url)
        env.say(f"bench.scale: {label} K={k:,}: filling the slots")
        started = time.perf_counter()
        answers = asyncio.run(ensure_many(stack.settings.agent_socket, fill))
        self.fill_s = time.perf_counter() - started
        if answers.get("ok") != len(fill):
            raise RuntimeError(f"filling K={k} answered {answers}")
        self.filled = len(fill)
        self.pids = env.pids(stack)
        if store is not None:
            del self.pids["redis"]
            self.pids.update(store[1])
        self.store_names = [n for n in self.pids if n not in ("agent", "haproxy")]
        self.warm = list(fill[:50])
        for h in self.warm:  # used: not the one-off hosts a recycle takes first
            try_handshake(stack.port, h, env.ctx)
            try_handshake(stack.port, h, env.ctx)
        self.figures: dict[str, list[float]] = {
            name: []
            for name in (
                "agent",
                "store",
                "haproxy",
                "cold_host",
                "warm_handshake",
                "added_p50",
                "added_p99",
            )
        }
        self.outcomes = Outcomes()

    def measure(self, batch: Sequence[str]) -> None:
        """One repeat: ``batch`` cold, then as many warm handshakes."""
        stack, ctx, f = self.stack, self.env.ctx, self.figures
        before = stack.status()["loader"]["recycles"]
        cpu = Cpu(self.pids).start()
        cold_s = []
        for h in batch:
            result = try_handshake(stack.port, h, ctx)
            self.outcomes.note(h, result)
            if isinstance(result, float):
                cold_s.append(result)
        cpu.stop()
        recycled = stack.status()["loader"]["recycles"] - before
        wcpu = Cpu(self.pids).start()
        warm_s = []
        for i in range(len(batch)):
            result = try_handshake(stack.port, self.warm[i % len(self.warm)], ctx)
            if isinstance(result, float):
                warm_s.append(result)
        wcpu.stop()
        n = max(1, len(batch))
        warm_haproxy = wcpu.ms["haproxy"] / n
        f["cold_host"].append(cpu.ms["haproxy"] / n)
        f["haproxy"].append(cpu.ms["haproxy"] / n - warm_haproxy)
        f["agent"].append(cpu.ms["agent"] / n)
        # the store's background (replication, sentinel gossip) at the warm window's rate
        background = sum(wcpu.ms[s] for s in self.store_names) / max(wcpu.seconds, 1e-9)
        store_cpu = sum(cpu.ms[s] for s in self.store_names) - background * cpu.seconds
        f["store"].append(store_cpu / n)
        f["warm_handshake"].append(warm_haproxy)
        base = statistics.median(warm_s) if warm_s else float("nan")
        added = sorted(s - base for s in cold_s)
        f["added_p50"].append(latency_ms(added)["p50"])
        f["added_p99"].append(latency_ms(added)["p99"])
        if recycled < len(batch):
            self.env.say(f"bench.scale: K={self.k}: only {recycled} of {len(batch)} loads recycled")

    def row(self) -> dict[str, Any]:
        f, outcomes = self.figures, self.outcomes
        return {
            "k": self.k,
            "fill_s": round(self.fill_s, 1),
            "fill_loads_per_s": round(self.filled / self.fill_s),
            "agent_ms_per_recycle": spread(f["agent"]),
            "store_ms_per_recycle": spread(f["store"]),
            "store_processes": self.store_names,
            "haproxy_ms_per_recycle": spread(f["haproxy"]),
            "haproxy_ms_per_cold_host": spread(f["cold_host"]),
            "haproxy_ms_per_warm_handshake": spread(f["warm_handshake"]),
            "cold_added_ms_p50": spread(f["added_p50"]),
            "cold_added_ms_p99": spread(f["added_p99"]),
            "handshakes": {
                "ok": outcomes.ok,
                "default_cert": outcomes.default_cert,
                "failed": outcomes.failed,
                "errors": outcomes.errors,
            },
            "memory_mb": _memory(self.pids, self.store_names),
        }

    def close(self) -> None:
        self.env.close(self.stack)


# --- store_kinds: the same recycles on one Redis, on Sentinel and on Cluster --------------------


def store_kinds(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    """A recycle at one K on each Redis kind: CPU (agent, HAProxy, every store process) and
    added latency, and each kind's ratio to one Redis in this run.

    The three stacks run side by side and take turns, one batch each per repeat, so
    that a slower period of a shared machine weighs on every kind alike.
    """
    k = sizes.kinds_capacity
    fill = [host("kf", i) for i in range(k)]
    cold = [host("kc", i) for i in range(sizes.recycles * sizes.repeats)]
    bundles = list(shared_key_bundles(leaves, [*fill, *cold]))
    env.store.put(bundles, concurrency=64)
    with contextlib.ExitStack() as stack:
        sentinels = stack.enter_context(SentinelSet(env.work / "kinds-sentinel"))
        cluster = stack.enter_context(ClusterSet(env.work / "kinds-cluster"))
        runs: dict[str, _Recycles] = {}

        def close_runs() -> None:
            for run in runs.values():
                run.close()

        stack.callback(close_runs)
        runs["redis"] = _Recycles(env, k, fill, "kinds-redis")
        kinds: tuple[tuple[str, SentinelSet | ClusterSet], ...] = (
            ("sentinel", sentinels),
            ("cluster", cluster),
        )
        for kind, ha in kinds:
            RedisFixture(ha.url, env.store.key_file).put(bundles, concurrency=64)
            store = (ha.url, {n.name: n.pid for n in ha.processes})
            runs[kind] = _Recycles(env, k, fill, f"kinds-{kind}", store)
        for r in range(sizes.repeats):
            batch = cold[r * sizes.recycles : (r + 1) * sizes.recycles]
            for kind, run in runs.items():
                env.say(f"bench.scale: store_kinds: {kind}, repeat {r + 1}")
                run.measure(batch)
        rows = {kind: run.row() for kind, run in runs.items()}
    keys = ("agent_ms_per_recycle", "store_ms_per_recycle", "cold_added_ms_p50")
    return {
        "k": k,
        "rows": rows,
        "ratio_to_redis": {
            kind: {key: ratio(_med(rows[kind][key]), _med(rows["redis"][key])) for key in keys}
            for kind in ("sentinel", "cluster")
        },
    }


def _memory(pids: dict[str, int], store_names: Sequence[str]) -> dict[str, float]:
    """RSS of HAProxy, the agent and the store ("redis", or a Sentinel set's or cluster's sum)."""
    mem = memory_mb(pids)
    if store_names == ["redis"]:
        return mem
    return {
        "haproxy": mem["haproxy"],
        "agent": mem["agent"],
        "store": round(sum(mem[s] for s in store_names), 1),
    }


def _med(figure: dict[str, Any]) -> float | None:
    value = figure.get("median")
    return None if value is None else float(value)
