"""``python -m bench.filter_start``: the agent's start with N stored names, snapshot vs rebuild.

Bounded: fills one Redis (its own, on a free loopback port) with ``--sizes``
certificates (one shared test key; names ``h000000.bench.test`` ...), and for
each size and each way of starting, ``--repeats`` times:

* ``snapshot``: the name filter's snapshot is in Redis (written by the
  previous agent), so the agent loads it and replays the change feed;
* ``rebuild``: the snapshot key is deleted first, so the agent reads every name.

Per start it records the agent's on-CPU time in its first 10 s after being
spawned (all threads, schedstat: Python's start included), Redis's on-CPU time
over the same 10 s, and the time from spawn to ``name_filter.ready`` (status
polled every 50 ms).  Then, per size and way, a flood at start: made-up names
sent to the agent's socket at ``--flood-rate`` a second from the moment it
accepts, with the agent's ``ensure.store_lookups`` counter read every second
(store lookups per second during the first seconds).

In this process it also measures the filter itself at 1,000,000 names (the
size the agent gives it for a store of 1,000,000: capacity 2,000,000): its
bytes, the snapshot's size, the false-positive rate, and the time to encode
and decode the snapshot; then, against the same Redis, ``--repeats`` agent
starts from that 1,000,000-name snapshot (set at the stream's end), as the
other starts are measured: what loading a snapshot costs at 10^6.

Prints one JSON object on stdout; progress on stderr.  Every process is stopped
by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench._certs import Leaves, host
from bench._proc import schedstat_ns
from bench._runinfo import machine, say
from certagent.service import bloom
from certagent.testing import PKI, RedisFixture, RedisProcess, Stack, write_key_file

KEY = "certagent:namefilter"
_MILLION: list[bytes] = []  # the snapshot of filter_at_a_million, for million_snapshot_starts
WINDOW = 10.0


def spread(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "values": [round(v, digits) for v in values],
    }


def fill(store: RedisFixture, leaves: Leaves, start: int, stop: int) -> None:
    """Certificates for ``host(start) .. host(stop - 1)``, 500 per round trip (bulk adds)."""
    began = time.monotonic()

    async def main() -> None:
        opened = store.open()
        bulk = opened.bulk()
        try:
            for first in range(start, stop, 500):
                last = min(stop, first + 500)
                await bulk.add_many([leaves.bundle(host(i)) for i in range(first, last)])
        finally:
            await opened.close()

    asyncio.run(main())
    say(f"  stored h{start:06d}..h{stop - 1:06d} in {time.monotonic() - began:.0f} s")


def ready_source(stack: Stack) -> str | None:
    try:
        names = stack.status()["name_filter"]
    except (OSError, ValueError):
        return None
    return str(names["source"]) if names["ready"] else None


def one_start(stack: Stack, redis_pid: int) -> dict[str, Any]:
    """Spawn the agent; CPU of it and Redis over its first WINDOW s, time to a ready filter."""
    redis_before = schedstat_ns(redis_pid)
    spawned = time.monotonic()
    proc = stack.start_agent(wait=False)
    ready_after: float | None = None
    answering: float | None = None
    source: str | None = None
    while time.monotonic() - spawned < WINDOW:
        if ready_after is None:
            try:
                names = stack.status()["name_filter"]
            except (OSError, ValueError):
                names = None
            if names is not None and answering is None:
                answering = time.monotonic() - spawned
            if names is not None and names["ready"]:
                ready_after = time.monotonic() - spawned
                source = str(names["source"])
        time.sleep(0.05)
    agent_ms = schedstat_ns(proc.pid) / 1e6
    redis_ms = (schedstat_ns(redis_pid) - redis_before) / 1e6
    stack.stop_agent()
    return {
        "agent_cpu_ms": agent_ms,
        "redis_cpu_ms": redis_ms,
        "answering_s": answering,
        "ready_s": ready_after,
        "source": source,
    }


async def flood_names(socket: str, rate: float, seconds: float) -> int:
    """Made-up names at ``rate``/s for ``seconds`` (from the first accepted connection)."""
    rng = random.Random(7)
    gate = asyncio.Semaphore(64)
    sent = 0

    async def one(name: str) -> None:
        async with gate:
            try:
                reader, writer = await asyncio.open_unix_connection(socket)
                writer.write(f"ensure {name}\n".encode())
                await reader.readline()
                writer.close()
            except OSError:
                pass

    while True:  # until the agent accepts
        try:
            _, writer = await asyncio.open_unix_connection(socket)
            writer.close()
            break
        except OSError:
            await asyncio.sleep(0.01)
    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    while (elapsed := time.monotonic() - started) < seconds:
        while sent < int(elapsed * rate):
            name = f"r{rng.getrandbits(48):x}.flood.test"
            tasks.append(asyncio.create_task(one(name)))
            sent += 1
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    return sent


def store_lookups(stack: Stack) -> int | None:
    try:
        return int(stack.status()["ensure"]["store_lookups"])
    except (OSError, ValueError, KeyError):
        return None


def flood_start(stack: Stack, rate: float, seconds: int) -> dict[str, Any]:
    """Store lookups per second while made-up names arrive from the agent's first second."""
    stack.start_agent(wait=False)
    counts: list[int] = []

    async def main() -> int:
        flood = asyncio.create_task(
            flood_names(str(stack.settings.agent_socket), rate, seconds)
        )
        while (first := await asyncio.to_thread(store_lookups, stack)) is None:
            await asyncio.sleep(0.01)
        counts.append(first)
        for _ in range(seconds):
            await asyncio.sleep(1.0)
            counts.append(await asyncio.to_thread(store_lookups, stack) or counts[-1])
        return await flood

    sent = asyncio.run(main())
    ready = ready_source(stack)
    stack.stop_agent()
    per_second = [b - a for a, b in itertools.pairwise(counts)]
    return {"sent": sent, "lookups_per_second": per_second, "source": ready}


