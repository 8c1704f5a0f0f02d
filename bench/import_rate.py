"""How fast ``certagent cert import`` puts certificates into Redis.

    .venv/bin/python -m bench.import_rate [--count N] [--repeats R] [--keys shared|distinct]
        [--distinct-count M] [--rsa-count K] [--workers W] [--single-count S] [--cache DIR]
        [--before OTHER/.venv/bin/certagent]

Prints one JSON document on stdout (progress on stderr).  Each case imports a
directory of combined PEM files (leaf + intermediate + key, one test CA, every
leaf distinct) with the real command line, ``certagent cert import --config``,
into a fresh private ``redis-server`` on a free loopback port (configured by
``certagent init --store redis://...``), ``--repeats`` times.  Reported per case:
certificates per second (median, min, max of the repeats, from the command's
own wall time measured here), the CPU seconds of the import (the command and
its worker processes, from ``getrusage(RUSAGE_CHILDREN)``) and of
redis-server (``/proc/<pid>/stat``), the importer's peak RSS, whether the
rate held as the store grew (the rate of the last 10 % of records over the
first 10 %, from Redis's count of records sampled every 0.1 s), and a check
that Redis then holds N records and their events.  ``--before``: the main
case also with another revision's ``certagent``, by turns with this one (the
ratio within one run is the fair comparison on a shared machine).
``--cold``: before each import, the files are dropped from the page cache
(``posix_fadvise(DONTNEED)`` on each, only the bench's own files), so the
import reads them from disk, as a one-off import of a real directory does;
without it, the repeats after the first read files the last one left cached.

Cases: ``--count`` files whose leaves share one ECDSA P-256 key (``--keys
shared``, the default: generating 100,000 key pairs takes minutes) or each
have their own (``--keys distinct``); ``--distinct-count`` files with keys of
their own; ``--rsa-count`` files with RSA-2048 keys of their own;
``--single-count`` files through the one-by-one path (what every import did
before the bulk path: each file validated in the importing process and
written with WATCH/MULTI/EXEC, 8 at a time), for comparison.  Generated files
are kept in ``--cache`` and reused.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench._proc import cpu_ticks, hwm_kb
from bench._runinfo import git_revision, machine, say
from certagent.testing import RedisProcess
from certagent.testing.certs import (
    CA,
    KeyType,
    cert_pem,
    issue_cert,
    key_pem,
    make_ca,
    make_key,
    shared_key,
)
from certagent.testing.processes import certagent_argv, cpu_seconds, free_port

DEFAULT_CACHE = Path(tempfile.gettempdir()) / "certagent-import-bench"
IDS_KEY = "certagent:ids"  # the sorted set of every record's id (certagent init's prefix)
_RATE = re.compile(r"imported (\d+) of (\d+) files in ([0-9.]+) s \((\d+)/s\)")

# Runs the import through the one-by-one path (a store backend without bulk adds).
_SINGLE = """
import asyncio, sys
from pathlib import Path
from certagent import config
from certagent.api.body import upload_policy
from certagent.cli.backends import StoreBackend
from certagent.cli.importer import import_certificates
from certagent.store import open_configured

class OneByOne(StoreBackend):
    def bulk(self):
        return None

async def main():
    settings = config.load(sys.argv[1])
    backend = OneByOne(open_configured(settings), upload_policy(settings))
    try:
        result = await import_certificates(backend, Path(sys.argv[2]), progress=sys.stderr)
    finally:
        await backend.close()
    print(result.summary())

