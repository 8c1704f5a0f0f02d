"""The scale scenarios; each returns a JSON-ready dict (see the package docstring)."""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from bench import _native
from bench._certs import Leaves
from bench._load import StormResult, storm
from bench._proc import cpu_ticks
from bench.scale.common import (
    Cpu,
    Env,
    Outcomes,
    Sizes,
    ensure_many,
    host,
    latency_ms,
    marked,
    own_key_bundles,
    ratio,
    shared_key_bundles,
    spread,
    try_handshake,
)
from certagent.runtime.pool import Slot, SlotPool
from certagent.runtime.usage import HostUsage, VictimChooser
from certagent.testing import PKI, RedisFixture, Stack, wait_for
from certagent.testing.redisha import ClusterSet, SentinelSet

# --- new_host: ECDSA and RSA-2048, a key per leaf -----------------------------------------------


def new_host(env: Env, sizes: Sizes, pkis: dict[str, PKI]) -> dict[str, Any]:
    """Server CPU per new host (first handshake included), at a full pool, per key type."""
    out: dict[str, Any] = {}
    for kind, pki in pkis.items():
        names = [host(f"n{kind}", i) for i in range(sizes.new_host_capacity)]
        cold = [host(f"m{kind}", i) for i in range(sizes.new_host_count * sizes.repeats)]
        env.say(f"bench.scale: new_host {kind}: {len(names) + len(cold)} leaves with own keys")
        env.store.put(own_key_bundles(pki, [*names, *cold]), concurrency=32)
        stack = env.stack(f"new-host-{kind}", capacity=sizes.new_host_capacity)
        try:
            asyncio.run(ensure_many(stack.settings.agent_socket, names))
            pids = env.pids(stack)
            ctx = _context(pki)
            total, agent, haproxy, warm = [], [], [], []
            outcomes = Outcomes()
            for r in range(sizes.repeats):
                batch = cold[r * sizes.new_host_count : (r + 1) * sizes.new_host_count]
                cpu = Cpu(pids).start()
                for h in batch:
                    outcomes.note(h, try_handshake(stack.port, h, ctx))
                cpu.stop()
                wcpu = Cpu(pids).start()
                for h in batch:  # the same hosts, now warm: a full handshake each
                    try_handshake(stack.port, h, ctx)
                wcpu.stop()
                n = len(batch)
                agent.append(cpu.ms["agent"] / n)
                haproxy.append(cpu.ms["haproxy"] / n)
                total.append((cpu.ms["agent"] + cpu.ms["haproxy"]) / n)
                warm.append(wcpu.ms["haproxy"] / n)
            out[kind] = {
                "server_ms_per_new_host": spread(total),
                "agent_ms": spread(agent),
                "haproxy_ms": spread(haproxy),
                "haproxy_ms_per_warm_full_handshake": spread(warm),
                "handshakes": {
                    "ok": outcomes.ok,
                    "default_cert": outcomes.default_cert,
                    "failed": outcomes.failed,
                    "errors": outcomes.errors,
                },
            }
            env.say(f"bench.scale: new_host {kind}: {out[kind]}")
        finally:
            env.close(stack)
    return out


def _context(pki: PKI) -> Any:
    from bench._load import client_context

    return client_context(pki.cafile)


# --- storm: 1,000 never-seen hosts within 1 s at capacity 500 ----------------------------------


def storm_scenario(env: Env, sizes: Sizes, leaves: Leaves, native: Any) -> dict[str, Any]:
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
            idle = _probe(env, stack, warm_host, native, lambda: time.sleep(1.0))
            result: list[StormResult] = []
            used: list[tuple[Cpu, float]] = []

            def body(
                w: list[str] = wave,
                out: list[StormResult] = result,
                cpus: list[tuple[Cpu, float]] = used,
            ) -> None:
                cpu, (busy0, total0) = Cpu(pids).start(), cpu_ticks()
                out.append(_one_storm(env, stack, w, native, sizes))
                busy1, total1 = cpu_ticks()
                cpus.append((cpu.stop(), (busy1 - busy0) / max(1, total1 - total0)))

            during = _probe(env, stack, warm_host, native, body)
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


def _one_storm(env: Env, stack: Stack, wave: list[str], native: Any, sizes: Sizes) -> StormResult:
    """Every host of ``wave`` at once, spread over ``sizes.storm_spread`` s."""
    if native is not None:
        return asyncio.run(
            _native.storm_native(
                native, stack.port, wave, env.pki.cafile, len(wave), sizes.storm_spread, 15.0
            )
        )
    return asyncio.run(storm(stack.port, wave, env.ctx, len(wave), sizes.storm_spread))


def _probe(env: Env, stack: Stack, warm_host: str, native: Any, body: Any) -> list[float]:
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


# --- reload: SIGUSR2 under traffic over 2,000 hot hosts -------------------------------------------


