"""``certagent cert ls`` over N stored certificates: first line, whole listing, peak RSS.

    .venv/bin/python -m bench.cert_ls [--counts 10000,100000] [--repeats 3] [--out DIR]

For each N (ascending, one private Redis filled up to it: the same store grows),
runs the real command line ``certagent cert ls --config ...`` (and ``--json``)
``--repeats`` times with stdout on a pipe read here as it comes. Reported per N
and form: seconds to the first record line and to the end (from the command's
start, interpreter start-up included), lines printed, the command's peak RSS
(``wait4``), each as median, min, max; and the ratio of the last N to the first.
Records share one ECDSA key (bench/_certs.py) and are added 500 per round trip
(the store's bulk writer). Prints JSON; writes
``bench/results/<date>-cert-ls[-N].json``.
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

from bench._certs import Leaves, host
from bench._runinfo import RESULTS, run_meta, say, write_results
from certagent.config import Settings, to_toml
from certagent.testing import PKI, RedisFixture, RedisProcess, certagent_argv, write_key_file

BATCH = 500


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cert_ls", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--counts", default="10000,100000", help="N, comma-separated (ascending)")
    p.add_argument("--repeats", type=int, default=3, help="runs per N and form (3)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


def fill(store: RedisFixture, leaves: Leaves, start: int, stop: int) -> float:
    """Add records ``start .. stop - 1``; seconds taken."""

    async def main() -> None:
        redis_store = store.open()
        writer = redis_store.bulk()
        assert writer is not None
        try:
            for first in range(start, stop, BATCH):
                last = min(stop, first + BATCH)
                await writer.add_many([leaves.bundle(host(i)) for i in range(first, last)])
                if first % 50_000 == 0 and first > start:
                    say(f"cert_ls: {first:,} stored")
        finally:
            await redis_store.close()

    started = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - started


def run_ls(argv: list[str]) -> dict[str, Any]:
    """One run: seconds to the first record line and to EOF, lines, peak RSS (MB)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first: float | None = None
    lines = 0
    for line in proc.stdout:
        lines += 1
        if first is None and b".bench.test" in line:
            first = time.perf_counter() - started
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "first_line_s": None if first is None else round(first, 3),
        "total_s": round(time.perf_counter() - started, 3),
        "lines": lines,
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = sorted(int(c) for c in args.counts.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-cert-ls-"))
    started = time.perf_counter()
    redis = RedisProcess(work / "redis").start()
    rows = []
    try:
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        leaves = Leaves(PKI.create(work / "ca.pem"))
        cfg = work / "certagent.toml"
        cfg.write_text(to_toml(Settings(store=redis.url, key_file=str(store.key_file))))
        stored = 0
        for n in counts:
            say(f"cert_ls: filling to {n:,}")
            fill_s = fill(store, leaves, stored, n)
            stored = n
            row: dict[str, Any] = {"n": n, "fill_s": round(fill_s, 1)}
            for form, extra in (("table", []), ("json", ["--json"])):
                runs = []
                for r in range(args.repeats):
                    say(f"cert_ls: N={n:,} {form} run {r + 1}")
                    runs.append(
                        run_ls([*certagent_argv(), "cert", "ls", "--config", str(cfg), *extra])
                    )
                row[form] = {
                    "ok": all(x["exit"] == 0 for x in runs),
                    "lines": runs[0]["lines"],
                    **{
                        key: spread([x[key] for x in runs])
                        for key in ("first_line_s", "total_s", "peak_rss_mb")
                    },
                }
            rows.append(row)
    finally:
        redis.stop()
    first_row, last_row = rows[0], rows[-1]
    result = {
        "meta": {
            **run_meta(),
            "repeats": args.repeats,
        },
        "rows": rows,
        "ratio_last_first": {
            f"{form}_{key}": round(
                last_row[form][key]["median"] / first_row[form][key]["median"], 2
            )
            for form in ("table", "json")
            for key in ("first_line_s", "peak_rss_mb", "total_s")
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    path = write_results(args.out, f"{result['meta']['date'][:10]}-cert-ls", text)
    say(f"cert_ls: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
