"""Redis memory and RDB size per stored certificate, and where the bytes go.

    .venv/bin/python -m bench.store_size [--count N ...] [--layouts 2|1,2] [--bgsave-repeats 3]
        [--label WORD] [--out DIR]

For each N (``--count``, repeatable; default 10,000 and 100,000), starts a
private ``redis-server`` on a free loopback port and fills it with N ECDSA
P-256 certificates, each with its own key, all issued by one intermediate
(leaf + intermediate + key, as an import stores them), through the store's
bulk writer (``RedisStore.bulk().add_prepared``, the path ``certagent cert
import`` writes through; 500 records per call).  With ``--layouts 1,2`` each N
is measured twice, each in a fresh ``redis-server``: records of layout 1 (one
hash each, as stores written before layout 2 hold them, written the way the
writers then did, 16 concurrent MULTI/EXECs) and of layout 2 (the store's own
writes), so that the two compare within one run.  Then it reports:

* ``INFO memory``: ``used_memory`` (and per certificate), dataset, overhead;
* ``MEMORY USAGE`` by kind of key: the record hashes or strings, name sets and
  fingerprint keys (a sample of 500 of each, times their count), the shared
  chains, and the ``ids``, ``expiry`` and ``events`` keys (whole, ``SAMPLES 0``);
* ``BGSAVE`` ``--bgsave-repeats`` times: wall time from the command until Redis
  says it finished (polled every 10 ms), median, min, max; the RDB's size;
* ``lookup_all`` of 2,000 stored names, µs each (median, p90): the read, the
  key's decryption and the PEM payload HAProxy gets, on a loopback Redis.

The name filter's snapshot is not written by this fill (the agent writes it):
≈2.4 MB per million names (docs/store.md), ≈2.4 B per certificate.  Prints one
JSON document on stdout (progress on stderr) and writes it, with a Markdown
table, to ``bench/results/<date>-store-size[-k].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench._runinfo import RESULTS, publish, run_meta, say
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.store.redis import RedisStore
from certagent.testing import RedisProcess, write_key_file
from certagent.testing.certs import CA, cert_pem, issue_cert, key_pem, make_ca
from certagent.testing.layout1 import add_layout1

BATCH = 500
SAMPLE = 500


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.store_size", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    p.add_argument("--count", type=int, action="append", help="N (repeatable; 10000 and 100000)")
    p.add_argument("--bgsave-repeats", type=int, default=3, help="BGSAVEs per N (3)")
    p.add_argument(
        "--layouts", default="2", help="record layouts to measure, comma-separated: 2 or 1,2 (2)"
    )
    p.add_argument("--label", default="", help="a word added to the result's file name")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    return p.parse_args(argv)


def make_bundle(ca: CA, name: str) -> CertBundle:
    """A leaf for ``name`` with its own P-256 key, chained to ``ca``'s intermediate.

    Built without ``parse_bundle`` (validation is not what is measured): the same
    fields it would give.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    cert = issue_cert(ca, name, key=key)
    der = cert.public_bytes(serialization.Encoding.DER)
    return CertBundle(
        pem=cert_pem(cert) + ca.chain_pem + key_pem(key),
        names=(name,),
        fingerprint_sha1=hashlib.sha1(der, usedforsecurity=False).hexdigest().upper(),
        fingerprint_sha256=hashlib.sha256(der).hexdigest(),
        serial=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        key_type="ECDSA-P256",
    )


async def fill(store: RedisStore, ca: CA, count: int, layout: int) -> float:
    """Add ``count`` records through the bulk writer (layout 1: as the old writers did)."""
    if layout == 1:
        return await fill_layout1(store, ca, count)
    bulk = store.bulk()
    encoder = await bulk.encoder()
    started = time.monotonic()
    for first in range(0, count, BATCH):
        now = datetime.now(UTC).replace(microsecond=0)
        prepared = [
            encoder.prepare(make_bundle(ca, f"h{i:07d}.size.test"), now)
            for i in range(first, min(count, first + BATCH))
        ]
        results = await bulk.add_prepared(prepared)
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            raise SystemExit(f"the fill failed: {bad[0]}")
        if first and first % 50_000 == 0:
            say(f"  {first} stored, {time.monotonic() - started:.0f} s")
    return time.monotonic() - started


