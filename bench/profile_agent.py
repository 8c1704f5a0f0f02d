"""Where the agent's CPU goes per recycle: ``python -m bench.profile_agent [--quick]``.

Fills K slots, then sends cold hosts one after the other through real TLS
handshakes, each recycling one slot (the capacity scenario of ``bench.scale``).
Per repeat: the agent's and HAProxy's on-CPU time per recycle, read from
/proc/<pid>/task/*/schedstat, with nothing attached.  Then one more pass under
py-spy (``py-spy record --native``, not a project dependency: ``pip install
py-spy`` or give ``--py-spy``), whose samples are sorted into phases of one
load and scaled to the median measured CPU.

py-spy counts a thread preempted inside a system call as busy, and samples at
a fixed rate, so the shares are estimates (the JSON keeps the raw counts); the
CPU per recycle is not.  Results: ``bench/results/<date>-agent-profile.json``
and ``.md``, never overwriting.  Every process is started through
:mod:`certagent.testing` and stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._certs import Leaves
from bench._runinfo import RESULTS, fresh_path, git_revision, machine
from bench.scale.common import Cpu, ensure_many, shared_key_bundles, spread, try_handshake
from certagent.testing import PKI, RedisFixture, RedisProcess, write_key_file
from certagent.testing.stack import Stack
from certagent.testing.tlsclient import client_context

#: Phases of one load, matched on a sample's frames from the leaf up (first match wins).
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging", ("logging/__init__.py",)),
    ("OCSP scheduling", ("service/ocspfetch.py",)),
    ("record parsing and key check (PEM, x509, key match)", ("certs/pem.py", "store/records.py")),
    ("store lookup: redis-py and the Lua script", ("redis/", "store/redis/", "hiredis")),
    ("victim choice (sampling, usage parsing)", ("runtime/usage.py",)),
    (
        "runtime API: encode, write, read, split replies",
        ("runtime/client.py", "runtime/protocol/"),
    ),
    (
        "load plan and pool bookkeeping",
        ("runtime/batch.py", "runtime/pool.py", "runtime/loader.py", "runtime/requests.py"),
    ),
    ("ensure path (validation, filters, single flight)", ("service/ensure.py", "certs/hostname")),
    ("control socket: the Lua action's request", ("service/control.py",)),
    ("metrics", ("service/metrics.py", "prometheus_client")),
)
LOOP = "event loop and syscalls outside the phases above (uvloop, asyncio)"
#: Leaf frames of a thread waiting for work: sampled, but not CPU.
IDLE = ("epoll_pwait", "epoll_wait")
WAITING = "waiting in epoll (idle; left out of the shares)"


def phase_of(frames: Sequence[str]) -> str:
    for frame in reversed(frames):
        for phase, needles in PHASES:
            if any(n in frame for n in needles):
                return phase
    return LOOP


def phases(raw: str) -> dict[str, int]:
    """Samples per phase from py-spy's raw (collapsed) output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not (stack and n.isdigit()):
            continue
        frames = stack.split(";")
        if frames[-1].startswith(IDLE):
            counts[WAITING] += int(n)  # py-spy does not know a native wait is idle
        else:
            counts[phase_of(frames)] += int(n)
    return dict(counts.most_common())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.profile_agent",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    p.add_argument("--quick", action="store_true", help="K = 200, 100 recycles (~30 s)")
    p.add_argument("--k", type=int, default=1000, help="slot capacity (default 1000)")
    p.add_argument("--recycles", type=int, default=600, help="cold hosts per repeat")
    p.add_argument("--repeats", type=int, default=3, help="measured repeats (median reported)")
    p.add_argument(
        "--py-spy", default=shutil.which("py-spy"), help="py-spy binary (default: PATH; \"\": none)"
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    args = p.parse_args(argv)
    if args.quick:
        args.k, args.recycles = 200, 100
    return args


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    redis = RedisProcess(work / "redis").start()
    try:
        store = RedisFixture(redis.url, write_key_file(work / "data.key"))
        pki = PKI.create(work / "ca.pem")
        fill = [f"k{i}.profile.test" for i in range(args.k)]
        passes = args.repeats + (1 if args.py_spy else 0)
        cold = [f"c{i}.profile.test" for i in range(args.recycles * passes)]
        store.put(shared_key_bundles(Leaves(pki), [*fill, *cold]), concurrency=32)
        stack = Stack.create(
            work / "stack", store=redis.url, cafile=pki.cafile, key_file=store.key_file,
            capacity=args.k,
        )  # fmt: skip
        try:
            stack.start_haproxy()
            stack.start_agent()
            return measure(args, stack, pki, fill, cold, redis)
        finally:
            stack.close()
    finally:
        redis.stop()


def measure(
    args: argparse.Namespace,
    stack: Stack,
    pki: PKI,
    fill: list[str],
    cold: list[str],
    redis: RedisProcess,
) -> dict[str, Any]:
    answers = asyncio.run(ensure_many(stack.settings.agent_socket, fill))
    if answers.get("ok") != len(fill):
        raise RuntimeError(f"filling {len(fill)} slots answered {answers}")
    assert stack.agent is not None and redis.proc is not None
    pids = {"agent": stack.agent.pid, "haproxy": stack.worker_pid(), "redis": redis.proc.pid}
    ctx = client_context(pki.cafile)
    per: dict[str, list[float]] = {name: [] for name in pids}
    failed = 0
    batches = [cold[i : i + args.recycles] for i in range(0, len(cold), args.recycles)]
    for batch in batches[: args.repeats]:
        cpu = Cpu(pids).start()
        failed += sum(not isinstance(try_handshake(stack.port, h, ctx), float) for h in batch)
        cpu.stop()
        for name in pids:
            per[name].append(cpu.ms[name] / len(batch))
    result: dict[str, Any] = {
        "ms_per_recycle": {name: spread(values) for name, values in per.items()},
        "failed_handshakes": failed,
        "recycles": stack.status()["loader"]["recycles"],
    }
    if args.py_spy:
        result["profile"] = profile(args, stack, batches[-1], ctx, statistics.median(per["agent"]))
    return result


def profile(
    args: argparse.Namespace, stack: Stack, batch: list[str], ctx: Any, agent_ms: float
) -> dict[str, Any]:
    assert stack.agent is not None
    raw_path = Path(tempfile.mkdtemp(prefix="pyspy-")) / "agent.txt"
    spy = subprocess.Popen(
        [args.py_spy, "record", "--native", "-r", "1000", "-f", "raw", "-o", str(raw_path),
         "--pid", str(stack.agent.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)  # attached
        for h in batch:
            try_handshake(stack.port, h, ctx)
    finally:
        spy.send_signal(2)
        spy.wait(timeout=30)
    counts = phases(raw_path.read_text())
    busy = {p: n for p, n in counts.items() if p != WAITING}
    total = sum(busy.values()) or 1
    return {
        "samples": counts,
        "ms_per_recycle": {p: round(agent_ms * n / total, 3) for p, n in busy.items()},
        "note": "shares of py-spy samples (preempted syscalls count as busy) x median agent CPU",
    }


def markdown(result: dict[str, Any]) -> str:
    meta, body = result["meta"], result["result"]
    lines = [
        f"# Agent CPU per recycle, {meta['date']}",
        "",
        f"Revision {meta['revision']}; K = {meta['k']:,}, {meta['recycles']} sequential cold"
        f" hosts per repeat, {meta['repeats']} repeats; {meta['machine']['nproc']} CPUs.",
        "",
        "| process | ms of CPU per recycle: median (min-max) |",
        "|---|---|",
    ]
    for name, s in body["ms_per_recycle"].items():
        lines.append(f"| {name} | {s['median']} ({s['min']}-{s['max']}) |")
    if "profile" in body:
        lines += ["", "## Where the agent's time goes (py-spy, one extra pass)", ""]
        lines += ["| phase | ms per recycle | samples |", "|---|---:|---:|"]
        for phase, ms in body["profile"]["ms_per_recycle"].items():
            lines.append(f"| {phase} | {ms} | {body['profile']['samples'][phase]} |")
        lines += ["", body["profile"]["note"]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-profile-agent-"))
    started = time.perf_counter()
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "revision": git_revision(),
        "machine": machine(),
        "k": args.k,
        "recycles": args.recycles,
        "repeats": args.repeats,
        "py_spy": bool(args.py_spy),
    }
    try:
        body = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    result = {"meta": meta, "result": body}
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        path = fresh_path(args.out, f"{dt.date.today().isoformat()}-agent-profile", ".json")
        path.write_text(text + "\n")
        path.with_suffix(".md").write_text(markdown(result))
        print(f"bench.profile_agent: wrote {path} and {path.with_suffix('.md').name}",
              file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
