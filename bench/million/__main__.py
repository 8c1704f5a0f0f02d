"""``python -m bench.million [--smoke]``: the same steps at N = 10^4 and 10^6, ratios, targets.

One run, per N (ascending; each N in a fresh private redis-server and HAProxy
2.6 on free loopback ports, capacity 500):

1. ``certagent cert import`` of N combined PEM files (ECDSA P-256 leaves, each
   with its own key, one shared intermediate; generated once over every CPU
   and cached in ``--cache``, ≈2 min for 10^6; the smaller N is hard links to
   the larger set's first files): rate, its first and last tenth, importer RSS;
   then Redis ``used_memory`` per certificate, a timed BGSAVE and the RDB's size;
2. the first start after the import (no name-filter snapshot yet: a rebuild),
   until its snapshot is in the store;
3. ``--repeats`` starts (from the snapshot): start → first verified handshake
   of a never-seen host, start → filter ready, CPU of the agent, Redis and
   HAProxy's worker in the first 10 s, the agent's peak RSS;
4. ``--repeats`` floods of 1,000 made-up names a second from the agent's first
   accepted connection, with 10 real new hosts a second arriving meanwhile,
   then as many on a settled agent: made-up names reaching the store, lookups
   per second, the real hosts' p99;
5. on the settled agent: 200 never-seen hosts one at a time (cold p50/p99),
   the same again (warm p50), storms of 1,000 new hosts within 1 s;
6. ``certagent cert ls`` over the whole store: ``--repeats`` runs for the first
   line, the first (all of them up to 10^5) to the end for wall time and RSS.

Prints one JSON document; writes ``bench/results/<date>-million[-smoke][-N].json``
and ``.md`` (never over an earlier result).  ``--smoke``: N = 10^2 and 10^3, one
repeat, 3 s windows, ≈25 s on a quiet machine.  Every process is started through
:mod:`certagent.testing` and stopped by its PID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import redis as redis_py

from bench import _native
from bench._load import client_context, percentile
from bench._proc import hwm_kb
from bench._runinfo import RESULTS, publish, run_meta, say
from bench.million import generate, serve, start, store
from bench.million.report import markdown, must_show, table
from bench.scale.common import spread
from certagent.testing import RedisProcess, Stack, write_key_file

SNAPSHOT = "certagent:namefilter"


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...] = (10_000, 1_000_000)
    repeats: int = 3
    window: float = 10.0  # seconds of a start measured
    flood_rate: float = 1_000.0  # made-up names a second
    flood_seconds: int = 6
    real_rate: int = 10  # real new hosts a second during a flood
    cold_hosts: int = 200
    storm_hosts: int = 1_000
    storms: int = 3
    capacity: int = 500
    ls_whole: int = 1  # cert ls runs to the end above 10^5 (all of them up to 10^5)
    seed: int = 1

    @classmethod
    def smoke(cls) -> Plan:
        return cls(
            sizes=(100, 1_000), repeats=1, window=3.0, flood_rate=200.0, flood_seconds=2,
            real_rate=4, cold_hosts=10, storm_hosts=20, storms=1, capacity=50,
        )  # fmt: skip


class Hosts:
    """Never-seen host names, handed out once each, in order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.next = 0

    def take(self, k: int) -> list[str]:
        if self.next + k > self.count:
            raise RuntimeError(f"{self.next + k} new hosts asked of a store of {self.count}")
        names = [generate.host(i) for i in range(self.next, self.next + k)]
        self.next += k
        return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.million", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--smoke", action="store_true", help="N = 10^2 and 10^3, short windows")
    p.add_argument("--sizes", default=None, help="N, comma-separated (10000,1000000)")
    p.add_argument("--repeats", type=int, default=None, help="starts, floods, cert ls runs (3)")
    p.add_argument("--seed", type=int, default=1, help="labels the generated set (1)")
    p.add_argument("--cache", type=Path, default=generate.DEFAULT_CACHE,
                   help=f"generated certificates ({generate.DEFAULT_CACHE})")  # fmt: skip
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


def _median_spread(runs: list[dict[str, Any]], key: str, digits: int = 3) -> dict[str, Any]:
    return spread([float("nan") if r.get(key) is None else float(r[key]) for r in runs], digits)