async def fill_layout1(store: RedisStore, ca: CA, count: int) -> float:
    """Layout-1 records, one MULTI/EXEC each (:func:`add_layout1`), 16 at a time."""
    assert store.keyring is not None
    started = time.monotonic()
    for first in range(0, count, 16):
        bundles = [
            make_bundle(ca, f"h{i:07d}.size.test") for i in range(first, min(count, first + 16))
        ]
        await asyncio.gather(
            *(add_layout1(store._client, store.keys, store.keyring, b) for b in bundles)
        )
        if first and first % 50_000 < 16:
            say(f"  {first} stored, {time.monotonic() - started:.0f} s")
    return time.monotonic() - started


def usage(client: redis.Redis, key: bytes) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def sampled(client: redis.Redis, pattern: str) -> dict[str, Any]:
    """Count of keys matching ``pattern`` and their mean ``MEMORY USAGE`` (a sample)."""
    keys: list[bytes] = []
    count = 0
    for key in client.scan_iter(match=pattern, count=5_000):
        count += 1
        if len(keys) < SAMPLE:
            keys.append(key)
    sizes = [usage(client, k) for k in keys]
    mean = statistics.fmean(sizes) if sizes else 0.0
    return {"keys": count, "mean_bytes": round(mean, 1), "total_bytes": round(mean * count)}


def breakdown(client: redis.Redis, prefix: str, count: int) -> dict[str, Any]:
    kinds = {
        "records (cert:)": sampled(client, f"{prefix}cert:*"),
        "name sets (name:)": sampled(client, f"{prefix}name:*"),
        "fingerprints (fp:)": sampled(client, f"{prefix}fp:*"),
        "shared chains (chain:)": sampled(client, f"{prefix}chain:*"),
    }
    for name in ("ids", "expiry", "events"):
        key = f"{prefix}{name}".encode()
        size = usage(client, key) if client.exists(key) else 0
        kinds[name] = {"keys": 1 if size else 0, "mean_bytes": size, "total_bytes": size}
    for entry in kinds.values():
        entry["per_certificate"] = round(entry["total_bytes"] / count, 1)
    events = f"{prefix}events"
    kinds["events"]["entries"] = int(client.xlen(events)) if client.exists(events) else 0
    return kinds


def bgsave(client: redis.Redis, workdir: Path, repeats: int) -> dict[str, Any]:
    times: list[float] = []
    for _ in range(repeats):
        started = time.monotonic()
        client.bgsave()
        while True:
            time.sleep(0.01)
            info = client.info("persistence")
            if not info["rdb_bgsave_in_progress"]:
                break
        times.append(time.monotonic() - started)
        if info["rdb_last_bgsave_status"] != "ok":
            raise SystemExit("BGSAVE failed")
    return {
        "seconds": {
            "median": round(statistics.median(times), 3),
            "min": round(min(times), 3),
            "max": round(max(times), 3),
        },
        "rdb_bytes": (workdir / "dump.rdb").stat().st_size,
    }


async def open_cost(store: RedisStore, client: redis.Redis, prefix: str) -> dict[str, Any]:
    """µs per ``lookup_all`` of a stored name: read, decrypt, PEM for HAProxy (loopback Redis)."""
    ids = [str(i, "ascii") for i in client.zrange(f"{prefix}ids", 0, 1_999)]  # type: ignore[arg-type]
    times: list[float] = []
    for cert_id in ids:
        record = await store.get(cert_id)
        assert record is not None
        started = time.perf_counter()
        found = await store.lookup_all(record.names[0])
        times.append((time.perf_counter() - started) * 1e6)
        assert found and found[0].id == cert_id
    return {
        "records": len(times),
        "us_median": round(statistics.median(times), 1),
        "us_p90": round(statistics.quantiles(times, n=10)[-1], 1),
    }