def million_snapshot_starts(
    stack: Stack, client: redis.Redis, redis_pid: int, data: bytes, repeats: int
) -> dict[str, Any]:
    """Starts from a snapshot of 1,000,000 names (put at the stream's end): its load's cost."""
    info = client.xinfo_stream("certagent:events")
    last = info["last-generated-id"]
    position = last.decode() if isinstance(last, bytes) else str(last)
    million = bloom.decode(data).bloom
    starts = []
    for _ in range(repeats):
        client.set(KEY, bloom.encode(million, position, int(time.time())))
        starts.append(one_start(stack, redis_pid))
        say(f"  1,000,000-name snapshot: {starts[-1]}")
    return {
        "agent_cpu_first_10s_ms": spread([s["agent_cpu_ms"] for s in starts], 1),
        "redis_cpu_first_10s_ms": spread([s["redis_cpu_ms"] for s in starts], 1),
        "agent_answering_s": spread([s["answering_s"] or WINDOW for s in starts]),
        "filter_ready_s": spread([s["ready_s"] or WINDOW for s in starts], 3),
        "sources": [s["source"] for s in starts],
    }


def filter_at_a_million() -> dict[str, Any]:
    """The filter the agent gives a store of 1,000,000 names, measured in this process."""
    tracemalloc.start()
    began = time.perf_counter()
    million = bloom.BloomFilter(2 * 1_000_000)
    for i in range(1_000_000):
        million.add(host(i))
    build_s = time.perf_counter() - began
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    began = time.perf_counter()
    data = bloom.encode(million, "1700000000000-0", int(time.time()))
    encode_s = time.perf_counter() - began
    began = time.perf_counter()
    copy = bloom.decode(data).bloom
    decode_s = time.perf_counter() - began
    strangers = 200_000
    false = sum(f"x{i}.other.test" in copy for i in range(strangers))
    _MILLION.append(data)
    return {
        "names": 1_000_000,
        "capacity": million.capacity,
        "probes": million.probes,
        "filter_bytes": million.memory,
        "traced_peak_bytes": peak,
        "snapshot_bytes": len(data),
        "false_positive_rate": round(false / strangers, 5),
        "build_s": round(build_s, 2),
        "encode_s": round(encode_s, 4),
        "decode_s": round(decode_s, 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.filter_start", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flood-rate", type=float, default=1000.0)
    parser.add_argument("--flood-seconds", type=int, default=6)
    parser.add_argument("--skip-million", action="store_true")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"bench": "filter_start", "machine": machine(), "sizes": {}}
    if not args.skip_million:
        say("the filter at 1,000,000 names, in process")
        result["filter_at_1m"] = filter_at_a_million()
    with tempfile.TemporaryDirectory(prefix="ca-filterbench-") as tmp:
        work = Path(tmp)
        server = RedisProcess(work / "redis").start()
        stack: Stack | None = None
        try:
            store = RedisFixture(server.url, write_key_file(work / "keys" / "certagent.keys"))
            pki = PKI.create(work / "root.pem", "certagent filter bench CA")
            leaves = Leaves(pki)
            client = redis.Redis.from_url(server.url, socket_timeout=10)
            redis_pid = int(client.info("server")["process_id"])
            stack = Stack.create(
                work / "stack", store=server.url, cafile=pki.cafile,
                key_file=store.key_file, capacity=100,
            )  # fmt: skip
            stack.start_haproxy()
            filled = 0
            for size in sorted(args.sizes):
                fill(store, leaves, filled, size)
                filled = size
                runs: dict[str, Any] = {}
                for way in ("rebuild", "snapshot"):
                    starts, floods = [], []
                    for _ in range(args.repeats):
                        if way == "rebuild":
                            client.delete(KEY)
                        else:  # the previous agent wrote one after its build
                            assert client.exists(KEY), "no snapshot after a rebuild"
                        starts.append(one_start(stack, redis_pid))
                        say(f"  N={size} {way}: {starts[-1]}")
                    for _ in range(args.repeats):
                        if way == "rebuild":
                            client.delete(KEY)
                        floods.append(flood_start(stack, args.flood_rate, args.flood_seconds))
                        say(f"  N={size} {way} flood: {floods[-1]}")
                        if way == "rebuild" and not client.exists(KEY):
                            one_start(stack, redis_pid)  # leave a snapshot for the next way
                    runs[way] = {
                        "agent_cpu_first_10s_ms": spread([s["agent_cpu_ms"] for s in starts], 1),
                        "redis_cpu_first_10s_ms": spread([s["redis_cpu_ms"] for s in starts], 1),
                        "agent_answering_s": spread([s["answering_s"] or WINDOW for s in starts]),
                        "filter_ready_s": spread([s["ready_s"] or WINDOW for s in starts], 3),
                        "sources": [s["source"] for s in starts],
                        "flood": floods,
                        "flood_lookups_per_second_max": spread(
                            [max(f["lookups_per_second"] or [0]) for f in floods], 0
                        ),
                    }
                snapshot_bytes = client.strlen(KEY)
                runs["snapshot_bytes"] = snapshot_bytes
                runs["ratio_rebuild_over_snapshot_cpu"] = round(
                    runs["rebuild"]["agent_cpu_first_10s_ms"]["median"]
                    / runs["snapshot"]["agent_cpu_first_10s_ms"]["median"],
                    2,
                )
                result["sizes"][str(size)] = runs
            if _MILLION:
                say("starts from a snapshot of 1,000,000 names")
                result["million_name_snapshot"] = million_snapshot_starts(
                    stack, client, redis_pid, _MILLION[0], args.repeats
                )
            client.close()
        finally:
            if stack is not None:
                stack.close()
            server.stop()
    sizes = sorted(result["sizes"], key=int)
    if len(sizes) >= 2:
        small, large = result["sizes"][sizes[0]], result["sizes"][sizes[-1]]
        result["ratio_large_over_small_cpu"] = {
            way: round(
                large[way]["agent_cpu_first_10s_ms"]["median"]
                / small[way]["agent_cpu_first_10s_ms"]["median"],
                2,
            )
            for way in ("rebuild", "snapshot")
        }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
