"""``python -m bench.million --smoke``: N = 10^2 and 10^3 in one run, in a subprocess, bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]


def test_million_bench_smoke_reports_every_figure_with_ratios(tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.million",
            "--smoke",
            "--cache",
            str(cache),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=210,  # 25 s here on a quiet machine, 60-115 s at a load average of 9-15
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["meta"]["smoke"] is True
    assert result["meta"]["generation"]["from_cache"] is False
    assert set(result["sizes"]) == {"100", "1000"}
    for n, side in result["sizes"].items():
        assert side["import"]["summary"].startswith(f"imported {n} of {n} files")
        assert side["redis"]["used_memory_per_cert"] > 0 and side["redis"]["status"] == "ok"
        assert side["first_start"]["snapshot_saved_s"] is not None
        assert len(side["starts"]["runs"]) == 1
        assert len(side["floods"]["at_start"]["runs"]) == len(side["floods"]["settled"]["runs"])
        assert all(r["made_up_sent"] > 0 for r in side["floods"]["at_start"]["runs"])
        assert side["serve"]["cold_warm"]["warm_verified"] > 0
        assert side["cert_ls"]["ok"] and side["cert_ls"]["lines"] == int(n) + 1
        assert side["hosts_used"] <= int(n)
    figures = {row["figure"] for row in result["table"]}
    assert {"`cert ls`: peak RSS, MB", "BGSAVE, s", "name filter size, bytes"} <= figures
    assert {"1_agent_cpu_ratio", "2_cert_ls_first_line_s", "3_import_rate_per_s"} <= set(
        result["must_show"]
    )
    (written,) = out.glob("*-million-smoke.json")
    assert json.loads(written.read_text()) == result
    assert "| figure | 1,000 | 100 | ratio |" in written.with_suffix(".md").read_text()
