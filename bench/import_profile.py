"""Where the importing process of ``cert import`` spends its CPU (cProfile), before and after.

    .venv/bin/python -m bench.import_profile [--count N] [--before OTHER/.venv/bin/python]
        [--cache DIR] [--out DIR]

Prints one JSON document on stdout (progress on stderr).  Runs ``python -m
cProfile -m certagent cert import`` of ``--count`` files of ``bench.import_rate
--keys distinct`` into a fresh private ``redis-server``, with this checkout's
Python and, with ``--before``, another revision's, by turns.  cProfile sees the
importing process's main thread only (the event loop: listing files, writing to
Redis, reading replies); the worker processes are in ``bench.import_stages``.
Reported per revision: the import's wall time, its own CPU (``getrusage`` of
the child, profiler included: read the shares, not the absolute figures), the
profile's total, and the functions with the most time of their own, in µs per
certificate.
"""

from __future__ import annotations

import argparse
import json
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._runinfo import run_meta, say, write_results
from bench.import_rate import DEFAULT_CACHE, certificates
from certagent.testing import RedisProcess
from certagent.testing.processes import free_port

TOP = 12


def profile_once(python: str, source: Path, count: int, work: Path) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = work / "import.prof"
    with RedisProcess(work / "redis") as server:
        subprocess.run(
            [python, "-m", "certagent", "init", str(work / "cfg"),
             "--bind", f"127.0.0.1:{free_port()}", "--store", server.url],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        argv = [python, "-m", "cProfile", "-o", str(out), "-m", "certagent", "cert", "import",
                "--config", str(work / "cfg" / "certagent.toml"), str(source)]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        seconds = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"import failed: {done.stdout[-500:]} {done.stderr[-1500:]}")
    own = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    stats = pstats.Stats(str(out))
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:TOP]
    top = [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls": calls,
            "own_us_per_cert": round(own_s / count * 1e6, 1),
            "cumulative_us_per_cert": round(cum_s / count * 1e6, 1),
        }
        for (file, line, name), (_, calls, own_s, cum_s, _) in rows
    ]
    return {
        "seconds": round(seconds, 2),
        "summary": (done.stdout.strip().splitlines() or [""])[-1],
        "main_cpu_s_profiled": round(own, 2),
        "profile_total_s": round(stats.total_tt, 2),  # type: ignore[attr-defined]
        "top_own_time": top,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.import_profile", description=__doc__)
    p.add_argument("--count", type=int, default=20_000, help="files (20,000)")
    p.add_argument("--before", default=None, metavar="PYTHON", help="another revision's python")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=None, help="write results there too")
    args = p.parse_args(argv)
    source = certificates(args.cache, args.count, "ec", True)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="import-profile-") as tmp:
        for label, python in (("before", args.before), ("after", sys.executable)):
            if python is None:
                continue
            say(f"import_profile: {label} ({python}) ...")
            runs[label] = profile_once(python, source, args.count, Path(tmp) / label)
    result = {
        "benchmark": "cert import: the importing process's main thread under cProfile",
        "meta": run_meta(),
        "argv": sys.argv[1:] if argv is None else argv,
        "files": args.count,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        stem = f"{result['meta']['date'][:10]}-import-profile"
        say(f"import_profile: wrote {write_results(args.out, stem, text, markdown(result))}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# cert import: the importing process under cProfile, {result['meta']['date'][:10]}",
        "",
        f"`python -m bench.import_profile {' '.join(result['argv'])}` at"
        f" {result['meta']['revision']}; {result['files']:,} files (ECDSA P-256, own key, one"
        " shared intermediate). The main thread only; times include the profiler's overhead"
        " (compare shares, not absolutes).",
    ]
    for label, run in result["runs"].items():
        lines += [
            "",
            f"## {label}: {run['seconds']} s; {run['summary']}",
            "",
            f"Process CPU (profiled) {run['main_cpu_s_profiled']} s; profile total"
            f" {run['profile_total_s']} s (waiting in epoll included).",
            "",
            "| function | calls | own µs / cert | cumulative µs / cert |",
            "|---|---:|---:|---:|",
            *(
                f"| `{row['function']}` | {row['calls']:,} | {row['own_us_per_cert']} |"
                f" {row['cumulative_us_per_cert']} |"
                for row in run["top_own_time"]
            ),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
