"""``python -m bench.versions storm [--haproxy LABEL=PATH ...] [--smoke]``: run, print JSON,
write JSON + Markdown.

The warm host is probed ``--probe-rate`` times a second from ``--idle`` s before the storm
to its end (:mod:`bench.versions.warm`); ``--wait-idle LOAD`` waits for a quieter machine
before each cell.

Without ``--haproxy``: PATH's haproxy (Debian 12: 2.6) and the 3.0 and 3.2 builds that
``scripts/haproxy-versions.sh`` left in its cache.  Progress goes to stderr, the JSON
result to stdout; results land in ``bench/results/<date>-storm-versions[-N].json`` and
``.md`` (never overwritten).  Every process is started through
:mod:`certagent.testing` and stopped by its PID.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from bench import _native
from bench._certs import Leaves, write_preload_files
from bench._runinfo import RESULTS, publish, run_meta, say
from bench.scale.common import Env
from bench.versions import builds, lower, report, storm
from bench.versions.favour import Favour
from bench.versions.storm import StormSizes, cell, resident_hosts, wave_hosts
from bench.versions.warm import ProbeSettings
from certagent.testing import PKI, RedisFixture, RedisProcess, write_key_file


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.versions",
        description="One scenario on several HAProxy builds in one run.",
        allow_abbrev=False,
    )
    p.add_argument("scenario", choices=["storm"], help="storm: new hosts at capacity < storm")
    p.add_argument(
        "--haproxy",
        action="append",
        default=[],
        metavar="[LABEL=]PATH",
        help="a build to compare (repeat; the first is the baseline of the ratios); "
        "default: PATH's haproxy and the cached 3.0 and 3.2 (scripts/haproxy-versions.sh)",
    )
    defaults = StormSizes()
    p.add_argument("--capacity", type=int, default=defaults.capacity)
    p.add_argument("--hosts", type=int, default=defaults.hosts, help="new hosts per storm")
    p.add_argument("--spread", type=float, default=defaults.spread, help="seconds of arrivals")
    p.add_argument("--repeats", type=int, default=defaults.repeats)
    p.add_argument(
        "--probe-rate",
        type=float,
        default=defaults.probe.rate,
        help="warm-host handshakes started per second, at idle and through the storm",
    )
    p.add_argument(
        "--probe-connections",
        type=int,
        default=defaults.probe.connections,
        help="most warm-host handshakes in flight at once",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=defaults.probe.idle_s,
        help="seconds of warm-host probes before the storm (the idle figures use the last "
        "stretch as long as the storm)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=None,
        metavar="LOAD",
        help="before each cell, wait (up to --wait-max s) until the 1-minute load average is "
        "at most LOAD; the waits are reported",
    )
    p.add_argument("--wait-max", type=float, default=300.0, help="longest wait of --wait-idle")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (seconds per build)")
    p.add_argument(
        "--perf", action="store_true", help="perf record HAProxy's worker in every storm"
    )
    p.add_argument(
        "--realtime",
        action="store_true",
        help="run the stacks and clients at SCHED_RR (root), the warm-host prober one priority "
        "above: on a machine shared with other work, that load then cannot take the bench's CPU",
    )
    p.add_argument(
        "--favour",
        action="store_true",
        help="(root) the autogroup of the bench and of every process it starts at nice -20: "
        "other sessions' work gets the CPU only when the bench leaves it, and the bench's "
        "processes keep the normal scheduler among themselves (bench/versions/favour.py)",
    )
    p.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="CERTAGENT_KEY=VALUE",
        help="a setting for every agent (repeat), e.g. CERTAGENT_LOAD_BATCH=1",
    )
    p.add_argument(
        "--global",
        dest="global_lines",
        action="append",
        default=[],
        metavar="LABEL=LINE",
        help="a line for the global section of one build's generated haproxy.cfg (repeat; "
        "the same binary may run under two labels: --haproxy 3.2=PATH --haproxy 3.2x=PATH "
        "--global '3.2x=tune.runqueue-depth 50')",
    )
    p.add_argument(
        "--build-env",
        action="append",
        default=[],
        metavar="LABEL=CERTAGENT_KEY=VALUE",
        help="an agent setting for one build only (repeat)",
    )
    p.add_argument(
        "--build-nice",
        action="append",
        default=[],
        metavar="LABEL=N|LABEL=rt",
        help="run this build's agent at a lower CPU priority than its HAProxy (repeat): N, "
        "the normal scheduler at nice N (the agent's autogroup N above the bench's: under "
        "--favour N-20; under --realtime the agent leaves SCHED_RR); rt, under --realtime, "
        "SCHED_RR one priority below HAProxy "
        "(the same binary may run under two labels: --haproxy 3.2=PATH --haproxy "
        "3.2nice=PATH --build-nice 3.2nice=10; bench/versions/lower.py)",
    )
    p.add_argument(
        "--build-agent",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="run this build's agent from DIR, another checkout's agent/ folder, put first "
        "on the agent's PYTHONPATH (repeat): two revisions of the agent in one interleaved "
        "run (--haproxy 3.2=PATH --haproxy 3.2old=PATH --build-agent 3.2old=/tmp/old/agent, "
        "the folder from `git archive REV agent | tar -x -C /tmp/old`); the configuration "
        "is generated by this checkout's certagent init for every build",
    )
    p.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="LABEL",
        help="serve this build's storms without certagent (repeat): the generated configuration "
        "less the agent, the Lua action and the hop, fe_tls on the public port with every "
        "certificate preloaded in a plain crt-list: the floor of the same HAProxy doing only "
        "the handshakes (the same binary may run under two labels: --haproxy 3.2=PATH "
        "--haproxy 3.2pre=PATH --preload 3.2pre)",
    )
    p.add_argument("--python-client", action="store_true", help="not bench/tlsload.c")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = p.parse_args(argv)
    if any(not v.startswith("CERTAGENT_") or "=" not in v for v in args.agent_env):
        p.error("--agent-env takes CERTAGENT_KEY=VALUE")
    if args.capacity >= args.hosts:
        p.error("--capacity must be below --hosts (every new host then recycles a slot)")
    if not (0 < args.probe_rate <= 10_000 and 1 <= args.probe_connections <= 256):
        p.error("--probe-rate takes 0-10000 per second, --probe-connections 1-256")
    if not 0.1 <= args.idle <= 60:
        p.error("--idle takes 0.1-60 s")
    return args


def variant(build: builds.Build, args: argparse.Namespace) -> builds.Build:
    """``build`` with its --global lines and --build-env settings."""
    lines, env = [], []
    for value in args.global_lines:
        label, _, line = value.partition("=")
        if label == build.label:
            lines.append(line)
    for value in args.build_env:
        label, _, setting = value.partition("=")
        key, sep, val = setting.partition("=")
        if not (key.startswith("CERTAGENT_") and sep):
            raise SystemExit("bench.versions: --build-env takes LABEL=CERTAGENT_KEY=VALUE")
        if label == build.label:
            env.append((key, val))
    nice = [s for label, s in map(lower.parse, args.build_nice) if label == build.label]
    sources = [v.partition("=")[2] for v in args.build_agent if v.partition("=")[0] == build.label]
    return dataclasses.replace(
        build,
        global_lines=tuple(lines),
        agent_env=tuple(env),
        preload=build.label in args.preload,
        agent_nice=nice[-1] if nice else None,
        agent_source=str(Path(sources[-1]).resolve()) if sources else None,
    )


class _Stop(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = (
        StormSizes.smoke()
        if args.smoke
        else StormSizes(
            args.capacity,
            args.hosts,
            args.spread,
            args.repeats,
            ProbeSettings(args.probe_rate, args.probe_connections, args.idle),
        )
    )
    chosen = (
        [builds.probe(*builds.parse_option(v)) for v in args.haproxy]
        if args.haproxy
        else builds.default_builds()
    )
    labels = [b.label for b in chosen]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"bench.versions: two builds share a label: {labels}")
    if unknown := sorted(set(args.preload) - set(labels)):
        raise SystemExit(f"bench.versions: --preload names no build: {unknown} (builds: {labels})")
    if unknown := sorted({lower.parse(v)[0] for v in args.build_nice} - set(labels)):
        raise SystemExit(f"bench.versions: --build-nice names no build: {unknown}")
    for value in args.build_agent:
        label, sep, folder = value.partition("=")
        if not sep or label not in labels:
            raise SystemExit(f"bench.versions: --build-agent takes LABEL=DIR of a build: {value}")
        if not (Path(folder) / "certagent" / "__init__.py").is_file():
            raise SystemExit(f"bench.versions: --build-agent {folder} has no certagent package")
    if not args.realtime and any(lower.parse(v)[1] == lower.RT for v in args.build_nice):
        raise SystemExit("bench.versions: --build-nice LABEL=rt needs --realtime")
    chosen = [variant(b, args) for b in chosen]
    work = Path(tempfile.mkdtemp(prefix="bench-versions-"))

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    agent_env = dict(v.split("=", 1) for v in args.agent_env)
    if args.realtime and args.favour:
        raise SystemExit("bench.versions: --realtime or --favour, not both")
    if args.realtime:
        storm.go_realtime()
    favour = Favour().start() if args.favour else None
    started = time.perf_counter()
    redis = RedisProcess(work / "redis").start()
    env: Env | None = None
    rows: list[dict[str, Any]] = []
    try:
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        pki = PKI.create(work / "ca.pem")
        env = Env(work, redis, store, pki, say)
        leaves = Leaves(pki)
        names = resident_hosts(sizes) + [
            h
            for r in range(sizes.repeats)
            for i in range(len(chosen))
            for h in wave_hosts(sizes, r, i)
        ]
        say(f"bench.versions: storing {len(names):,} certificates ...")
        store.put((leaves.bundle(n) for n in names), concurrency=64)
        preloaded = [
            h
            for r in range(sizes.repeats)
            for i, b in enumerate(chosen)
            if b.preload
            for h in wave_hosts(sizes, r, i)
        ]
        if preloaded:
            say(f"bench.versions: writing {len(preloaded):,} certificate files for --preload ...")
            pem_dir = work / storm.PEM_DIR
            list(write_preload_files(leaves, resident_hosts(sizes) + preloaded, pem_dir, False))
        native = None
        if not args.python_client:
            built = _native.try_build(work / "native")
            native = built.binary
            if native is None:
                say(f"bench.versions: the storm uses the Python client: {built.reason}")
        for r in range(sizes.repeats):
            for k in range(len(chosen)):
                i = (r + k) % len(chosen)  # rotate the order: no build always goes first
                waited = (
                    storm.wait_for_load(args.wait_idle, args.wait_max)
                    if args.wait_idle is not None
                    else None
                )
                row = cell(env, chosen[i], sizes, r, i, native, args.perf, args.realtime, agent_env)
                if waited is not None:
                    row["waited_for_load_s"] = waited
                rows.append(row)
                say(f"bench.versions: { {k: v for k, v in row.items() if k != 'warm_samples_ms'} }")
    except (_Stop, KeyboardInterrupt) as exc:
        say(f"bench.versions: stopped ({exc or 'Ctrl-C'})")
        return 130
    finally:
        if env is not None:
            env.close_all()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
        if favour is not None:
            favour.stop()
    summary = report.summarise(rows, labels)
    result: dict[str, Any] = {
        "meta": {
            **run_meta(),
            "command": "python -m bench.versions " + shlex.join(argv or sys.argv[1:]),
            "scenario": args.scenario,
            "smoke": args.smoke,
            "perf": args.perf,
            "realtime": args.realtime,
            "favour": args.favour,
            "agent_env": agent_env,
            "wait_idle": args.wait_idle,
            "sizes": {**sizes.__dict__, "probe": sizes.probe.__dict__},
            "client": _native.LABEL if native is not None else "Python asyncio",
            "builds": [b.__dict__ for b in chosen],
            "same_config": len({r["config_digest"] for r in rows}) == 1,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "targets": report.targets(summary, labels[0]),
        "floors": report.floors(rows, [b.__dict__ for b in chosen]),
        "summary": summary,
        "runs": rows,
    }
    stem = dt.date.today().isoformat() + (
        "-storm-versions-smoke" if args.smoke else "-storm-versions"
    )
    path = publish(result, args.out, stem, report.markdown(result))
    say(f"bench.versions: wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