asyncio.run(main())
"""


# --- certificates -----------------------------------------------------------------------------


def _ca_pems(ca: CA) -> tuple[bytes, bytes]:
    """The issuing certificate and key as PEM (a CA object does not pickle)."""
    return cert_pem(ca.cert), key_pem(ca.key)


def _write_range(args: tuple[Path, tuple[bytes, bytes], KeyType, bool, int, int]) -> int:
    directory, (issuer_pem, issuer_key_pem), key_type, distinct, start, stop = args
    issuer = x509.load_pem_x509_certificate(issuer_pem)
    issuer_key = serialization.load_pem_private_key(issuer_key_pem, None)
    assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
    ca = CA(root=issuer, cert=issuer, key=issuer_key, chain=(issuer,))
    chain_tail = issuer_pem
    common = None if distinct else (shared_key(key_type), key_pem(shared_key(key_type)))
    for i in range(start, stop):
        if common is None:
            key = make_key(key_type)
            key_text = key_pem(key)
        else:
            key, key_text = common
        name = f"h{i:06d}.import.bench.test"
        leaf = issue_cert(ca, name, key=key)
        (directory / f"{name}.pem").write_bytes(cert_pem(leaf) + chain_tail + key_text)
    return stop - start


def certificates(cache: Path, count: int, key_type: KeyType, distinct: bool) -> Path:
    """``count`` combined PEM files in ``cache``, made once (every CPU) and reused."""
    label = f"{key_type}-{'distinct' if distinct else 'shared'}-{count}"
    directory = cache / label
    done = directory / ".complete"
    if done.exists():
        say(f"import_rate: reusing {count:,} files in {directory}")
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    say(f"import_rate: generating {count:,} certificates ({label}) in {directory} ...")
    started = time.monotonic()
    ca = make_ca("certagent import bench CA", key_type="ec")
    step = 500
    jobs = [
        (directory, _ca_pems(ca), key_type, distinct, start, min(count, start + step))
        for start in range(0, count, step)
    ]
    if not distinct:
        shared_key(key_type)  # made here, so every forked generator reuses the same one
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        made = sum(pool.imap_unordered(_write_range, jobs))
    assert made == count
    done.write_text(f"{count}\n")
    say(f"import_rate: generated in {time.monotonic() - started:.0f} s")
    return directory


# --- one import --------------------------------------------------------------------------------


class TreeCpu:
    """CPU seconds of a process and all its descendants, sampled from /proc.

    The import's validation workers are children of multiprocessing's fork
    server, which the import never waits for, so getrusage(RUSAGE_CHILDREN)
    misses them: sample every descendant's utime + stime instead and keep
    each one's last value (a worker's last 0.1 s may be missed; they idle at
    the end).
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, float] = {}

    def sample(self) -> None:
        parents: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat.parent.name)] = int(fields[1])
        for pid in parents:
            ancestor = pid
            while ancestor not in (0, 1, self.root):
                ancestor = parents.get(ancestor, 0)
            if ancestor == self.root:
                try:
                    self.seen[pid] = cpu_seconds(pid)
                except (OSError, IndexError, ValueError):
                    continue

    @property
    def total(self) -> float:
        return sum(self.seen.values())

    @property
    def processes(self) -> int:
        return len(self.seen)


def busy_fraction(seconds: float = 2.0) -> float:
    """How busy the machine's CPUs were over the next ``seconds`` (0..1)."""
    busy0, total0 = cpu_ticks()
    time.sleep(seconds)
    busy1, total1 = cpu_ticks()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_idle(limit: float, threshold: float = 0.15) -> tuple[float, float]:
    """Wait up to ``limit`` s until other processes use under ``threshold`` of the CPUs.

    This machine's CPUs are shared with other work (test suites): a run
    starts when they are quiet, or after ``limit``.  Returns (busy fraction
    measured last, seconds waited).
    """
    started = time.monotonic()
    while True:
        busy = busy_fraction()
        waited = time.monotonic() - started
        if busy < threshold or waited >= limit:
            return busy, waited
        say(f"import_rate: CPUs {busy:.0%} busy with other work; waiting ({waited:.0f} s)")


def evict(source: Path) -> int:
    """Drop ``source``'s ``*.pem`` files from the page cache; how many were dropped."""
    dropped = 0
    with os.scandir(source) as entries:
        for entry in entries:
            if entry.name.endswith(".pem") and entry.is_file():
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                dropped += 1
    return dropped


