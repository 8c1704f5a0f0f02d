"""``python -m bench.http3 --smoke``: certagent over HTTP/3 against a preloading HAProxy.

It starts Debian's 3.2 from scripts/haproxy-versions.sh's cache itself, so it runs once, in
the suite's 2.6 run (mark ``own_builds``, tests/conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.versions.builds import CACHE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
SID = CACHE / "sid" / "bin" / "haproxy"


def test_http3_bench_smoke_compares_both_sides_in_one_run(tmp_path: Path) -> None:
    if not (CACHE / "sid" / "ready").exists():
        pytest.skip(f"no HAProxy 3.2 in {CACHE}: run `bash scripts/haproxy-versions.sh sid`")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.http3", "--smoke", "--out", str(tmp_path),
         "--haproxy", str(SID)],
        cwd=REPO, capture_output=True, text=True, timeout=200, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["meta"]["haproxy_build"]["version"].startswith("3.2.")
    repeats = result["sizes"]["repeats"]
    assert len(result["repeats"]) == repeats >= 3
    assert [r["first"] for r in result["repeats"]][:2] == ["certagent", "preload"]
    for metric, s in result["summary"].items():
        assert s["certagent_us"] > 0 and s["preload_us"] > 0, metric
        assert len(s["ratios"]) == repeats and s["ratio_min"] <= s["ratio"] <= s["ratio_max"]
    # every request went over HTTP/3 on certagent's side, no host was loaded again
    http3 = result["agent"]["http3"]
    sizes = result["sizes"]
    assert http3["quic"]["requests"] >= repeats * (sizes["h3_requests"] + sizes["h3_handshakes"])
    assert http3["quic"]["refused"] == 0
    assert result["agent"]["loader"]["loads"] == sizes["hosts"]
    assert (tmp_path / f"{Path(next(tmp_path.glob('*.json'))).stem}.md").exists()
