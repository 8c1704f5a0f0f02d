"""``python -m bench.issuance --smoke``: on-demand issuance timed against pebble, in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]
PROCESSES = {"agent", "haproxy", "redis", "pebble", "pebble_dns"}


def test_issuance_bench_smoke_times_first_connections_beside_the_ca(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.issuance", "--smoke", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # ≈ 10 s on a quiet machine
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    sizes = result["meta"]["sizes"]
    assert sizes == {"names": 3, "repeats": 2, "workers": 3}
    for variant, workers in (("sequential", 1), ("concurrent", 3)):
        v = result[variant]
        assert v["workers"] == workers
        # every never-seen name got its own pebble certificate on its first connection
        assert v["verified"] == v["asked"] == 6, v
        assert v["fallback"] == v["failed"] == v["ca_failed"] == 0
        assert v["orders_per_name"] == 1.0  # one order each: nothing ordered twice
        for figure in ("first_connection_ms", "ca_order_ms", "overhead_ms"):
            for p in ("p50", "p99"):
                assert len(v[figure][p]["runs"]) == 2, (variant, figure)  # every repeat kept
        assert v["first_connection_ms"]["p50"]["median"] > 0
        assert v["ca_order_ms"]["p50"]["median"] > 0
        # the agent's log split each first connection; the direct orders give the CA's span
        parts = v["breakdown_p50_ms"]
        for segment in ("to_order", "order", "store", "load", "handshake", "direct_order"):
            assert parts[f"{segment}_p50_ms"]["median"] > 0, (variant, segment)
        assert set(v["cpu_ms_per_issuance"]) == PROCESSES
        assert v["cpu_ms_per_issuance"]["agent"]["median"] > 0  # the agent ordered
        assert set(v["cpu_ms_per_direct_order"]) == PROCESSES | {"acme_client"}
        assert v["cpu_ms_per_direct_order"]["pebble"]["median"] > 0
    # the bench stopped everything it started, by PID
    assert "stopped certagent pid" in proc.stderr and "pebble pid" in proc.stderr
    (written,) = tmp_path.glob("*-issuance-smoke.json")
    assert json.loads(written.read_text()) == result
    report = written.with_suffix(".md").read_text()
    assert "| one at a time |" in report and "| 3 at once |" in report
