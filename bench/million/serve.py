"""A settled agent's serving path, and ``certagent cert ls`` over the whole store.

``cold_warm``: never-seen hosts one after another (``bench/tlsload.c``, one at a
time), then the same hosts again (warm: a full handshake of a loaded host).
``storms``: 1,000 never-seen hosts within 1 s (all at once), verified share and
latencies.  ``listing``: the real command line, stdout read as it comes: time to
the first record line and to the end, lines, peak RSS (``wait4``); runs after
the first may stop at the first line (then killed by PID: its peak so far).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench._native import storm_native
from bench.scale.common import latency_ms, spread
from certagent.testing import Stack, certagent_argv


def cold_warm(stack: Stack, native: Path, cafile: Path, hosts: list[str]) -> dict[str, Any]:
    cold = asyncio.run(storm_native(native, stack.port, hosts, cafile, 1, 0.0))
    warm = asyncio.run(storm_native(native, stack.port, hosts, cafile, 1, 0.0))
    return {
        "hosts": len(hosts),
        "cold_verified": cold.ok,
        "warm_verified": warm.ok,
        "cold_ms": latency_ms(cold.latencies),
        "warm_ms": latency_ms(warm.latencies),
    }


def storms(stack: Stack, native: Path, cafile: Path, waves: list[list[str]]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for wave in waves:
        result = asyncio.run(storm_native(native, stack.port, wave, cafile, len(wave), 1.0))
        runs.append(
            {
                "hosts": len(wave),
                "verified": result.ok,
                "verified_pct": round(100 * result.ok / len(wave), 1),
                "served_after_last_arrival_s": round(result.seconds - result.launch_span, 3),
                "latency_ms": latency_ms(result.latencies),
                "errors": result.errors,
            }
        )
    return {
        "runs": runs,
        "verified_pct": spread([r["verified_pct"] for r in runs], 1),
        "p99_ms": spread([r["latency_ms"]["p99"] for r in runs], 1),
    }


def one_listing(stack: Stack, marker: bytes, whole: bool) -> dict[str, Any]:
    """``certagent cert ls --config``: first record line, end (or stop at the first line)."""
    argv = [*certagent_argv(), "cert", "ls", "--config", str(stack.config_path)]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=stack.env)
    assert proc.stdout is not None
    first: float | None = None
    lines = 0
    for line in proc.stdout:
        lines += 1
        if first is None and marker in line:
            first = time.perf_counter() - started
            if not whole:
                proc.kill()  # this PID only
                break
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "whole": whole,
        "exit": proc.returncode,
        "first_line_s": None if first is None else round(first, 3),
        "total_s": round(time.perf_counter() - started, 2) if whole else None,
        "lines": lines if whole else None,
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def listing(stack: Stack, marker: bytes, repeats: int, whole_runs: int) -> dict[str, Any]:
    """``repeats`` runs, the first ``whole_runs`` of them to the end."""
    runs = [one_listing(stack, marker, r < whole_runs) for r in range(repeats)]
    whole = [r for r in runs if r["whole"]]
    return {
        "runs": runs,
        "ok": all(r["exit"] == 0 for r in whole),
        "lines": whole[0]["lines"] if whole else None,
        "first_line_s": spread([r["first_line_s"] or float("nan") for r in runs]),
        "total_s": spread([r["total_s"] for r in whole], 2),
        "peak_rss_mb": spread([r["peak_rss_mb"] for r in whole], 1),
    }
