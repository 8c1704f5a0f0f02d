"""``python -m bench.profile_load [--quick] [--k-large N] [--no-perf] [--budget S]``: run.

The order: fill the small pool, q1 at it, q2, q3, q4, then grow the pool as far as
the time budget allows and q1 again at the large pool.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import FrameType
from typing import Any

import cryptography

import bench.profile_load
from bench._runinfo import git_revision
from bench._runinfo import machine as bench_machine
from bench.profile_load.command_costs import command_costs
from bench.profile_load.handshakes import first_handshakes
from bench.profile_load.payload_costs import payload_costs
from bench.profile_load.perf_profiles import perf_profiles
from bench.profile_load.rig import ProfiledHAProxy
from bench.profile_load.settings import FULL, QUICK, Budget, OutOfTime, Params, say


def run(rig: ProfiledHAProxy) -> None:
    """Every question, in order, into ``rig.result`` (kept as far as it got on a failure)."""
    params, result = rig.params, rig.result
    rig.start()
    idle = rig.meter.idle_us_per_s(1.0)
    say(f"idle worker CPU: {idle:.0f} µs/s")
    result["idle_worker_cpu_us_per_s"] = round(idle, 1)
    say(f"filling the pool to K={params.k_small:,}")
    fills = [rig.grow(params.k_small)]
    result["q1"] = {f"K={rig.k}": command_costs(rig, "small")}
    result["q2"] = payload_costs(rig)
    result["q3"] = first_handshakes(rig)
    result["q3"]["tls_versions"] = dict(rig.tls_versions)
    try:
        result["q4"] = perf_profiles(rig)
    except OutOfTime as exc:
        result["q4"] = {"skipped": str(exc)}
    fills.append(_grow_as_budget_allows(rig, fills[0]["wall_ms_per_slot"] / 1000))
    result["fill"] = fills
    result["k_large_target"] = params.k_large
    result["k_large_used"] = rig.k
    result["q1"][f"K={rig.k}"] = command_costs(rig, "large")


def _grow_as_budget_allows(rig: ProfiledHAProxy, seconds_per_slot: float) -> dict[str, Any]:
    """Grow to ``k_large``, or to ``k_large_fallback`` if the projected fill does not fit."""
    params = rig.params
    # q1 at the large K (set map walks the map: ~2 ms per command at 100k) + teardown
    reserve = 75.0 if params.k_large > 10_000 else 12.0
    projected = (params.k_large - rig.k) * seconds_per_slot * 1.15
    target = params.k_large
    if projected > rig.budget.left() - reserve:
        target = params.k_large_fallback
        say(
            f"projected fill to {params.k_large:,} ({projected:.0f}s) does not fit; "
            f"using {target:,}"
        )
    say(
        f"filling the pool to K={target:,} "
        f"(≈{(target - rig.k) * seconds_per_slot:.0f}s at the measured rate)"
    )
    return rig.grow(target, deadline_left=reserve)


def machine() -> dict[str, Any]:
    """bench's machine description, plus the TLS libraries and the load at the start."""

    def out(argv: list[str]) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return "?"
        return (r.stdout or r.stderr).strip()

    return {
        **bench_machine(),
        # bench_machine() names the build the rig starts ($CERTAGENT_TEST_HAPROXY or PATH's)
        "openssl": out(["openssl", "version"]),
        "python_ssl": ssl.OPENSSL_VERSION,
        "cryptography": cryptography.__version__,
        "git_head": git_revision(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def parse_params(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Params]:
    doc = bench.profile_load.__doc__ or ""
    ap = argparse.ArgumentParser(
        prog="python -m bench.profile_load", description=doc.split("\n\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="small pools and batches, <= 1 minute")
    ap.add_argument(
        "--k-large", type=int, default=None, help="large pool size (default 100000; quick 2000)"
    )
    ap.add_argument("--no-perf", action="store_true", help="skip q4 (perf record)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="bound on the whole run (default 570; quick 58): what does not fit is skipped"
        " (q4, the large pool) or fails the run",
    )
    args = ap.parse_args(argv)
    params = QUICK if args.quick else FULL
    if args.budget:
        params = replace(params, budget_s=args.budget)
    if args.k_large:
        params = replace(
            params,
            k_large=args.k_large,
            k_large_fallback=min(args.k_large, params.k_large_fallback),
        )
    return args, params


def main(argv: Sequence[str] | None = None) -> int:
    args, params = parse_params(argv)
    budget = Budget(params.budget_s)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    workdir = Path(tempfile.mkdtemp(prefix="profile_load-"))
    rig: ProfiledHAProxy | None = None
    result: dict[str, Any] = {
        "bench": "bench/profile_load",
        "started_utc": started,
        "quick": args.quick,
        "params": asdict(params),
        "machine": machine(),
    }
    status = 0
    try:
        rig = ProfiledHAProxy(params, workdir, budget, perf=not args.no_perf)
        run(rig)
        result.update(rig.result)
    except (Exception, KeyboardInterrupt) as exc:  # report what we have, then fail
        status = 1
        result["error"] = f"{type(exc).__name__}: {exc}"
        if rig is not None:
            result.update({k: v for k, v in rig.result.items() if k not in result})
            result["haproxy_log_tail"] = rig.haproxy.log()[-2000:]
        say(f"FAILED: {result['error']}")
    finally:
        if rig is not None:
            say("stopped: " + ", ".join(rig.stop()))
        shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(budget.elapsed(), 1)
    result["loadavg_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(result, indent=1))
    say(f"done in {budget.elapsed():.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