def reload_scenario(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    hot = [host("r", i) for i in range(sizes.reload_hot)]
    env.store.put(shared_key_bundles(leaves, hot), concurrency=64)
    stack = env.stack("reload", capacity=sizes.reload_hot + 500)
    try:
        asyncio.run(ensure_many(stack.settings.agent_socket, hot))
        ctx = env.ctx
        runs = []
        for r in range(sizes.repeats):
            runs.append(_one_reload(stack, hot, ctx))
            env.say(f"bench.scale: reload {r + 1}: {runs[-1]}")
        return {
            "hot": len(hot),
            "runs": runs,
            "all_hot_marked_after_s": spread([x["all_hot_marked_after_s"] for x in runs]),
            "default_cert": sum(x["default_cert"] for x in runs),
            "failed": sum(x["failed"] for x in runs),
        }
    finally:
        env.close(stack)


def _one_reload(stack: Stack, hot: list[str], ctx: ssl.SSLContext) -> dict[str, Any]:
    """SIGUSR2 while 4 threads loop handshakes over ``hot``; until all are marked again."""
    outcomes = Outcomes()
    stop = threading.Event()
    lock = threading.Lock()

    def traffic(offset: int) -> None:
        i = offset
        while not stop.is_set():
            h = hot[i % len(hot)]
            i += 4
            result = try_handshake(stack.port, h, ctx)
            with lock:
                outcomes.note(h, result)

    threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        asked_before = stack.status()["ensure"]["requests"]
        reloaded = time.perf_counter()
        stack.reload_haproxy()
        all_marked = wait_for(
            lambda: (time.perf_counter() - reloaded) if marked(stack) >= len(hot) else None,
            60.0,
            "every hot host marked in the new worker",
            interval=0.05,
        )
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    status = stack.status()
    return {
        "handshakes_ok": outcomes.ok,
        "default_cert": outcomes.default_cert,
        "failed": outcomes.failed,
        "errors": outcomes.errors,
        "all_hot_marked_after_s": round(all_marked, 3),
        "agent_requests": status["ensure"]["requests"] - asked_before,
        "rewarm": status["rewarm"],
    }


# --- idle: CPU at rest ----------------------------------------------------------------------


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


# --- hit ratio: sampled victims against exact LRU, simulated --------------------------------


def hit_ratio(sizes: Sizes) -> dict[str, Any]:
    """Hit ratios on synthetic traces: exact LRU and the agent's sampled choice (pure code)."""
    rng = random.Random(7)
    hosts = sizes.sim_hosts
    zipf = rng.choices(range(hosts), [1.0 / (i + 1) for i in range(hosts)], k=sizes.sim_requests)
    hot = max(1, sizes.sim_capacity // 2)
    scan: list[int] = []
    for i in range(sizes.sim_requests):  # half the requests over a hot set, half a scan
        scan.append(rng.randrange(hot) if i % 2 else hot + i)
    out: dict[str, Any] = {"capacity": sizes.sim_capacity, "requests": sizes.sim_requests}
    for name, trace in (("zipf", zipf), ("hot_plus_scan", scan)):
        row = {"exact_lru": _simulate(trace, sizes.sim_capacity, None)}
        for samples in (4, 8, 16):
            row[f"sampled_{samples}"] = _simulate(trace, sizes.sim_capacity, samples)
        out[name] = row
    return out


def _exact_lru(trace: Sequence[int], capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for h in trace:
        if h in cache:
            hits += 1
            cache.move_to_end(h)
            continue
        if len(cache) >= capacity:
            cache.popitem(last=False)
        cache[h] = None
    return round(hits / len(trace), 4)


def _simulate(trace: Sequence[int], capacity: int, samples: int | None) -> float:
    """The hit ratio of the agent's own pool and chooser on ``trace`` (exact LRU if None)."""
    if samples is None:
        return _exact_lru(trace, capacity)
    pool = SlotPool(capacity, "/sim/slot-")
    usage: dict[str, HostUsage] = {}
    chooser = VictimChooser(samples=samples or 8, rng=random.Random(3))
    hits = 0
    for t, h in enumerate(trace):
        name = f"h{h}"
        now = float(t)
        if pool.is_mapped(name):
            hits += 1
            usage[name] = HostUsage(now, usage[name].conn_cnt + 1)
            continue
        places = pool.growth(1)
        if places:
            slot_name = places[0][0]
        else:
            (victim,) = chooser.choose(chooser.candidates(pool, 1), 1, usage)
            for old in pool.drop_hosts(victim):
                usage.pop(old, None)
            slot_name = victim.name
        slot = Slot(slot_name, f"F{name}", name, set(), now)
        pool.place(slot)
        chooser.loaded(pool, slot_name)
        pool.map_host(name, [slot], now)
        usage[name] = HostUsage(now, 1)
    return round(hits / len(trace), 4)
