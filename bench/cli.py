"""``python -m bench``: run every scenario, print JSON, write JSON + Markdown + PNG.

Progress goes to stderr; stdout carries only the JSON result.  Every process
is started through :mod:`certagent.testing` and stopped by PID at the end, also on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench import _configs, _native, report, scenarios
from bench._certs import Leaves, host, write_preload_files
from bench._load import client_context
from certagent.certs.selfsigned import default_certificate
from certagent.testing import PKI, RedisFixture, RedisProcess, StackError, write_key_file
from certagent.testing.certs import KeyType

REPO = Path(__file__).resolve().parent.parent


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])

    def first_line(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return "?"
        return (out.stdout or out.stderr).splitlines()[0].strip()

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "mem_total_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "haproxy": " ".join(first_line(["haproxy", "-v"]).split()[:3]),
        "redis": " ".join(first_line(["redis-server", "--version"]).split()[:3]),
        "python": platform.python_version(),
    }


def fresh_path(out: Path, stem: str, suffix: str) -> Path:
    """``out/stem.suffix``, or ``stem-2``, ``-3``... : never an existing file."""
    n = 1
    while True:
        path = out / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
        if not path.exists() and not path.with_suffix(".md").exists():
            return path
        n += 1


def git_revision() -> str:
    """The checked-out commit, ``+dirty`` if agent/ has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "agent")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def targets(result: dict[str, Any]) -> dict[str, Any]:
    """Issue 4's targets, each with the figure this run measured and, from this run's
    figures too, what limits it (the report shows that for the targets missed)."""
    big = result["startup"]["rows"][-1]
    churn = result["churn"]
    cw = result["cold_warm"]["added_ms"]
    storm = result["storm"]["certagent"]
    hop = result["hop"]["variants"].get("baseline")
    cache = churn.get("certagent_session_cache_mb") or ["?", "?"]
    cpu = storm.get("cpu", {})
    per_host = cpu.get("haproxy_cpu_ms_per_host", 0) + cpu.get("agent_cpu_ms_per_host", 0)
    nproc = result["meta"]["machine"]["nproc"]
    out: dict[str, Any] = {
        "startup": {
            "target": f"startup at N={big['n']:,} ≥ 100x faster than preload",
            "measured": f"x{big['speedup']:,.0f} ({big['preload_s']:.1f} s vs "
            f"{big['certagent_s']:.3f} s)",
            "met": big["speedup"] >= 100,
            "limit": f"the preload parses every certificate before its port opens "
            f"({big['preload_s'] / big['n'] * 1000:.2f} ms each); certagent's time is the "
            "agent starting and one cold load",
        },
        "churn_rss": {
            "target": "HAProxy RSS flat within ±5 % over the churn",
            "measured": f"±{churn['certagent_max_deviation_pct']} % (round 1 "
            f"{churn['certagent_rss_after_round1_mb']} MB → last {churn['certagent_rss_last_mb']}"
            " MB)",
            "met": churn["certagent_max_deviation_pct"] <= 5,
            "limit": f"the TLS session cache (bounded by tune.ssl.cachesize) went {cache[0]} → "
            f"{cache[1]} MB; without it ±"
            f"{churn.get('certagent_max_deviation_without_session_cache_pct', '?')} %; the rest "
            "follows the cold handshakes (docs/performance.md §2)",
        },
        "cold_p50": {
            "target": "cold added latency ≤ 3 ms p50",
            "measured": f"{cw['p50']} ms",
            "met": cw["p50"] <= 3,
            "limit": "a cold load is the Lua action's exchange with the agent, one Redis round "
            "trip and one pipelined runtime-API write, in which HAProxy's set ssl cert alone "
            "takes ≈0.7 ms of CPU (OpenSSL 3.0's decoders), then the map write; the warm "
            f"handshake took {result['cold_warm']['certagent_warm_ms']['p50']} ms p50 in this "
            "run (docs/performance.md §3)",
        },
        "cold_p99": {
            "target": "cold added latency ≤ 10 ms p99",
            "measured": f"{cw['p99']} ms",
            "met": cw["p99"] <= 10,
            "limit": "as for the p50, plus the machine's scheduling noise",
        },
        "storm_success": {
            "target": "storm: 100 % verified handshakes",
            "measured": f"{storm['success_pct']} % ({storm['verified']}/{storm['hosts']}; "
            f"load_batch 1: {result['storm']['certagent_batch_1']['success_pct']} %)",
            "met": storm["success_pct"] >= 100,
            "limit": f"client errors {storm['errors'] or 'none'}; agent counters "
            f"{storm['agent_counters']}",
        },
        "storm_warm": {
            "target": "storm: warm-host p99 ≤ 2x idle",
            "measured": f"x{storm['warm_p99_ratio']} ({storm['warm_idle_ms']['p99']} → "
            f"{storm['warm_during_ms']['p99']} ms; load_batch 1: x"
            f"{result['storm']['certagent_batch_1']['warm_p99_ratio']}; preload x"
            f"{result['storm']['preload']['warm_p99_ratio']})",
            "met": storm["warm_p99_ratio"] <= 2,
            "limit": f"CPU: a new host cost HAProxy {cpu.get('haproxy_cpu_ms_per_host', '?')} ms "
            f"and the agent {cpu.get('agent_cpu_ms_per_host', '?')} ms, against "
            f"{result['storm']['preload'].get('cpu', {}).get('haproxy_cpu_ms_per_host', '?')} ms "
            f"for a preloaded one; {storm['hosts']:,} new hosts in "
            f"{result['storm']['spread_s']} s ask ≈{per_host * storm['hosts'] / 1000:.1f} "
            f"CPU-seconds of {nproc} CPUs, so everything queues (docs/performance.md §4)",
        },
    }
    if hop is not None:
        new, req = hop["new_connection"], hop["keepalive_request"]
        out["hop_connection"] = {
            "target": "hop ≤ x1.05 HAProxy CPU per new TLS connection",
            "measured": f"x{new['ratio']} (schedstat x{new['sched_ratio']})",
            "met": (new["ratio"] or 99) <= 1.05,
            "limit": f"the hop is a second connection inside HAProxy: {new['certagent_us']} vs "
            f"{new['plain_us']} µs per new connection; no configuration variant removes it "
            "(docs/performance.md §5: ≈1.9x the system calls)",
        }
        out["hop_request"] = {
            "target": "hop ≤ x1.15 HAProxy CPU per keep-alive request",
            "measured": f"x{req['ratio']} (schedstat x{req['sched_ratio']})",
            "met": (req["ratio"] or 99) <= 1.15,
            "limit": f"every request and response crosses two more sockets: "
            f"{req['certagent_us']} vs {req['plain_us']} µs per request (docs/performance.md §5: "
            "≈15 vs 7 system calls per request)",
        }
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="every scenario at tiny sizes (< 2 min)")
    p.add_argument("--rsa", action="store_true", help="RSA-2048 leaves instead of ECDSA P-256")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="(bench/results)")
    p.add_argument(
        "--variants",
        default=",".join(_configs.VARIANTS),
        help="hop config variants to measure, comma-separated (default: all): "
        + ", ".join(_configs.VARIANTS),
    )
    p.add_argument("--keep-work", action="store_true", help="keep the scratch directory")
    args = p.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(_configs.VARIANTS)
    if unknown:
        p.error(f"unknown variants: {', '.join(sorted(unknown))}")
    return args


