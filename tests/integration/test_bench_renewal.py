"""``python -m bench.renewal --smoke``: both scenarios at tiny sizes, in a subprocess, bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]


def test_renewal_bench_smoke_writes_json_and_markdown(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.renewal", "--smoke", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["meta"]["smoke"] is True

    idle = result["idle"]
    scheduled = result["meta"]["sizes"]["scheduled"]
    assert idle["scheduled"] == scheduled
    assert idle["schedule_count_after"] == {"entries": scheduled, "due": 0}
    assert set(idle["processes"]) == {"agent", "haproxy_master", "haproxy_worker", "redis"}
    for side in ("empty", "scheduled_entries"):
        figure = idle[side]["agent_plus_haproxy_ms_per_s"]
        assert len(figure["runs"]) == 3
        assert 0 < figure["min"] <= figure["median"] <= figure["max"]

    thr = result["throughput"]
    names = result["meta"]["sizes"]["due_at_once"]
    assert thr["names"] == names
    # every round renewed every name, with exactly one order each at the CA
    assert thr["orders_at_pebble_per_round"] == [names] * 3
    assert thr["one_order_per_name"] is True
    assert thr["renewals_per_s"]["min"] > 0

    (written,) = tmp_path.glob("*-renewal-smoke.json")
    assert json.loads(written.read_text()) == result
    assert "renewals/s" in written.with_suffix(".md").read_text()
