"""Scenario 2, memory under churn: rounds of distinct hosts through a pool of slots.

HAProxy's worker RSS after each round, against the preload holding every
certificate; how much of it is the TLS session cache, and the usage table's size.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench._load import try_handshake
from bench.versus_preload.context import Bench, mb
from certagent.testing import Stack


def _session_cache_kb(pid: int) -> int:
    """Resident KB of HAProxy's shared-memory TLS session cache (``tune.ssl.cachesize``):
    the worker's shared anonymous mapping, filled as new sessions are stored."""
    total, in_cache = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            in_cache = head[1] == "rw-s" and line.endswith("/dev/zero (deleted)")
        elif in_cache and head[0] == "Rss:":
            total += int(head[1])
    return total


def _table_entries(stack: Stack) -> int:
    """Entries in the usage stick table, from the header of ``show table``."""
    return api.table_used(stack.admin(api.line(api.show_table(stack.settings.usage_table))))


def churn(bench: Bench) -> dict[str, Any]:
    """Rounds of distinct hosts through a pool of ``capacity`` slots; RSS after each round."""
    sizes = bench.sizes
    pre = bench.preload_big
    assert pre is not None
    stack = bench.new_stack("churn", capacity=sizes.churn_capacity)
    stack.start_haproxy()
    stack.start_agent()
    empty_rss = stack.worker_rss_kb()
    rounds = []
    for r in range(sizes.churn_rounds):
        hosts = bench.churn_round(r)
        started = time.perf_counter()
        cold = [try_handshake(stack.port, h, bench.ctx) for h in hosts[: sizes.churn_sample]]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(stack.ensure, hosts[sizes.churn_sample :]))
        sample = bench.rng.sample(hosts, sizes.churn_sample)
        warm = [try_handshake(stack.port, h, bench.ctx) for h in sample]
        preload = [try_handshake(pre.port, h, bench.ctx) for h in sample]
        status = stack.status()
        row = {
            "round": r + 1,
            "certagent_rss_mb": mb(stack.worker_rss_kb()),
            "certagent_session_cache_mb": round(_session_cache_kb(stack.worker_pid()) / 1024, 2),
            "usage_table_entries": _table_entries(stack),
            "preload_rss_mb": mb(pre.worker_rss_kb()),
            "cold_handshakes_ok": sum(x is not None for x in cold),
            "ensure_ok": sum(a == "ok" for a in answers),
            "ensure_other": len(answers) - sum(a == "ok" for a in answers),
            "warm_handshakes_ok": sum(x is not None for x in warm),
            "preload_handshakes_ok": sum(x is not None for x in preload),
            "slots_used": status["slots_used"],
            "recycles": status["loader"].get("recycles"),
            "seconds": round(time.perf_counter() - started, 2),
        }
        bench.say(f"bench: churn: {row}")
        rounds.append(row)
    stack.close()
    after_fill = rounds[0]["certagent_rss_mb"]
    later = [row["certagent_rss_mb"] for row in rounds[1:]] or [after_fill]
    deviation = max(abs(v - after_fill) for v in later) / after_fill * 100
    # the same without the TLS session cache, which every new session fills up to its size
    rest = [row["certagent_rss_mb"] - row["certagent_session_cache_mb"] for row in rounds]
    rest_deviation = max(abs(v - rest[0]) for v in rest[1:] or rest) / rest[0] * 100
    pre_values = [row["preload_rss_mb"] for row in rounds]
    return {
        "capacity": sizes.churn_capacity,
        "store_hosts": len(bench.names),
        "rounds": sizes.churn_rounds,
        "hosts_per_round": sizes.churn_per_round,
        "handshakes_sampled_per_round": sizes.churn_sample,
        "certagent_empty_rss_mb": mb(empty_rss),
        "certagent_rss_after_round1_mb": after_fill,
        "certagent_rss_last_mb": rounds[-1]["certagent_rss_mb"],
        "certagent_max_deviation_pct": round(deviation, 2),
        "certagent_max_deviation_without_session_cache_pct": round(rest_deviation, 2),
        "certagent_session_cache_mb": [
            rounds[0]["certagent_session_cache_mb"],
            rounds[-1]["certagent_session_cache_mb"],
        ],
        "usage_table_entries_last": rounds[-1]["usage_table_entries"],
        "preload_rss_mb": pre_values[-1],
        "preload_max_deviation_pct": round(
            max(abs(v - pre_values[0]) for v in pre_values) / pre_values[0] * 100, 2
        ),
        "per_round": rounds,
    }
