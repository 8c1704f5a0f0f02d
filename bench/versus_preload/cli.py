"""``python -m bench``: run every scenario, print JSON, write JSON + Markdown + PNG.

Progress goes to stderr; stdout carries only the JSON result.  Every process
is started through :mod:`certagent.testing` and stopped by PID at the end, also on
Ctrl-C or SIGTERM.  The scenarios, in order: :mod:`.startup`, :mod:`.churn`,
:mod:`.latency` (cold vs warm, cold storm) and :mod:`.hop`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench import _configs, _native
from bench._certs import Leaves, host, write_preload_files
from bench._load import client_context
from bench._runinfo import RESULTS, fresh_path, git_revision, machine, say
from bench.versus_preload import churn, hop, latency, plot, report, startup
from bench.versus_preload.context import FULL, SMOKE, Bench, Sizes
from bench.versus_preload.targets import targets
from certagent.certs.selfsigned import default_certificate
from certagent.testing import PKI, RedisFixture, RedisProcess, StackError, write_key_file
from certagent.testing.certs import KeyType


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="every scenario at tiny sizes (< 2 min)")
    p.add_argument("--rsa", action="store_true", help="RSA-2048 leaves instead of ECDSA P-256")
    p.add_argument("--out", type=Path, default=RESULTS, help="(bench/results)")
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


def prepare(args: argparse.Namespace, work: Path, sizes: Sizes) -> Bench:
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
    bench = Bench(
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
    sizes = SMOKE if args.smoke else FULL
    sizes = dataclasses.replace(sizes, variants=tuple(args.variants.split(",")))
    work = Path(tempfile.mkdtemp(prefix="certagent-bench-"))
    revision = git_revision()  # the agent code every process of this run imports
    started = time.perf_counter()
    result: dict[str, Any] = {}
    bench: Bench | None = None
    try:
        bench = prepare(args, work, sizes)
        prepared = time.perf_counter() - started
        timings = {}
        for name, fn in (
            ("startup", startup.startup),
            ("churn", churn.churn),
        ):
            t = time.perf_counter()
            say(f"bench: scenario {name} ...")
            result[name] = fn(bench)
            timings[name] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        say("bench: scenarios cold_warm and storm ...")
        result["cold_warm"], result["storm"] = latency.latency(bench)
        timings["cold_warm+storm"] = round(time.perf_counter() - t, 1)
        if bench.preload_big is not None:
            bench.preload_big.stop()
        t = time.perf_counter()
        say("bench: scenario hop ...")
        result["hop"] = hop.hop(bench)
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
    plotted = plot.plot(result, png_path)
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
