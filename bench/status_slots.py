"""``certagent status --json`` with K loaded slots: exits 0, parses, how long, how big.

    .venv/bin/python -m bench.status_slots [--slots K] [--repeats R] [--out DIR]

Stores K certificates (one shared ECDSA key, bench/_certs.py) in a private
Redis, starts HAProxy and an agent with capacity K, loads every slot over the
agent's socket (as the Lua action asks), then runs the real command line
``certagent status --json --config ...`` R times. Reported: exit codes, whether
stdout parsed with K slots, its size, wall time (median, min, max), the
command's peak RSS (``wait4``), and the agent's RSS before and after. Prints
JSON on stdout and writes ``bench/results/<date>-status-slots[-N].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._certs import Leaves
from bench._runinfo import RESULTS, publish, run_meta, say
from bench.scale.common import Env, ensure_many, host, shared_key_bundles
from certagent.testing import (
    PKI,
    RedisFixture,
    RedisProcess,
    certagent_argv,
    rss_kb,
    write_key_file,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.status_slots",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    p.add_argument("--slots", type=int, default=100_000, help="K, slots loaded (100,000)")
    p.add_argument("--repeats", type=int, default=3, help="runs of the command (3)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


def run_status(argv: list[str], env: dict[str, str], work: Path) -> dict[str, Any]:
    """One ``certagent status --json``: exit code, seconds, bytes, slots parsed, peak RSS."""
    out_path, err_path = work / "status.out", work / "status.err"
    with out_path.open("wb") as out_file, err_path.open("wb") as err_file:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=out_file, stderr=err_file)
        _, wait_status, usage = os.wait4(proc.pid, 0)  # its own peak RSS, not the max so far
        seconds = time.perf_counter() - started
    out = out_path.read_bytes()
    try:
        slots: int | None = len(json.loads(out)["slots"])
    except (ValueError, KeyError):
        slots = None
    return {
        "exit": os.waitstatus_to_exitcode(wait_status),
        "seconds": round(seconds, 2),
        "stdout_bytes": len(out),
        "slots_parsed": slots,
        "stderr_tail": err_path.read_text(errors="replace")[-300:],
        "cli_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-status-slots-"))
    started = time.perf_counter()
    redis = RedisProcess(work / "redis").start()
    env: Env | None = None
    try:
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        pki = PKI.create(work / "ca.pem")
        env = Env(work, redis, store, pki, say)
        names = [host("q", i) for i in range(args.slots)]
        say(f"status_slots: storing {len(names):,} certificates")
        store.put(shared_key_bundles(Leaves(pki), names), concurrency=64)
        stack = env.stack("status", capacity=len(names))
        say(f"status_slots: loading {len(names):,} slots")
        t0 = time.perf_counter()
        answers = asyncio.run(ensure_many(stack.settings.agent_socket, names))
        fill_s = time.perf_counter() - t0
        assert stack.agent is not None
        agent_before = rss_kb(stack.agent.pid) / 1024
        argv = [*certagent_argv(), "status", "--json", "--config", str(stack.config_path)]
        runs = []
        for r in range(args.repeats):
            say(f"status_slots: certagent status --json, run {r + 1}")
            runs.append(run_status(argv, stack.env, work))
        agent_after = rss_kb(stack.agent.pid) / 1024
        secs = [r["seconds"] for r in runs]
        result = {
            "meta": {
                **run_meta(),
            },
            "slots": args.slots,
            "fill_answers": answers,
            "fill_s": round(fill_s, 1),
            "all_exit_0_and_parsed": all(
                r["exit"] == 0 and r["slots_parsed"] == args.slots for r in runs
            ),
            "seconds": {"median": statistics.median(secs), "min": min(secs), "max": max(secs)},
            "agent_rss_mb": {"before": round(agent_before, 1), "after": round(agent_after, 1)},
            "runs": runs,
            "total_s": round(time.perf_counter() - started, 1),
        }
    finally:
        if env is not None:
            env.close_all()
        redis.stop()
    stem = f"{result['meta']['date'][:10]}-status-slots"
    path = publish(result, args.out, stem)
    say(f"status_slots: wrote {path}")
    return 0 if result["all_exit_0_and_parsed"] else 1


if __name__ == "__main__":
    sys.exit(main())