class _Stop(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def prepare(args: argparse.Namespace, work: Path, sizes: scenarios.Sizes) -> scenarios.Bench:
    """CA, leaves, PEM files for the preload, Redis filled through the store's own put()."""
    key_type: KeyType = "rsa" if args.rsa else "ec"
    pki = PKI.create(work / "root.pem", "certagent bench CA", key_type=key_type)
    leaves = Leaves(pki)
    names = [host(i) for i in range(sizes.store_hosts)]
    redis = RedisProcess(work / "redis").start()
    store = RedisFixture(redis.url, write_key_file(work / "data.key"))
    default_cert = work / "default.pem"
    default_cert.write_bytes(default_certificate())
    default_cert.chmod(0o600)
    bench = scenarios.Bench(
        work=work,
        cafile=pki.cafile,
        sizes=sizes,
        leaves=leaves,
        names=names,
        cert_dir=work / "certs",
        default_cert=default_cert,
        redis=redis,
        store=store,
        ctx=client_context(pki.cafile),
        say=say,
    )
    bench.track(redis.stop)
    build = _native.try_build(work)
    bench.native = build.binary
    say(
        f"bench: storm client: {bench.storm_client}"
        + (f" ({build.reason})" if build.reason else "")
    )
    started = time.perf_counter()
    say(f"bench: issuing {len(names):,} {key_type} leaves, PEM files and Redis records ...")
    with_files = names[: sizes.preload_max]
    stored = store.put(write_preload_files(leaves, with_files, bench.cert_dir), concurrency=64)
    stored += store.put((leaves.bundle(n) for n in names[sizes.preload_max :]), concurrency=64)
    bench.say(f"bench: {stored:,} certificates ready in {time.perf_counter() - started:.1f} s")
    return bench


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = scenarios.SMOKE if args.smoke else scenarios.FULL
    sizes = dataclasses.replace(sizes, variants=tuple(args.variants.split(",")))
    work = Path(tempfile.mkdtemp(prefix="certagent-bench-"))
    revision = git_revision()  # the agent code every process of this run imports
    started = time.perf_counter()
    result: dict[str, Any] = {}
    bench: scenarios.Bench | None = None
    try:
        bench = prepare(args, work, sizes)
        prepared = time.perf_counter() - started
        timings = {}
        for name, fn in (
            ("startup", scenarios.startup),
            ("churn", scenarios.churn),
        ):
            t = time.perf_counter()
            say(f"bench: scenario {name} ...")
            result[name] = fn(bench)
            timings[name] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        say("bench: scenarios cold_warm and storm ...")
        result["cold_warm"], result["storm"] = scenarios.latency(bench)
        timings["cold_warm+storm"] = round(time.perf_counter() - t, 1)
        if bench.preload_big is not None:
            bench.preload_big.stop()
        t = time.perf_counter()
        say("bench: scenario hop ...")
        result["hop"] = scenarios.hop(bench)
        timings["hop"] = round(time.perf_counter() - t, 1)
    finally:
        if bench is not None:
            bench.close_all()
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"bench: scratch directory kept: {work}")
    now = dt.datetime.now(dt.UTC)
    result["meta"] = {
        "date": now.strftime("%Y-%m-%d"),
        "time": now.strftime("%H:%M:%SZ"),
        "mode": "smoke" if args.smoke else "full",
        "key_type": "RSA-2048" if args.rsa else "ECDSA P-256",
        "command": "python -m bench"
        + (" --smoke" if args.smoke else "")
        + (" --rsa" if args.rsa else ""),
        "revision": revision,
        "duration_s": round(time.perf_counter() - started, 1),
        "prepare_s": round(prepared, 1),
        "scenario_s": timings,
        "machine": machine(),
        "sizes": dataclasses.asdict(sizes),
        "storm_client": bench.storm_client if bench is not None else "?",
        "certificates": (
            f"{sizes.store_hosts:,} leaves from one CA (root + intermediate), every leaf "
            f"{'RSA-2048' if args.rsa else 'ECDSA P-256'} with one shared key pair (reused "
            "for speed: HAProxy still parses every certificate and key); the same "
            f"{sizes.store_hosts:,} are in Redis (keys AES-GCM encrypted, written with the "
            f"store's own put) and the first {sizes.preload_max:,} are PEM files for preloading"
        ),
    }
    result["targets"] = targets(result)
    first = {"meta": result.pop("meta"), "targets": result.pop("targets")}
    return first | result


def write(result: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    meta = result["meta"]
    stem = meta["date"] + ("-smoke" if meta["mode"] == "smoke" else "")
    stem += "-rsa" if meta["key_type"].startswith("RSA") else ""
    json_path = fresh_path(out, stem, ".json")  # a second run that day gets -2: never overwrites
    md_path, png_path = json_path.with_suffix(".md"), json_path.with_suffix(".png")
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    plotted = report.plot(result, png_path)
    md_path.write_text(report.markdown(result, png_path.name if plotted else None))
    return [json_path, md_path, *([png_path] if plotted else [])]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    try:
        result = run(args)
    except _Stop as exc:
        say(f"bench: {exc}: stopped")
        return 130
    except (StackError, OSError, ValueError) as exc:
        say(f"bench: error: {exc}")
        return 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
    paths = write(result, args.out)
    print(json.dumps(result, indent=2))
    say("bench: wrote " + ", ".join(str(p) for p in paths))
    return 0
