"""``python -m bench.versions storm --smoke``: 2.6 and 3.2 side by side at tiny sizes.

It starts both HAProxy builds itself, so it runs once, in the suite's 2.6 run (mark
``own_builds``, tests/conftest.py); Debian's 3.2 comes from scripts/haproxy-versions.sh's
cache, which scripts/test.sh builds before any pytest run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.versions.builds import CACHE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SID = CACHE / "sid" / "bin" / "haproxy"


def test_storm_versions_smoke_runs_each_build_from_the_same_init(tmp_path: Path) -> None:
    if not (CACHE / "sid" / "ready").exists():
        pytest.skip(f"no HAProxy 3.2 in {CACHE}: run `bash scripts/haproxy-versions.sh sid`")
    system = shutil.which("haproxy") or "/usr/sbin/haproxy"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.versions", "storm", "--smoke", "--out", str(tmp_path),
         "--haproxy", f"2.6={system}", "--haproxy", f"3.2={SID}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,  # ~20 s on a quiet machine
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)

    meta = result["meta"]
    assert [b["label"] for b in meta["builds"]] == ["2.6", "3.2"]
    assert meta["builds"][0]["describe"].startswith("HAProxy 2.6.")
    assert meta["builds"][1]["describe"].startswith("HAProxy 3.2.")
    assert meta["same_config"] is True  # one generated configuration for both
    hosts, repeats = meta["sizes"]["hosts"], meta["sizes"]["repeats"]
    assert sorted((r["build"], r["repeat"]) for r in result["runs"]) == [
        (b, n) for b in ("2.6", "3.2") for n in range(1, repeats + 1)
    ]
    for row in result["runs"]:
        assert row["verified"] + row["failed"] == hosts
        assert row["haproxy_ms_per_host"] > 0 and row["agent_ms_per_host"] > 0
        assert row["recycles"] >= hosts  # every new host took a slot from another
        assert len(row["loadavg_1m"]) == 2
        # the warm host's samples: counted per phase, kept in the result, the prober's CPU read
        assert row["warm_idle_samples"] == len(row["warm_samples_ms"]["idle"]) > 0
        assert row["warm_during_samples"] == len(row["warm_samples_ms"]["during"]) > 0
        assert row["prober_cpu_pct_storm"] > 0 and "haproxy_net_ms_per_host" in row
    assert all(r["wrong_cert"] == 0 for r in result["runs"])
    assert result["summary"]["3.2"]["warm_pooled"]["during_samples"] == sum(
        r["warm_during_samples"] for r in result["runs"] if r["build"] == "3.2"
    )
    ratios = result["summary"]["3.2"]["ratio_to_2.6"]["haproxy_ms_per_host"]
    assert len(ratios["runs"]) == repeats and ratios["median"] > 0
    assert set(result["targets"]) >= {"3.2 haproxy_ms_per_host", "2.6 warm_p99_ratio"}
    written = sorted(p.name for p in tmp_path.iterdir())
    assert [n.rsplit(".", 1)[1] for n in written] == ["json", "md"]
    assert "| HAProxy CPU per new host, ms |" in (tmp_path / written[1]).read_text()


def test_storm_versions_preload_floor_serves_the_storm_without_an_agent(tmp_path: Path) -> None:
    system = shutil.which("haproxy") or "/usr/sbin/haproxy"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.versions", "storm", "--smoke", "--out", str(tmp_path),
         "--haproxy", f"ca={system}", "--haproxy", f"pre={system}", "--preload", "pre"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert [b["preload"] for b in result["meta"]["builds"]] == [False, True]
    hosts = result["meta"]["sizes"]["hosts"]
    for row in result["runs"]:
        assert row["verified"] + row["failed"] == hosts and row["wrong_cert"] == 0
        assert row["warm_during_samples"] > 0
        if row["build"] == "pre":  # no agent: nothing asked it, nothing recycled
            assert row["agent_ms_per_host"] is None and row["recycles"] is None
            assert row["asked_ok"] == 0
        else:
            assert row["agent_ms_per_host"] > 0 and row["recycles"] >= hosts
    floor = result["floors"]["pre"]
    assert floor["certagent"] == "ca" and floor["warm_p99_ratio"]["median"] > 0
    assert "**Floor**: ca (certagent) / pre" in next(tmp_path.glob("*.md")).read_text()
