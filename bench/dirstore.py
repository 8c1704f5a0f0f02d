"""``python -m bench.dirstore``: the directory store with many certbot lineages.

Bounded: makes ``--lineages`` fake lineages (certbot layout, one shared test
key, ≈9 s for 20,000) under ``--work``, then measures

1. in this process: the first index of the lineages (time, the longest
   event-loop stall seen by a 1 ms timer, full garbage collections meanwhile)
   and its memory (tracemalloc, a second build);
2. a real agent + HAProxy on loopback: a handshake for a ``www.`` SAN of a
   lineage, then the on-CPU time at rest (all threads, ``/proc/<pid>/task/*/
   schedstat``) of the agent and of the HAProxy worker over ``--seconds``;
3. the same agent with ``dir_watch = "poll"`` (the fallback) over ``--poll-seconds``.

Prints one JSON object on stdout; progress on stderr.  Every process is
stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench._proc import schedstat_ns
from certagent.errors import StoreUnavailable
from certagent.store import DirectoryStore
from certagent.testing import PKI, Stack, StackError, wait_for
from certagent.testing.certbot import make_lineages


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except OSError:
        return "?"
    return out.stdout.strip() or "?"



def switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` (its wake-ups)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


async def build(store: DirectoryStore) -> None:
    """The first change-feed call: waits for the index (retried past the store's own 10 s wait)."""
    deadline = time.monotonic() + 300
    while True:
        try:
            await store.changes(None, 0)
            return
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise


def make_tree(work: Path, count: int, reuse: bool = False) -> tuple[Path, Path]:
    """``count`` lineages in ``work/letsencrypt``; returns it and the CA file clients trust."""
    root, cafile = work / "letsencrypt", work / "root.pem"
    live = root / "live"
    if reuse and cafile.exists() and live.is_dir() and len(list(live.iterdir())) == count:
        say(f"reusing the {count} lineages in {root}")
        return root, cafile
    pki = PKI.create(cafile, "certagent dirstore bench CA")
    if root.exists():
        shutil.rmtree(root)
    started = time.monotonic()
    for i, _ in enumerate(make_lineages(pki.ca, root, count), start=1):
        if i % 5000 == 0:
            say(f"  {i} lineages")
    say(f"made {count} lineages in {time.monotonic() - started:.1f}s")
    return root, cafile


def probe_host(count: int) -> str:
    """The ``www.`` name of one lineage: found only through the SAN index."""
    return f"www.s{min(123, count - 1):06d}.le.test"


async def index_in_process(root: Path, probe: str) -> dict[str, Any]:
    """Build the index once with a 1 ms timer running: time, longest stall, full GCs."""
    gcs: list[float] = []
    began: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        elif info["generation"] == 2:
            gcs.append((time.perf_counter() - began[0]) * 1000)

    store = DirectoryStore(root)
    lates: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lates.append((time.perf_counter() - before - 0.001) * 1000)

    gc.callbacks.append(on_gc)
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    lates.clear()
    started = time.perf_counter()
    try:
        await build(store)
        took = time.perf_counter() - started
    finally:
        done.set()
        await task
        gc.callbacks.remove(on_gc)
    lates.sort()
    lookup_started = time.perf_counter()
    found = await store.lookup(probe)
    lookup_ms = (time.perf_counter() - lookup_started) * 1000
    await store.close()
    return {
        "index_seconds": round(took, 2),
        "longest_stall_ms": round(lates[-1], 1),
        "p99_stall_ms": round(lates[int(len(lates) * 0.99)], 1),
        "full_gc_ms": [round(g, 1) for g in gcs],
        "san_lookup_ms": round(lookup_ms, 2),
        "san_lookup_id": found.id if found else None,
    }


async def index_memory(root: Path) -> dict[str, Any]:
    store = DirectoryStore(root)
    tracemalloc.start()
    try:
        await build(store)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    watcher = store._watcher
    lineages = len(watcher.state.lineages) if watcher else 0
    names = watcher.state.names_indexed() if watcher else 0
    await store.close()
    return {
        "index_mb": round(current / 1e6, 1),
        "index_peak_mb": round(peak / 1e6, 1),
        "bytes_per_lineage": round(current / max(lineages, 1)),
        "lineages": lineages,
        "names": names,
    }


def at_rest(stack: Stack, seconds: float) -> dict[str, Any]:
    assert stack.agent is not None
    agent, worker = stack.agent.pid, stack.worker_pid()
    time.sleep(3)  # settle
    a0, h0, s0, t0 = schedstat_ns(agent), schedstat_ns(worker), switches(agent), time.monotonic()
    time.sleep(seconds)
    a1, h1, s1, t1 = schedstat_ns(agent), schedstat_ns(worker), switches(agent), time.monotonic()
    span = t1 - t0
    return {
        "seconds": round(span, 1),
        "agent_ms_per_s": round((a1 - a0) / 1e6 / span, 4),
        "haproxy_worker_ms_per_s": round((h1 - h0) / 1e6 / span, 4),
        "total_ms_per_s": round((a1 - a0 + h1 - h0) / 1e6 / span, 4),
        "agent_wakeups_per_s": round((s1 - s0) / span, 2),
    }


def run_stack(work: Path, root: Path, cafile: Path, name: str, env: dict[str, str]) -> Stack:
    shutil.rmtree(work / name, ignore_errors=True)
    stack = Stack.create(
        work / name, store=root.as_uri(), cafile=cafile, capacity=1000,
        env={"CERTAGENT_LOG_LEVEL": "info", **env},
    )  # fmt: skip
    stack.start_haproxy()
    stack.start_agent()
    wait_for(lambda: "indexed" in stack.agent_log(), 120, "the agent's index of lineages")
    return stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dirstore", description=__doc__)
    parser.add_argument("--lineages", type=int, default=20_000, help="lineages to make")
    parser.add_argument("--seconds", type=float, default=30.0, help="at-rest window (inotify)")
    parser.add_argument("--poll-seconds", type=float, default=20.0, help="at-rest window, poll")
    parser.add_argument("--work", type=Path, default=None, help="work directory (default: tmp)")
    parser.add_argument(
        "--reuse", action="store_true", help="reuse the lineages already in --work, if as many"
    )
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="dirbench-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "lineages": args.lineages,
        "commit": git_commit(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }
    stacks: list[Stack] = []
    try:
        root, cafile = make_tree(work, args.lineages, args.reuse)
        probe = probe_host(args.lineages)
        result["in_process"] = asyncio.run(index_in_process(root, probe))
        say(f"in process: {result['in_process']}")
        result["memory"] = asyncio.run(index_memory(root))
        say(f"memory: {result['memory']}")
        stack = run_stack(work, root, cafile, "inotify", {})
        stacks.append(stack)
        info = stack.handshake(probe)
        result["handshake_san"] = list(info.san)
        result["agent_index_log"] = next(
            line for line in stack.agent_log().splitlines() if "indexed" in line
        ).split(": ", 2)[-1]
        say(f"agent: {result['agent_index_log']}")
        result["at_rest_inotify"] = at_rest(stack, args.seconds)
        say(f"at rest, inotify: {result['at_rest_inotify']}")
        stack.close()
        stack = run_stack(work, root, cafile, "poll", {"CERTAGENT_DIR_WATCH": "poll"})
        stacks.append(stack)
        result["at_rest_poll"] = at_rest(stack, args.poll_seconds)
        result["at_rest_poll"]["dir_poll_interval"] = stack.settings.dir_poll_interval
        say(f"at rest, polling: {result['at_rest_poll']}")
    except StackError as exc:
        say(f"failed: {exc}")
        return 1
    finally:
        for stack in stacks:
            stack.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
