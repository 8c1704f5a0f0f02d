"""``idle``: CPU per second of the agent, HAProxy and Redis at rest, with and without a schedule.

The store schedules only names it holds a certificate for, so ``scheduled`` names
first get a record each (a test CA's leaf with a shared key, written with the
agent's ``RedisStore.put`` before the node starts, so it has no change feed to
catch up on; not ACME-managed, which the renewer never looks at, as it reads only
due entries).  Then one node with issuance on (pebble as its CA, the agent's
default ``renew_tick``) and nothing to do is measured twice, ``repeats`` windows
each: with an empty schedule, then with an entry for every one of those names
written straight into the store's schedule (:meth:`Renewals.schedule`), renewal
times spread evenly over ``spread_days`` starting one hour after the last window,
so none falls due while CPU is measured.  The difference is the cost of a
schedule of that size to the renewer's tick.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench._certs import Leaves
from bench.renewal.common import DAY, Cpu, Env, Sizes, host, schedule_all
from bench.scale.common import spread
from certagent.testing import PKI, Stack

QUIET = 0.5  # ms/s: the agent counts as settled below this (after start, after the schedule)
QUIET_MAX = 60.0
TARGET_MS_PER_S = 0.2


def idle_scenario(env: Env, sizes: Sizes) -> dict[str, Any]:
    names = [host(i, "idle") for i in range(sizes.scheduled)]
    t0 = time.perf_counter()
    leaves = Leaves(PKI.create(env.work / "idle-ca.pem"))
    env.store.put((leaves.bundle(n) for n in names), concurrency=64)
    records_s = time.perf_counter() - t0
    stack = env.node("idle")
    try:
        pids = env.pids(stack)
        settled = [_settle(pids)]
        empty = _windows(pids, sizes)
        start = time.time() + sizes.repeats * sizes.idle_seconds + QUIET_MAX + 3600
        written = _schedule(env, names, sizes, start)
        settled.append(_settle(pids))
        full = _windows(pids, sizes)
        counted = asyncio.run(_count(env))
        return {
            "scheduled": written["scheduled"],
            "records_write_s": round(records_s, 1),
            "schedule_write_s": written["schedule_s"],
            "settled_s": settled,
            "spread_days": sizes.spread_days,
            "first_due_in_s": round(start - time.time()),
            "schedule_count_after": {"entries": counted[0], "due": counted[1]},
            "window_s": sizes.idle_seconds,
            "processes": sorted(pids),
            "renewer": _renewer_status(stack),
            "empty": empty,
            "scheduled_entries": full,
            "target_ms_per_s": TARGET_MS_PER_S,
            "met": (full["agent_plus_haproxy_ms_per_s"]["median"] or 99) <= TARGET_MS_PER_S,
        }
    finally:
        env.close(stack)


def _windows(pids: dict[str, int], sizes: Sizes) -> dict[str, Any]:
    """CPU ms per second of each process over ``repeats`` windows of doing nothing."""
    per_s: dict[str, list[float]] = {name: [] for name in pids}
    ticks_ms = dict.fromkeys(pids, 0.0)
    seconds = 0.0
    for _ in range(sizes.repeats):
        cpu = Cpu(pids).start()
        time.sleep(sizes.idle_seconds)
        cpu.stop()
        seconds += cpu.seconds
        for name in pids:
            per_s[name].append(cpu.ms[name] / cpu.seconds)
            ticks_ms[name] += cpu.tick_ms[name]
    runs = range(sizes.repeats)
    haproxy = [per_s["haproxy_master"][i] + per_s["haproxy_worker"][i] for i in runs]
    both = [per_s["agent"][i] + haproxy[i] for i in runs]
    everything = [both[i] + per_s["redis"][i] for i in runs]
    return {
        "agent_plus_haproxy_ms_per_s": spread(both, 4),
        "agent_haproxy_redis_ms_per_s": spread(everything, 4),
        "haproxy_ms_per_s": spread(haproxy, 4),
        **{f"{name}_ms_per_s": spread(v, 4) for name, v in per_s.items()},
        # utime+stime (10 ms ticks) summed over all windows: a coarse cross-check
        "utime_stime_ms_per_s_all_windows": {
            name: round(ms / seconds, 3) for name, ms in ticks_ms.items()
        },
    }


def _settle(pids: dict[str, int]) -> float:
    """Seconds until the agent is quiet (< QUIET ms/s over a second), at most QUIET_MAX."""
    started = time.perf_counter()
    while time.perf_counter() - started < QUIET_MAX:
        cpu = Cpu({"agent": pids["agent"]}).start()
        time.sleep(1.0)
        if cpu.stop().ms["agent"] / cpu.seconds < QUIET:
            break
    return round(time.perf_counter() - started, 1)


def _schedule(env: Env, names: list[str], sizes: Sizes, start: float) -> dict[str, Any]:
    step = sizes.spread_days * DAY / len(names)
    entries = [(n, start + i * step, start + i * step + 30 * DAY) for i, n in enumerate(names)]

    async def schedule() -> None:
        store = env.store.open()
        try:
            await schedule_all(store.issuance().renewals, entries)
        finally:
            await store.close()

    t0 = time.perf_counter()
    asyncio.run(schedule())
    return {"scheduled": len(entries), "schedule_s": round(time.perf_counter() - t0, 1)}


async def _count(env: Env) -> tuple[int, int]:
    store = env.store.open()
    try:
        return await store.issuance().renewals.count(time.time())
    finally:
        await store.close()


def _renewer_status(stack: Stack) -> Any:
    """What the agent says about its renewer (None if its status has no such section)."""
    issuance = stack.status().get("issuance") or {}
    return issuance.get("renewal")