def starts_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    flat = [
        {
            **r,
            "agent_cpu_ms": r["cpu_ms"]["agent"],
            "redis_cpu_ms": r["cpu_ms"]["redis"],
            "haproxy_cpu_ms": r["cpu_ms"]["haproxy"],
        }
        for r in runs
    ]
    out: dict[str, Any] = {
        key: _median_spread(flat, key, digits)
        for key, digits in (
            ("first_verified_handshake_s", 3),
            ("filter_ready_s", 3),
            ("agent_cpu_ms", 1),
            ("redis_cpu_ms", 1),
            ("haproxy_cpu_ms", 1),
            ("agent_peak_rss_mb", 1),
        )
    }
    out["sources"] = [(r["filter"] or {}).get("source") for r in runs]
    out["runs"] = runs
    return out


def floods_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    for r in runs:
        r["max_lookups_per_s"] = max(r["lookups_per_second"] or [0])
        r["real_p99_ms"] = r["real_latency_ms"]["p99"]
    pooled = [s * 1000 for r in runs for s in r.pop("real_latencies_s")]
    return {
        "made_up_reaching_store": _median_spread(runs, "made_up_reaching_store", 0),
        "max_lookups_per_s": _median_spread(runs, "max_lookups_per_s", 0),
        "real_p99_ms": _median_spread(runs, "real_p99_ms", 1),
        "real_p99_ms_pooled": round(percentile(pooled, 99), 1) if pooled else None,
        "runs": runs,
    }


def first_start(stack: Stack, client: redis_py.Redis, limit: float = 300.0) -> dict[str, Any]:
    """The first start after the import: until the filter is ready and its snapshot stored."""
    spawned = time.monotonic()
    proc = stack.start_agent(wait=False)
    ready: float | None = None
    while time.monotonic() - spawned < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited {proc.returncode}: {stack.agent_log()[-2000:]}")
        if ready is None:
            names = start.filter_status(stack)
            if names is not None and names["ready"]:
                ready = time.monotonic() - spawned
        if ready is not None and client.exists(SNAPSHOT):
            break
        time.sleep(0.05)
    saved = time.monotonic() - spawned
    stack.wait_agent(timeout=limit)
    source = stack.status()["name_filter"]["source"]
    stack.stop_agent()
    return {
        "filter_ready_s": None if ready is None else round(ready, 2),
        "snapshot_saved_s": round(saved, 2) if client.exists(SNAPSHOT) else None,
        "source": source,
    }


