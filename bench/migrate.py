"""``fleet finalize``'s migration: how fast a store of format 1 is rewritten in format 2, online.

    .venv/bin/python -m bench.migrate [--count N] [--repeats R] [--out DIR]

Each repeat starts a private ``redis-server`` on a free loopback port and fills it as a
store of a release before 0.3.0 holds it: N ECDSA P-256 certificates (each with its
own key, one shared intermediate) as format-1 hashes, through the store's bulk writer
on a store at format 1 (one record written the way 003bece wrote it, then N - 1 by
``BulkAdds``, 500 per call).  Then, while a reader looks up stored names without pause
(another process, as the agents keep serving), the store is finalized and migrated
(``FleetBoard.finalize`` + ``migrate``, what ``certagent fleet finalize`` runs), and it
reports:

* records rewritten per second (wall time of the migration), the CPU seconds of this
  process (decryption, parse and packing of each record) and of ``redis-server``;
* Redis ``used_memory`` per certificate before (format 1) and after (format 2);
* the lookups of a reader in another process (as an agent is) during the migration, and
  how many found nothing (must be 0).

Median of the repeats, with min and max.  Prints one JSON document on stdout (progress
on stderr) and writes it, with a Markdown table, to ``bench/results/<date>-migrate.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from bench._runinfo import RESULTS, publish, run_meta, say
from bench.store_size import make_bundle
from certagent.certs.keycrypt import KeyRing
from certagent.store.redis import RedisStore
from certagent.testing import RedisProcess, cpu_seconds, write_key_file
from certagent.testing.certs import make_ca
from certagent.testing.layout1 import add_layout1

BATCH = 500


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.migrate", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--count", type=int, default=20_000, help="certificates (20,000)")
    p.add_argument("--repeats", type=int, default=3, help="fresh stores migrated (3)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


async def fill(store: RedisStore, count: int) -> list[str]:
    """A store of format 1 with ``count`` certificates; their names."""
    assert store.keyring is not None
    ca = make_ca("migrate bench CA", intermediate=True)
    names = [f"h{i:07d}.migrate.test" for i in range(count)]
    await add_layout1(store._client, store.keys, store.keyring, make_bundle(ca, names[0]))
    bulk = store.bulk()
    encoder = await bulk.encoder()
    assert encoder.layout == 1, "a store with records and no format number is format 1"
    now = datetime.now(UTC).replace(microsecond=0)
    for first in range(1, count, BATCH):
        batch = [encoder.prepare(make_bundle(ca, n), now) for n in names[first : first + BATCH]]
        bad = [r for r in await bulk.add_prepared(batch) if isinstance(r, Exception)]
        if bad:
            raise SystemExit(f"the fill failed: {bad[0]}")
    return names


def _reader(url: str, key_file: str, names: list[str], stop: Any, counts: Any) -> None:
    """Another process (as an agent is) looking names up until ``stop``: lookups, misses."""

    async def serve() -> tuple[int, int]:
        reader = RedisStore(url, keyring=KeyRing.from_file(Path(key_file)))
        lookups = misses = i = 0
        try:
            while not stop.is_set():
                found = await reader.lookup(names[i % len(names)])
                lookups += 1
                misses += found is None
                i += 7919  # a prime stride: across the whole store
        finally:
            await reader.close()
        return lookups, misses

    counts.put(asyncio.run(serve()))


async def migrate_once(url: str, key_file: Path, names: list[str]) -> dict[str, Any]:
    store = RedisStore(url, keyring=KeyRing.from_file(key_file))
    context = multiprocessing.get_context("spawn")
    stop, counts = context.Event(), context.Queue()
    reader = context.Process(target=_reader, args=(url, str(key_file), names, stop, counts))
    reader.start()
    try:
        await asyncio.sleep(1.0)  # the reader up and looking names up
        started, cpu = time.monotonic(), time.process_time()
        await store.fleet().finalize(2, "bench")
        report = await store.fleet().migrate()
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        stop.set()
        await store.close()
    lookups, misses = counts.get(timeout=30)
    reader.join(30)
    return {
        "seconds": round(seconds, 2),
        "rewritten": report.rewritten,
        "left": report.left,
        "per_second": round(report.rewritten / seconds),
        "bench_cpu_us_per_record": round(cpu / max(1, report.rewritten) * 1e6),
        "reader_lookups": lookups,
        "reader_misses": misses,
    }


def run_one(count: int, index: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-migrate-") as scratch:
        work = Path(scratch)
        key_file = write_key_file(work / "data.key")
        server = RedisProcess(work / "redis").start()
        try:
            client = redis.Redis.from_url(server.url)
            base = int(client.info("memory")["used_memory"])

            async def filled() -> list[str]:
                store = RedisStore(server.url, keyring=KeyRing.from_file(key_file))
                try:
                    return await fill(store, count)
                finally:
                    await store.close()

            say(f"repeat {index + 1}: filling {count} format-1 records")
            names = asyncio.run(filled())
            before = (int(client.info("memory")["used_memory"]) - base) / count
            redis_cpu = cpu_seconds(server.proc.pid)
            say(f"repeat {index + 1}: migrating")
            out = asyncio.run(migrate_once(server.url, key_file, names))
            out["redis_cpu_us_per_record"] = round(
                (cpu_seconds(server.proc.pid) - redis_cpu) / max(1, out["rewritten"]) * 1e6
            )
            after = (int(client.info("memory")["used_memory"]) - base) / count
            types = {client.type(k) for k in client.scan_iter(match="certagent:cert:*")}
            out.update(
                used_memory_per_certificate_before=round(before),
                used_memory_per_certificate_after=round(after),
                record_types_after=sorted(t.decode() for t in types),
            )
            client.close()
            say(f"repeat {index + 1}: {out}")
            return out
        finally:
            server.stop()


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    rows = [
        ("records rewritten per second", s["per_second"]),
        ("this process's CPU per record, µs", s["bench_cpu_us_per_record"]),
        ("redis-server's CPU per record, µs", s["redis_cpu_us_per_record"]),
        ("used_memory per certificate, format 1", s["used_memory_per_certificate_before"]),
        ("used_memory per certificate, format 2", s["used_memory_per_certificate_after"]),
    ]
    lines = [
        f"# fleet finalize's migration, {result['count']:,} certificates",
        "",
        f"`python -m bench.migrate --count {result['count']} --repeats {result['repeats']}` at"
        f" {result['meta']['revision']}; machine: {result['meta']['machine']['cpu_model']},"
        f" {result['meta']['machine']['nproc']} CPUs, {result['meta']['machine']['redis']};"
        f" load averages {result['load_average']['before']} before,"
        f" {result['load_average']['after']} after.",
        "",
        "| | median (min-max) |",
        "|---|---|",
        *(f"| {name} | {v['median']:,} ({v['min']:,}-{v['max']:,}) |" for name, v in rows),
        "",
        f"A reader looked names up throughout: {s['reader_lookups']} lookups, {s['reader_misses']}"
        " found nothing (sums over the repeats).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = [run_one(args.count, i) for i in range(args.repeats)]
    load_after = [round(x, 2) for x in os.getloadavg()]
    keys = (
        "per_second",
        "bench_cpu_us_per_record",
        "redis_cpu_us_per_record",
        "used_memory_per_certificate_before",
        "used_memory_per_certificate_after",
    )
    summary: dict[str, Any] = {k: spread([r[k] for r in runs]) for k in keys}
    summary["reader_lookups"] = sum(r["reader_lookups"] for r in runs)
    summary["reader_misses"] = sum(r["reader_misses"] for r in runs)
    result = {
        "meta": run_meta(),
        "count": args.count,
        "repeats": args.repeats,
        "summary": summary,
        "runs": runs,
        # the machine is shared: its 1/5/15-minute load averages before and after
        "load_average": {"before": load_before, "after": load_after},
    }
    publish(result, args.out, f"{datetime.now(UTC):%Y-%m-%d}-migrate", markdown(result))
    return 0 if summary["reader_misses"] == 0 and all(r["left"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