def measure(count: int, layout: int, repeats: int, workdir: Path) -> dict[str, Any]:
    ca = make_ca("store size bench CA")
    ring = KeyRing.from_file(write_key_file(workdir / "data.key"))
    server = RedisProcess(workdir / "redis")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        prefix = "certagent:"

        async def run() -> tuple[float, dict[str, Any]]:
            store = RedisStore(server.url, keyring=ring)
            try:
                seconds = await fill(store, ca, count, layout)
                cost = await open_cost(store, client, prefix)
            finally:
                await store.close()
            return seconds, cost

        say(f"N={count}, layout {layout}: filling")
        fill_seconds, cost = asyncio.run(run())
        client.memory_purge()
        info = client.info("memory")
        kinds = breakdown(client, prefix, count)
        say(f"N={count}: BGSAVE x{repeats}")
        saved = bgsave(client, server.workdir, repeats)
        used = int(info["used_memory"])
        return {
            "count": count,
            "layout": layout,
            "fill_seconds": round(fill_seconds, 1),
            "dbsize": int(client.dbsize()),
            "used_memory": used,
            "used_memory_per_certificate": round(used / count, 1),
            "used_memory_dataset": int(info["used_memory_dataset"]),
            "used_memory_overhead": int(info["used_memory_overhead"]),
            "used_memory_rss": int(info["used_memory_rss"]),
            "keys": kinds,
            "bgsave": saved,
            "rdb_bytes_per_certificate": round(saved["rdb_bytes"] / count, 1),
            "open_record": cost,
        }
    finally:
        server.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Redis memory per certificate",
        "",
        f"{result['meta']['date']}, revision {result['meta']['revision']},"
        f" load at start: {result['meta']['load']}",
        "",
        "| N | layout | used_memory | per certificate | RDB | RDB per certificate"
        " | BGSAVE (median, min-max) | lookup µs (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        save = run["bgsave"]["seconds"]
        lines.append(
            f"| {run['count']:,} | {run['layout']} | {run['used_memory']:,}"
            f" | {run['used_memory_per_certificate']:,}"
            f" | {run['bgsave']['rdb_bytes']:,} | {run['rdb_bytes_per_certificate']:,}"
            f" | {save['median']} s ({save['min']}-{save['max']})"
            f" | {run['open_record']['us_median']} |"
        )
    for run in result["runs"]:
        lines += [
            "",
            f"## Where the bytes go at N = {run['count']:,}, layout {run['layout']}",
            "",
            "| keys | count | mean bytes | per certificate |",
            "|---|---:|---:|---:|",
        ]
        for kind, entry in run["keys"].items():
            lines.append(
                f"| {kind} | {entry['keys']:,} | {entry['mean_bytes']:,}"
                f" | {entry['per_certificate']:,} |"
            )
        lines.append(
            f"\nA lookup (read, decrypt, PEM for HAProxy): {run['open_record']['us_median']} µs"
            f" median, p90 {run['open_record']['us_p90']} µs, of {run['open_record']['records']}."
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    counts = args.count or [10_000, 100_000]
    layouts = [int(x) for x in args.layouts.split(",")]
    meta = run_meta()
    meta["load"] = os.getloadavg()
    meta["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    runs = []
    with tempfile.TemporaryDirectory(prefix="certagent-store-size-") as tmp:
        for count in counts:
            for layout in layouts:
                work = Path(tmp) / f"{count}-{layout}"
                runs.append(measure(count, layout, args.bgsave_repeats, work))
                say(
                    json.dumps(
                        {k: runs[-1][k] for k in ("count", "layout", "used_memory_per_certificate")}
                    )
                )
    meta["load_after"] = os.getloadavg()
    result = {"meta": meta, "runs": runs}
    stem = f"{meta['date'][:10]}-store-size" + (f"-{args.label}" if args.label else "")
    path = publish(result, args.out, stem, markdown(result))
    say(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