def one_size(
    n: int, source: Path, plan: Plan, work: Path, key_file: Path, cafile: Path, native: Path
) -> dict[str, Any]:
    phase: dict[str, float] = {}
    loads: dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        phase[name] = round(time.monotonic() - clock, 1)
        loads[name] = round(os.getloadavg()[0], 2)  # other work on the machine, at its end
        clock = time.monotonic()

    out: dict[str, Any] = {"n": n, "loadavg": [round(x, 2) for x in os.getloadavg()]}
    hosts = Hosts(n)
    ctx = client_context(cafile)
    server = RedisProcess(work / f"redis-{n}").start()
    stack: Stack | None = None
    try:
        assert server.proc is not None
        stack = Stack.create(
            work / f"stack-{n}", store=server.url, cafile=cafile, key_file=key_file,
            capacity=plan.capacity,
        )  # fmt: skip
        stack.start_haproxy()
        client = redis_py.Redis.from_url(server.url, socket_timeout=30)
        empty = store.used_memory(server)
        say(f"million: N={n:,}: importing")
        out["import"] = store.import_all(stack, server, source, n)
        say(f"million: N={n:,}: {out['import']['summary']}")
        full = store.used_memory(server)
        lap("import")
        out["redis"] = {
            "used_memory_empty": empty,
            "used_memory_mb": round(full / 1e6, 1),
            "used_memory_per_cert": round((full - empty) / n, 1),
            **store.bgsave(server),
        }
        out["redis"]["rdb_mb"] = round(out["redis"]["rdb_bytes"] / 1e6, 1)
        say(f"million: N={n:,}: {out['redis']}")
        lap("bgsave")
        out["first_start"] = first_start(stack, client)
        say(f"million: N={n:,}: first start {out['first_start']}")
        lap("first_start")
        pids = {"redis": server.proc.pid, "haproxy": stack.worker_pid()}
        runs = []
        for _ in range(plan.repeats):
            runs.append(start.one_start(stack, pids, hosts.take(1)[0], ctx, plan.window))
            say(f"million: N={n:,}: start {runs[-1]}")
        out["starts"] = starts_summary(runs)
        seen = next((r["filter"] for r in reversed(runs) if r["filter"]), None) or {}
        out["filter"] = {
            "bytes": seen.get("bytes"),
            "names": seen.get("names"),
            "capacity": seen.get("capacity"),
            "snapshot_bytes": int(client.strlen(SNAPSHOT)),
        }
        lap("starts")
        floods: dict[str, list[dict[str, Any]]] = {"at_start": [], "settled": []}
        real = plan.real_rate * plan.flood_seconds
        for way in ("at_start", "settled"):
            if way == "settled":
                stack.start_agent()
            for _ in range(plan.repeats):
                floods[way].append(start.flood(
                    stack, native, cafile, hosts.take(real), at_start=way == "at_start",
                    rate=plan.flood_rate, seconds=plan.flood_seconds,
                ))  # fmt: skip
                say(f"million: N={n:,}: flood {way}: {floods[way][-1]['lookups_per_second']}")
        out["floods"] = {way: floods_summary(runs) for way, runs in floods.items()}
        lap("floods")
        out["serve"] = {
            "cold_warm": serve.cold_warm(stack, native, cafile, hosts.take(plan.cold_hosts)),
            "storms": serve.storms(
                stack, native, cafile, [hosts.take(plan.storm_hosts) for _ in range(plan.storms)]
            ),
        }
        assert stack.agent is not None
        out["serve"]["agent_peak_rss_mb"] = round(hwm_kb(stack.agent.pid) / 1024, 1)
        say(f"million: N={n:,}: serve {out['serve']['cold_warm']}")
        stack.stop_agent()
        lap("serve")
        whole = plan.repeats if n <= 100_000 else plan.ls_whole
        out["cert_ls"] = serve.listing(stack, f".{generate.DOMAIN}".encode(), plan.repeats, whole)
        say(f"million: N={n:,}: cert ls {out['cert_ls']['runs']}")
        lap("cert_ls")
        out["hosts_used"] = hosts.next
        client.close()
    finally:
        if stack is not None:
            stack.close()
        server.stop()
        shutil.rmtree(work / f"redis-{n}", ignore_errors=True)
    out["phase_s"] = phase
    out["loadavg_after_phase"] = loads
    return out


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.smoke() if args.smoke else Plan()
    if args.sizes:
        plan = replace(plan, sizes=tuple(sorted(int(s) for s in args.sizes.split(","))))
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    plan = replace(plan, seed=args.seed)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-million-"))
    result: dict[str, Any] = {"meta": {**run_meta(), "argv": list(sys.argv[1:] if argv is None
                                                                   else argv)}}  # fmt: skip
    try:
        built = _native.try_build(work / "native")
        if built.binary is None:
            raise SystemExit(f"bench.million needs bench/tlsload.c built: {built.reason}")
        say(f"million: certificates for N = {max(plan.sizes):,} (cache {args.cache})")
        full = generate.generated(args.cache, max(plan.sizes), plan.seed, say)
        generation = {
            "from_cache": full.from_cache,
            "generate_s": None if full.generate_s is None else round(full.generate_s, 1),
            "directory": str(full.directory.parent),
            "made": full.made,
            "note": (
                f"certificates from the cache (made in {full.made.get('generate_s')} s)"
                if full.from_cache
                else f"certificates generated in {full.generate_s:.0f} s, included"
            ),
        }
        say(f"million: {generation['note']}")
        key_file = write_key_file(work / "data.key")
        result["sizes"] = {}
        for n in plan.sizes:
            say(f"million: N = {n:,} (load average {os.getloadavg()[0]:.2f})")
            source = generate.subset(full, n)
            result["sizes"][str(n)] = one_size(
                n, source, plan, work, key_file, full.root, built.binary
            )
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"million: stopped ({exc or 'Ctrl-C'})")
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["meta"].update(
        smoke=args.smoke,
        plan=asdict(plan),
        generation=generation,
        seconds=round(time.monotonic() - started, 1),
        seconds_without_generation=round(time.monotonic() - started - (full.generate_s or 0.0), 1),
        loadavg_end=[round(x, 2) for x in os.getloadavg()],
    )
    result["table"] = table(result)
    result["must_show"] = must_show(result)
    stem = f"{result['meta']['date'][:10]}-million{'-smoke' if args.smoke else ''}"
    path = publish(result, args.out, stem, markdown(result))
    say(f"million: wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
