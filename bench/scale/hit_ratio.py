"""``hit_ratio``: the agent's sampled victim choice against exact LRU, simulated.

Pure code, no processes: the agent's own :class:`SlotPool` and
:class:`VictimChooser` on synthetic request traces.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from bench.scale.common import Sizes
from certagent.runtime.pool import Slot, SlotPool
from certagent.runtime.usage import HostUsage, VictimChooser


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
        if pool.is_marked(name):
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
        chooser.loaded(pool, slot_name, now)
        pool.mark_host(name, [slot], now)
        usage[name] = HostUsage(now, 1)
    return round(hits / len(trace), 4)
