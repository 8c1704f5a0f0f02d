"""``python -m bench --smoke``: every scenario at tiny sizes, in a subprocess, bounded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _native

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)

    assert list(result)[:2] == ["meta", "targets"]
    assert {"startup", "churn", "cold_warm", "storm", "hop"} <= set(result)
    assert result["meta"]["mode"] == "smoke"
    assert result["meta"]["storm_client"] in (_native.LABEL, "Python asyncio")
    assert {"nproc", "cpu_model", "mem_total_gb"} <= set(result["meta"]["machine"])
    assert {
        "startup",
        "churn_rss",
        "cold_p50",
        "cold_p99",
        "storm_success",
        "storm_warm",
        "hop_connection",
        "hop_request",
    } <= set(result["targets"])
    assert all(row["limit"] for row in result["targets"].values())  # shown when missed

    rows = result["startup"]["rows"]
    assert [r["n"] for r in rows] == [200, 1000]
    assert all(r["preload_s"] > 0 and r["certagent_s"] > 0 for r in rows)
    churn = result["churn"]
    assert len(churn["per_round"]) == churn["rounds"] == 5
    sampled = churn["handshakes_sampled_per_round"]
    assert all(r["warm_handshakes_ok"] == sampled for r in churn["per_round"])
    # the sampled handshakes stored TLS sessions; recycled hosts left the usage table
    assert all(r["certagent_session_cache_mb"] > 0 for r in churn["per_round"])
    assert all(0 < r["usage_table_entries"] <= churn["capacity"] for r in churn["per_round"])
    assert result["cold_warm"]["failures"] == 0
    assert result["cold_warm"]["certagent_cold_ms"]["count"] == 100
    for side in ("certagent", "certagent_batch_1", "preload"):
        assert {"success_pct", "latency_ms", "warm_idle_ms", "warm_during_ms"} <= set(
            result["storm"][side]
        )
    assert result["storm"]["preload"]["success_pct"] == 100
    variants = result["hop"]["variants"]
    assert "baseline" in variants
    for v in variants.values():
        assert v["new_connection"]["certagent_us"] > 0
        assert v["keepalive_request"]["ops_per_run"] == 5 * 40

    stem = result["meta"]["date"] + "-smoke"
    assert json.loads((tmp_path / f"{stem}.json").read_text()) == result
    assert "## 5. Steady-state cost of the hop" in (tmp_path / f"{stem}.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
