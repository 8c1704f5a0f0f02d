"""``python -m demo`` (what ``scripts/demo.sh`` runs after the install), at small sizes.

The on-demand part needs Debian's pebble (``scripts/install.sh`` installs it):
with it, never-seen names get a pebble certificate on their first connection;
without a working pebble the demo says so and the rest still runs, exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from certagent.testing.pebble import CHALLTESTSRV
from demo.ondemand import NAMES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--certs", "60", "--hosts", "20", "--capacity", "30"]


def run_demo(workdir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "demo", *SMALL, "--workdir", str(workdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # ≈ 8 s on a quiet machine
        env=env,
        check=False,
    )


def stopped_pids(output: str) -> dict[str, int]:
    """The processes the demo's last line says it stopped: ``{"pebble": 123, ...}``."""
    (line,) = [ln for ln in output.splitlines() if ln.startswith("demo: stopped ")]
    return {m[1]: int(m[2]) for m in re.finditer(r"([\w-]+(?: worker)?) pid (\d+)", line)}


def assert_gone(pids: dict[str, int]) -> None:
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # signal 0: only asks whether the process exists


def test_demo_issues_never_seen_names_from_pebble_and_stops_everything(tmp_path: Path) -> None:
    proc = run_demo(tmp_path / "demo-run")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "failures         0" in out
    assert "default certificate served" in out  # the unknown host still gets the fallback
    for name in NAMES:
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(name)]
        assert re.search(r"first connection \d+ ms: issued by Pebble Intermediate CA", line), line
        assert re.search(r"serial [0-9a-f]+; again [\d.]+ ms", line), line
    assert f"on demand        {len(NAMES)} / {len(NAMES)} never-seen names" in out
    assert f"orders {len(NAMES)} valid / 0 failed" in out  # the agent's own count
    pids = stopped_pids(out)
    assert {"certagent", "haproxy", "pebble", "pebble-challtestsrv", "redis"} <= set(pids)
    assert_gone(pids)


def test_demo_runs_without_the_on_demand_part_when_pebble_cannot_start(tmp_path: Path) -> None:
    # a "pebble" that exits at once, first on PATH; its DNS is the real one
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "pebble").write_text("#!/bin/sh\necho 'pebble: cannot start (test)' >&2\nexit 1\n")
    (fake / "pebble").chmod(0o755)
    (fake / "pebble-challtestsrv").symlink_to(CHALLTESTSRV)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = run_demo(tmp_path / "demo-run", env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "demo: pebble could not start (pebble exited with 1" in out
    assert "the on-demand part is skipped" in out
    assert "on demand        skipped" in out
    assert "failures         0" in out and "cold (never seen)" in out  # the rest ran
    assert "--acme-directory" not in out
    pids = stopped_pids(out)
    assert "pebble" not in pids and "certagent" in pids
    assert_gone(pids)
