"""Scenario 5, the steady-state cost of the hop: HAProxy CPU per operation.

Per new TLS connection and per keep-alive request, the certagent path (fe_sni and
the unix-socket hop) against a plain TLS bind preloading the same certificates in
the same HAProxy, for each configuration variant of :mod:`bench._configs`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench import _configs
from bench._certs import write_crt_list
from bench._load import Counted, keepalive_requests, new_connections, timed_handshake
from bench._proc import schedstat_ns
from bench.versus_preload.context import Bench
from certagent.testing import Stack, StackError, cpu_seconds, free_port


def _cpu_sample(pid: int) -> tuple[float, int]:
    return cpu_seconds(pid), schedstat_ns(pid)


def _measure_new(bench: Bench, port: int, hosts: Sequence[str], pid: int) -> dict[str, float]:
    before = _cpu_sample(pid)
    counted = asyncio.run(new_connections(port, hosts, bench.ctx, bench.sizes.hop_new_connections))
    time.sleep(0.1)  # let HAProxy finish the last closes
    after = _cpu_sample(pid)
    return _per_operation(counted, before, after, "new connections")


def _measure_keepalive(bench: Bench, port: int, hosts: Sequence[str], pid: int) -> dict[str, float]:
    sizes = bench.sizes
    counted, before, after = asyncio.run(
        keepalive_requests(
            port,
            hosts,
            bench.ctx,
            sizes.hop_keepalive_connections,
            sizes.hop_keepalive_requests,
            lambda: _cpu_sample(pid),
        )
    )
    return _per_operation(counted, before, after, "keep-alive requests")


def _per_operation(
    counted: Counted, before: tuple[float, int], after: tuple[float, int], what: str
) -> dict[str, float]:
    """HAProxy CPU per operation between two :func:`_cpu_sample` readings; all must succeed."""
    if counted.failed:
        raise StackError(f"{counted.failed} {what} failed: {counted.errors}")
    return {
        "ops": counted.ok,
        "cpu_us": (after[0] - before[0]) / counted.ok * 1e6,
        "sched_us": (after[1] - before[1]) / counted.ok / 1e3,
        "client_s": counted.seconds,
    }


def _ratio(x: float, y: float) -> float | None:
    return x / y if x > 0 and y > 0 else None  # None: too few clock ticks (smoke sizes)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _paired(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict[str, Any]:
    ratios = [_ratio(x["cpu_us"], y["cpu_us"]) for x, y in zip(a, b, strict=True)]
    sched = [_ratio(x["sched_us"], y["sched_us"]) for x, y in zip(a, b, strict=True)]
    return {
        "ops_per_run": int(a[0]["ops"]),
        "certagent_us": round(statistics.median(x["cpu_us"] for x in a), 2),
        "plain_us": round(statistics.median(y["cpu_us"] for y in b), 2),
        "ratios": [None if r is None else round(r, 3) for r in ratios],
        "ratio": _median(ratios),
        "sched_ratio": _median(sched),
        "certagent_sched_us": round(statistics.median(x["sched_us"] for x in a), 2),
        "plain_sched_us": round(statistics.median(y["sched_us"] for y in b), 2),
    }


def hop(bench: Bench) -> dict[str, Any]:
    """HAProxy CPU per new TLS connection and per keep-alive request, certagent path (A,
    via fe_sni and the unix-socket hop) vs a plain TLS bind preloading the same
    certificates (B), in the same HAProxy process, alternated A/B/A/B; the median of the
    paired ratios.  One HAProxy + agent per config variant, all running; the variants are
    measured in turn within each pair round (rotating the order), so slow drifts of the
    machine hit every variant alike."""
    sizes = bench.sizes
    hosts = bench.cold_warm_hosts()[: sizes.hop_hosts]
    runs: list[tuple[str, Stack, int, int]] = []
    for name in sizes.variants:
        stack = bench.new_stack(f"hop-{name}", capacity=sizes.hop_hosts + 10)
        plain_list = write_crt_list(stack.directory / "plain.crtlist", bench.cert_dir, hosts)
        plain_port = free_port()
        cfg = _configs.VARIANTS[name](stack.haproxy_cfg.read_text())
        stack.haproxy_cfg.write_text(_configs.with_plain_frontend(cfg, plain_port, plain_list))
        stack.start_haproxy()
        stack.start_agent()
        for host in hosts:  # loads each host, then checks the plain bind serves it too
            timed_handshake(stack.port, host, bench.ctx)
            timed_handshake(plain_port, host, bench.ctx)
        runs.append((name, stack, plain_port, stack.worker_pid()))
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {"new_a": [], "new_b": [], "ka_a": [], "ka_b": []} for name, *_ in runs
    }
    for pair in range(sizes.hop_pairs):
        shift = pair % len(runs)
        for name, stack, plain_port, pid in runs[shift:] + runs[:shift]:
            got = samples[name]
            got["new_a"].append(_measure_new(bench, stack.port, hosts, pid))
            got["new_b"].append(_measure_new(bench, plain_port, hosts, pid))
            got["ka_a"].append(_measure_keepalive(bench, stack.port, hosts, pid))
            got["ka_b"].append(_measure_keepalive(bench, plain_port, hosts, pid))
        bench.say(f"bench: hop: pair round {pair + 1}/{sizes.hop_pairs} done")
    variants: dict[str, Any] = {}
    for name, stack, _, _ in runs:
        got = samples[name]
        variants[name] = {
            "informative_only": name in _configs.INFORMATIVE,
            "new_connection": _paired(got["new_a"], got["new_b"]),
            "keepalive_request": _paired(got["ka_a"], got["ka_b"]),
        }
        stack.close()
        bench.say(
            f"bench: hop {name}: new connection x{variants[name]['new_connection']['ratio']}"
            f", keep-alive request x{variants[name]['keepalive_request']['ratio']}"
        )
    return {
        "hosts": len(hosts),
        "pairs": sizes.hop_pairs,
        "new_connections_per_run": sizes.hop_new_connections,
        "keepalive_connections": sizes.hop_keepalive_connections,
        "keepalive_requests_per_connection": sizes.hop_keepalive_requests,
        "variants": variants,
    }
