"""The issuance bench's repeats: per variant, the CA alone, then first connections."""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench._load import percentile
from bench.issuance import breakdown
from bench.issuance.measure import DirectCa, Timed, first_connections
from bench.issuance.rig import SUFFIX, Rig
from bench.scale.common import Cpu, spread


@dataclass(frozen=True)
class Sizes:
    names: int = 100  # new names per repeat and variant (p99 = the 99th of 100)
    repeats: int = 3
    workers: int = 10  # clients at once in the concurrent variant (= acme_concurrency)

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(names=3, repeats=2, workers=3)


def name(kind: str, variant: str, repeat: int, i: int) -> str:
    """``fc-seq-1-007.issuance.bench.test``: kind, variant, repeat, index."""
    return f"{kind}-{variant}-{repeat}-{i:03d}.{SUFFIX}"


def pebble_version() -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "pebble"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


def _ms(timed: Timed) -> dict[str, Any]:
    ms = [s * 1000 for s in timed.seconds]
    return {
        "count": len(ms),
        "p50": round(percentile(ms, 50), 1),
        "p99": round(percentile(ms, 99), 1),
        "max": round(max(ms), 1) if ms else None,
        "mean": round(statistics.fmean(ms), 1) if ms else None,
        "wall_s": round(timed.wall, 2),
        "fallback": timed.fallback,
        "failed": timed.failed,
        "errors": timed.errors,
    }


def _per_issuance(cpu: Cpu, count: int) -> dict[str, float]:
    return {k: round(v / count, 2) for k, v in cpu.ms.items()} if count else {}


def one_repeat(rig: Rig, repeat: int, variant: str, workers: int, count: int) -> dict[str, Any]:
    """The CA alone for ``count`` names, then ``count`` first connections; both timed."""
    assert rig.stack is not None and rig.pebble is not None
    stack, ca = rig.stack, rig.pebble
    direct = DirectCa(ca.directory_url, ca.ca_file, stack.settings.haproxy_socket,
                      stack.settings.challenge_map)  # fmt: skip
    pids = rig.pids()

    names = [name("ca", variant, repeat, i) for i in range(count)]
    cpu = Cpu({**pids, "acme_client": os.getpid()})  # the bench's own client: the agent's part
    alone = direct.orders(names, workers, name("ca-warmup", variant, repeat, 0), cpu)
    ca_cpu = _per_issuance(cpu, len(alone.seconds))

    names = [name("fc", variant, repeat, i) for i in range(count)]
    orders_before = ca.orders()
    cpu = Cpu(pids).start()
    first = first_connections(stack.port, rig.root, names, workers)
    cpu.stop()
    rig.check_alive()
    parts = breakdown.segments(stack.agent_log(), first.marks)
    return {
        "breakdown": breakdown.summary(parts, alone.order_seconds),
        "first_connection_ms": _ms(first),
        "ca_order_ms": _ms(alone),
        "orders_for_first_connections": ca.orders() - orders_before,
        "cpu_ms_per_issuance": _per_issuance(cpu, len(first.seconds)),
        "cpu_ms_per_direct_order": ca_cpu,
    }


def _figures(runs: Sequence[dict[str, Any]], count: int) -> dict[str, Any]:
    """Medians of the repeats (min, max) of one variant; differences within each repeat."""

    def over(figure: str, p: str) -> dict[str, Any]:
        return spread([r[figure][p] for r in runs], 1)

    def overhead(p: str) -> dict[str, Any]:
        return spread([r["first_connection_ms"][p] - r["ca_order_ms"][p] for r in runs], 1)

    processes = sorted(runs[0]["cpu_ms_per_issuance"]) if runs else []
    total = sum(r["first_connection_ms"]["count"] for r in runs)
    return {
        "first_connection_ms": {p: over("first_connection_ms", p) for p in ("p50", "p99")},
        "ca_order_ms": {p: over("ca_order_ms", p) for p in ("p50", "p99")},
        "overhead_ms": {p: overhead(p) for p in ("p50", "p99")},
        "cpu_ms_per_issuance": {
            k: spread([r["cpu_ms_per_issuance"].get(k, float("nan")) for r in runs], 2)
            for k in processes
        },
        "cpu_ms_per_direct_order": {
            k: spread([r["cpu_ms_per_direct_order"].get(k, float("nan")) for r in runs], 2)
            for k in [*processes, "acme_client"]
        },
        "breakdown_p50_ms": {
            key: spread([r["breakdown"][key] for r in runs], 1)
            for key in runs[0]["breakdown"]
            if key.endswith("_p50_ms")
        }
        if runs
        else {},
        "verified": total,
        "asked": count * len(runs),
        "fallback": sum(r["first_connection_ms"]["fallback"] for r in runs),
        "failed": sum(r["first_connection_ms"]["failed"] for r in runs),
        "ca_failed": sum(r["ca_order_ms"]["failed"] for r in runs),
        "orders_per_name": round(
            sum(r["orders_for_first_connections"] for r in runs) / (count * len(runs)), 3
        ),
        "runs": list(runs),
    }


VARIANTS = ("sequential", "concurrent")


def run(rig: Rig, sizes: Sizes, say: Callable[[str], None]) -> dict[str, Any]:
    """Every repeat of both variants, interleaved; one figure set per variant."""
    assert rig.stack is not None
    warm = first_connections(rig.stack.port, rig.root, [f"warmup.{SUFFIX}"], 1)
    if not warm.seconds:  # the account is registered on the first order: not timed
        raise RuntimeError(f"the warm-up first connection failed: {warm.errors or 'fallback'}")
    say(f"bench.issuance: warm-up issuance {warm.seconds[0] * 1000:.0f} ms (account registered)")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(1, sizes.repeats + 1):
        for variant in VARIANTS:
            workers = 1 if variant == "sequential" else sizes.workers
            result = one_repeat(rig, r, variant[:3], workers, sizes.names)
            runs[variant].append(result)
            fc, ca = result["first_connection_ms"], result["ca_order_ms"]
            say(
                f"bench.issuance: repeat {r} {variant}: first connection p50 {fc['p50']} / "
                f"p99 {fc['p99']} ms ({fc['count']} verified), CA alone p50 {ca['p50']} / "
                f"p99 {ca['p99']} ms"
            )
    return {v: {"workers": 1 if v == "sequential" else sizes.workers,
                **_figures(runs[v], sizes.names)} for v in VARIANTS}  # fmt: skip
