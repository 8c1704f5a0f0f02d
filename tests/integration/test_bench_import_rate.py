"""``python -m bench.import_rate`` at a tiny size, in a subprocess, bounded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]


def test_import_rate_prints_json_for_every_case(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "bench.import_rate", "--count", "60", "--repeats", "2",
        "--distinct-count", "20", "--rsa-count", "4", "--single-count", "20",
        "--cache", str(tmp_path / "cache"),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert [case["count"] for case in result["cases"]] == [60, 20, 4, 20]
    for case in result["cases"]:
        assert len(case["runs"]) == 2
        assert case["rate_min"] <= case["rate_median"] <= case["rate_max"]
        for run in case["runs"]:
            assert run["records"] == run["events"] == case["count"]
            assert run["import_cpu_s"] > 0
            assert f"imported {case['count']} of {case['count']} files" in run["summary"]
    assert {"nproc", "cpu_model"} <= set(result["machine"])
    # generated files are reused
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing 60 files" in again.stderr