def import_once(
    source: Path, count: int, work: Path, *, workers: int | None, single: bool, idle: float,
    command: list[str] | None = None, cold: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One import into a fresh redis-server; the rate, CPU figures and what Redis holds."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    certagent = command or certagent_argv()
    with RedisProcess(work / "redis") as server:
        assert server.proc is not None
        subprocess.run(
            [*certagent, "init", str(work / "cfg"), "--bind", f"127.0.0.1:{free_port()}",
             "--store", server.url],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        config = work / "cfg" / "certagent.toml"
        if single:
            argv = [sys.executable, "-c", _SINGLE, str(config), str(source)]
        else:
            argv = [*certagent, "cert", "import", "--config", str(config), str(source)]
            if workers is not None:
                argv += ["--workers", str(workers)]
        busy_before, waited = wait_idle(idle) if idle > 0 else (busy_fraction(0.5), 0.0)
        if cold and evict(source) < count:
            raise RuntimeError(f"{source} holds fewer than {count} files")
        load_before = os.getloadavg()[0]
        redis_before = cpu_seconds(server.proc.pid)
        started = time.monotonic()
        with (
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            ) as proc,
            redis.Redis.from_url(server.url) as watcher,
        ):
            tree = TreeCpu(proc.pid)
            rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            peak_kb = 0  # the import process's own peak RSS (VmHWM), read while it runs
            stored: list[tuple[float, int]] = []  # (seconds since start, records in Redis)
            while proc.poll() is None:
                tree.sample()
                peak_kb = max(peak_kb, hwm_kb(proc.pid))
                stored.append((time.monotonic() - started, int(watcher.zcard(IDS_KEY))))
                time.sleep(0.1)
            stdout, stderr = proc.communicate()
        seconds = time.monotonic() - started
        stored.append((seconds, count))
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the import process itself, exactly, from its rusage; its descendants from /proc
        own = rusage.ru_utime - rusage_before.ru_utime + rusage.ru_stime - rusage_before.ru_stime
        tree.seen[proc.pid] = own
        import_cpu = tree.total
        redis_cpu = cpu_seconds(server.proc.pid) - redis_before
        load_after = os.getloadavg()[0]
        done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0:
            raise RuntimeError(
                f"import failed ({done.returncode}): {summary}\n{done.stderr[-2000:]}"
            )
        with redis.Redis.from_url(server.url) as client:
            records = int(client.zcard(IDS_KEY))
            events = int(client.xlen("certagent:events"))
            info = client.info("memory")
    match = _RATE.search(summary)
    if records != count or match is None or int(match.group(1)) != count:
        raise RuntimeError(f"expected {count} records, Redis has {records}: {summary}")
    return {
        "seconds": round(seconds, 3),
        "rate": round(count / seconds, 1),
        "cold": cold,
        "summary": summary,
        "import_cpu_s": round(import_cpu, 2),
        "import_main_cpu_s": round(own, 2),
        "import_processes": tree.processes,
        "import_main_peak_rss_mb": round(peak_kb / 1024, 1),
        "cpu_busy_before": round(busy_before, 3),
        "waited_for_idle_s": round(waited, 1),
        "loadavg_1min_before": round(load_before, 2),
        "loadavg_1min_after": round(load_after, 2),
        "redis_cpu_s": round(redis_cpu, 2),
        "import_cpu_per_cert_us": round(import_cpu / count * 1e6, 1),
        "redis_cpu_per_cert_us": round(redis_cpu / count * 1e6, 1),
        "records": records,
        "events": events,
        "redis_used_memory_mb": round(int(info["used_memory"]) / 1e6, 1),
        **growth(stored, count),
    }


def _crossing(stored: list[tuple[float, int]], level: float) -> float:
    """When the stored count reached ``level`` (linear between the two samples around it)."""
    before = (0.0, 0)
    for moment, records in stored:
        if records >= level:
            span = records - before[1]
            share = (level - before[1]) / span if span else 1.0
            return before[0] + share * (moment - before[0])
        before = (moment, records)
    return stored[-1][0]


def growth(stored: list[tuple[float, int]], count: int) -> dict[str, float]:
    """Rates of the first and the last 10 % of records (from Redis's ZCARD, sampled every 0.1 s).

    The first 10 % is timed from the first record stored (the worker pool's
    start and the first batch are not the store's doing); ``last_to_first``
    below 1 means the import slowed as the store grew.
    """
    start = _crossing(stored, 1)
    first = _crossing(stored, 0.1 * count) - start
    last = _crossing(stored, count) - _crossing(stored, 0.9 * count)
    if first <= 0 or last <= 0:
        return {}
    first_rate, last_rate = 0.1 * count / first, 0.1 * count / last
    return {
        "rate_first_10pct": round(first_rate, 1),
        "rate_last_10pct": round(last_rate, 1),
        "last_to_first": round(last_rate / first_rate, 3),
    }


def run_case(
    label: str, source: Path, count: int, repeats: int, work: Path, *,
    workers: int | None = None, single: bool = False, idle: float = 0.0, cold: bool = False,
) -> dict[str, Any]:  # fmt: skip
    runs = []
    for repeat in range(repeats):
        say(f"import_rate: {label}: run {repeat + 1}/{repeats} ...")
        run = import_once(source, count, work, workers=workers, single=single, idle=idle, cold=cold)
        say(f"import_rate: {label}: {run['rate']:,.0f}/s ({run['summary']})")
        runs.append(run)
    return summarise(label, count, runs, workers=workers, single=single)


def run_before_after(
    label: str, source: Path, count: int, repeats: int, work: Path, before: list[str], *,
    workers: int | None = None, idle: float = 0.0, cold: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """The case with ``before`` (another revision's certagent) and this one, run by turns.

    Turns, not one after the other: the machine's other load changes by the
    minute, and the ratio of the two in the same minutes is the fair figure.
    """
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for repeat in range(repeats):
        for which, command in (("before", before), ("after", None)):
            say(f"import_rate: {label} ({which}): run {repeat + 1}/{repeats} ...")
            run = import_once(
                source, count, work, workers=workers, single=False, idle=idle, command=command,
                cold=cold,
            )  # fmt: skip
            say(f"import_rate: {label} ({which}): {run['rate']:,.0f}/s ({run['summary']})")
            runs[which].append(run)
    cases = [
        summarise(f"{label}, {which}", count, found, workers=workers, single=False)
        for which, found in runs.items()
    ]
    cases[1]["rate_ratio_to_before"] = round(
        statistics.median(
            a["rate"] / b["rate"] for a, b in zip(runs["after"], runs["before"], strict=True)
        ), 2
    )  # fmt: skip
    return cases


def summarise(
    label: str, count: int, runs: list[dict[str, Any]], *, workers: int | None, single: bool
) -> dict[str, Any]:
    rates = [r["rate"] for r in runs]
    growths = [r["last_to_first"] for r in runs if "last_to_first" in r]
    return {
        "case": label,
        "last_to_first_median": statistics.median(growths) if growths else None,
        "count": count,
        "workers": "default" if workers is None else workers,
        "path": "one by one (single adds, 8 at a time)" if single else "bulk (cert import)",
        "rate_median": round(statistics.median(rates), 1),
        "rate_min": min(rates),
        "rate_max": max(rates),
        "import_cpu_s_median": statistics.median(r["import_cpu_s"] for r in runs),
        "import_main_peak_rss_mb_median": statistics.median(
            r["import_main_peak_rss_mb"] for r in runs
        ),
        "redis_cpu_s_median": statistics.median(r["redis_cpu_s"] for r in runs),
        "cpu_us_per_cert_median": statistics.median(
            round((r["import_cpu_s"] + r["redis_cpu_s"]) / count * 1e6, 1) for r in runs
        ),
        "runs": runs,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.import_rate", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--count", type=int, default=100_000, help="files in the main case (100,000)")
    p.add_argument("--repeats", type=int, default=3, help="imports per case (3)")
    p.add_argument("--keys", choices=("shared", "distinct"), default="shared",
                   help="main case: one ECDSA key for every leaf, or one each (shared)")
    p.add_argument("--distinct-count", type=int, default=10_000,
                   help="a case with ECDSA keys of their own (10,000; 0: none)")
    p.add_argument("--rsa-count", type=int, default=2_000,
                   help="a case with RSA-2048 keys of their own (2,000; 0: none)")
    p.add_argument("--single-count", type=int, default=0,
                   help="a case through the one-by-one path, for comparison (0: none)")
    p.add_argument("--workers", type=int, default=None,
                   help="cert import --workers (default: its own)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"generated files ({DEFAULT_CACHE})")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                   help="before each run, wait up to SECONDS for other processes to leave"
                   " the CPUs under 15%% busy (0: start at once)")
    p.add_argument("--before", default=None, metavar="CERTAGENT",
                   help="also run the main case with this certagent command (another"
                   " revision's venv/bin/certagent), by turns with this one, and report the ratio")
    p.add_argument("--cold", action="store_true",
                   help="before each import, drop the files from the page cache: the import"
                   " reads them from disk, as a one-off import does")
    p.add_argument("--out", type=Path, default=None,
                   help="also write OUT/<date>-import-rate[-TAG].json and .md (never overwritten)")
    p.add_argument("--tag", default="", help="a suffix for the --out file names")
    return p.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="certagent-import-rate-"))
    cases = []
    try:
        main_source = certificates(args.cache, args.count, "ec", args.keys == "distinct")
        main_label = (
            f"ECDSA P-256, {'one key each' if args.keys == 'distinct' else 'one shared key'}"
        )
        if args.before:
            cases += run_before_after(
                main_label, main_source, args.count, args.repeats, work / "run",
                args.before.split(), workers=args.workers, idle=args.wait_idle, cold=args.cold,
            )  # fmt: skip
        else:
            cases.append(run_case(
                main_label, main_source, args.count, args.repeats, work / "run",
                workers=args.workers, idle=args.wait_idle, cold=args.cold,
            ))  # fmt: skip
        if args.distinct_count:
            source = certificates(args.cache, args.distinct_count, "ec", True)
            cases.append(run_case(
                "ECDSA P-256, one key each", source, args.distinct_count, args.repeats,
                work / "run", workers=args.workers, idle=args.wait_idle, cold=args.cold,
            ))  # fmt: skip
        if args.rsa_count:
            source = certificates(args.cache, args.rsa_count, "rsa", True)
            cases.append(run_case(
                "RSA-2048, one key each", source, args.rsa_count, args.repeats, work / "run",
                workers=args.workers, idle=args.wait_idle, cold=args.cold,
            ))  # fmt: skip
        if args.single_count:
            source = certificates(args.cache, args.single_count, "ec", args.keys == "distinct")
            cases.append(run_case(
                "ECDSA P-256, one by one (before)", source, args.single_count, args.repeats,
                work / "run", single=True, idle=args.wait_idle,
            ))  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "certagent cert import into Redis",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_revision(),
        "machine": machine(),
        "argv": sys.argv[1:] if argv is None else argv,
        "seconds": round(time.monotonic() - started, 1),
        "cases": cases,
    }
    json.dump(result, sys.stdout, indent=2)
    print()
    if args.out is not None:
        for path in write(result, args.out, args.tag):
            say(f"import_rate: wrote {path}")
    return 0


