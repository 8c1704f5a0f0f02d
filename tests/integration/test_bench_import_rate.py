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


def test_import_rate_before_runs_both_by_turns(tmp_path: Path) -> None:
    certagent = Path(sys.executable).with_name("certagent")
    argv = [
        sys.executable, "-m", "bench.import_rate", "--count", "200", "--repeats", "1",
        "--keys", "distinct", "--distinct-count", "0", "--rsa-count", "0",
        "--before", str(certagent), "--cache", str(tmp_path / "cache"), "--cold",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=140, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    before, after = result["cases"]
    assert before["case"].endswith(", before") and after["case"].endswith(", after")
    assert after["rate_ratio_to_before"] > 0
    for case in (before, after):
        assert case["runs"][0]["records"] == 200
        assert case["runs"][0]["cold"] is True  # its files dropped from the page cache first
        assert case["import_main_peak_rss_mb_median"] > 0


def test_import_stages_prints_a_median_per_stage(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "bench.import_stages", "--count", "30", "--passes", "1",
        "--cache", str(tmp_path / "cache"), "--profile", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    medians = result["medians_us"]
    for which in ("before", "after"):
        assert set(medians[which]) == {"read", "validate", "encode", "pickle", "total"}
        assert medians[which]["total"] > 0
    functions = [row["function"] for row in result["profile"]]
    assert any("verify" in f for f in functions)  # the ECDSA verification: the largest own time
    (written,) = (tmp_path / "out").glob("*-import-stages*.md")
    assert "`prepare_batch` as a worker runs it" in written.read_text()


def test_import_floor_prints_each_operation_and_the_floor(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "bench.import_floor", "--count", "40", "--passes", "1",
        "--cache", str(tmp_path / "cache"),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    operations = ("leaf_parse", "leaf_verify", "key_load", "key_match", "key_encrypt")
    assert all(result["medians_us"][op] > 0 for op in operations)
    assert result["medians_us"]["redis_write"] >= 0  # 40 records may take under a clock tick
    assert result["floor_us"] >= sum(result["medians_us"][op] for op in operations) - 0.5
    assert result["budget_per_cert_us"] == 100
    medians = result["medians_us"]
    # the plain loop does at least the verification; the worker at least as much as the loop
    assert medians["straight"] > medians["leaf_verify"] > 0
    assert medians["worker"] > medians["leaf_verify"]
    assert result["least_python_us"] == round(medians["straight"] + medians["redis_write"], 1)


def test_import_profile_profiles_the_importing_process(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-m", "bench.import_profile", "--count", "30",
        "--cache", str(tmp_path / "cache"),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout)["runs"]["after"]
    assert "imported 30 of 30 files" in run["summary"]
    assert run["top_own_time"] and run["profile_total_s"] > 0
