"""The store side: ``certagent cert import`` of the whole set, Redis memory, BGSAVE, RDB.

The import is the real command line into the Redis the agent then serves from;
its rate is N / the command's wall time, and Redis's record count is sampled
every second meanwhile (the rate in the first and the last tenth of the import:
does it fall as the store grows?).  Peak RSS is VmHWM of the import process
(its validation workers separately); CPU counts the command, its workers and
redis-server.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from bench._proc import hwm_kb
from bench.import_rate import TreeCpu
from certagent.testing import RedisProcess, Stack, certagent_argv, cpu_seconds

IDS = "certagent:ids"


def _tenth_rates(samples: list[tuple[float, int]], count: int) -> tuple[float | None, float | None]:
    """Certificates per second over the first and the last tenth of ``count`` (sampled)."""

    def rate(lo: int, hi: int) -> float | None:
        first = next(((t, n) for t, n in samples if n >= lo), None)
        last = next(((t, n) for t, n in samples if n >= hi), None)
        if first is None or last is None or last[0] <= first[0]:
            return None
        return round((last[1] - first[1]) / (last[0] - first[0]), 1)

    return rate(0, count // 10), rate(count - count // 10, count)


def import_all(stack: Stack, server: RedisProcess, source: Path, count: int) -> dict[str, Any]:
    """``certagent cert import --config ... source`` into ``server``; rate, memory, CPU."""
    assert server.proc is not None
    argv = [*certagent_argv(), "cert", "import", "--config", str(stack.config_path), str(source)]
    client = redis.Redis.from_url(server.url, socket_timeout=30)
    redis_before = cpu_seconds(server.proc.pid)
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=stack.env, text=True
    ) as proc:
        tree = TreeCpu(proc.pid)
        peak_kb = worker_peak_kb = 0
        next_sample = started
        while proc.poll() is None:
            now = time.monotonic()
            tree.sample()
            peak_kb = max(peak_kb, hwm_kb(proc.pid))
            for pid in tree.seen:
                if pid != proc.pid:
                    worker_peak_kb = max(worker_peak_kb, hwm_kb(pid))
            if now >= next_sample:
                samples.append((now - started, int(client.zcard(IDS))))
                next_sample = now + 1.0
            time.sleep(0.1)
        stdout, _ = proc.communicate()
    seconds = time.monotonic() - started
    records = int(client.zcard(IDS))
    samples.append((seconds, records))
    client.close()
    summary = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    if proc.returncode != 0 or records != count:
        raise RuntimeError(f"import exited {proc.returncode}, {records} of {count}: {summary}")
    first, last = _tenth_rates(samples, count)
    return {
        "seconds": round(seconds, 1),
        "rate_per_s": round(count / seconds, 1),
        "rate_first_tenth_per_s": first,
        "rate_last_tenth_per_s": last,
        "summary": summary,  # its own rate: from its start, the interpreter's excluded
        "importer_peak_rss_mb": round(peak_kb / 1024, 1),
        "worker_peak_rss_mb": round(worker_peak_kb / 1024, 1),
        "import_cpu_s": round(tree.total, 1),
        "redis_cpu_s": round(cpu_seconds(server.proc.pid) - redis_before, 1),
    }


def used_memory(server: RedisProcess) -> int:
    with server.client(timeout=30) as client:
        return int(client.info("memory")["used_memory"])


def bgsave(server: RedisProcess, timeout: float = 300.0) -> dict[str, Any]:
    """BGSAVE, timed until Redis counts one more save; the RDB's size; the file is then removed."""
    rdb = server.workdir / "dump.rdb"
    with server.client(timeout=30) as client:
        saves = int(client.info("persistence")["rdb_saves"])
        started = time.monotonic()
        client.bgsave()
        while True:
            persistence = client.info("persistence")
            if int(persistence["rdb_saves"]) > saves and not int(
                persistence["rdb_bgsave_in_progress"]
            ):
                break
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"BGSAVE still running after {timeout:.0f} s")
            time.sleep(0.05)
        seconds = time.monotonic() - started
        status = str(persistence["rdb_last_bgsave_status"])
    size = rdb.stat().st_size
    os.unlink(rdb)
    return {"bgsave_s": round(seconds, 2), "rdb_bytes": size, "status": status}