def write(result: dict[str, Any], out: Path, tag: str = "") -> list[Path]:
    """``<date>-import-rate[-tag].json`` and ``.md`` in ``out``; never overwrites either."""
    stem = out / f"{result['date'][:10]}-import-rate{'-' + tag if tag else ''}"
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    for path in paths:
        if path.exists():
            raise SystemExit(f"import_rate: {path} exists; results are never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(markdown(result))
    return paths


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# certagent cert import into Redis, {result['date'][:10]}",
        "",
        f"`python -m bench.import_rate {' '.join(result['argv'])}` at {result['git']},"
        f" {result['seconds']:.0f} s. Machine: {m['nproc']} CPUs ({m['cpu_model']}),"
        f" {m['mem_total_gb']} GB, {m['redis']}, Python {m['python']}.",
        "",
        "Each run: `certagent cert import --config ...` into a fresh private redis-server;"
        " rate = certificates / wall time of the command; CPU = the command and its worker"
        " processes, and redis-server. Median of the runs, min-max in brackets.",
        "",
        "| case | certificates | rate /s | import CPU s | redis CPU s | CPU µs / cert"
        " | importer peak RSS MB | last 10 % / first 10 % | CPUs busy before | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in result["cases"]:
        loads = [r["cpu_busy_before"] * 100 for r in case["runs"]]
        loadavg = [r["loadavg_1min_before"] for r in case["runs"]]
        growth = case.get("last_to_first_median")
        lines.append(
            f"| {case['case']} ({case['path']}) | {case['count']:,} |"
            f" {case['rate_median']:,.0f} ({case['rate_min']:,.0f}-{case['rate_max']:,.0f}) |"
            f" {case['import_cpu_s_median']:.1f} | {case['redis_cpu_s_median']:.1f} |"
            f" {case['cpu_us_per_cert_median']:.0f} |"
            f" {case['import_main_peak_rss_mb_median']:.0f} |"
            f" {'-' if growth is None else f'{growth:.2f}'} |"
            f" {min(loads):.0f}-{max(loads):.0f} % | {min(loadavg):.1f}-{max(loadavg):.1f} |"
        )
    ratios = [c for c in result["cases"] if "rate_ratio_to_before" in c]
    for case in ratios:
        lines += ["", f"Rate after / before, median of the runs taken by turns:"
                  f" x{case['rate_ratio_to_before']:.2f}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
