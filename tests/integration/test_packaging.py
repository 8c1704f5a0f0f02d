"""The distribution: the import name is ``certagent``, and nothing installs a module ``agent``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_wheel_installs_certagent_and_no_agent(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("certagent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"certagent"}, tops
    for packaged in (
        "certagent/runtime/templates/haproxy.cfg.tmpl",
        "certagent/runtime/templates/certagent.lua",
        "certagent/api/openapi.json",
        "certagent/py.typed",
        "certagent/testing/stack.py",
    ):
        assert packaged in names
    # the templates are the repository's haproxy/ and lua/ files, contents not links
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("certagent/runtime/templates/certagent.lua") == (
            ROOT / "lua" / "certagent.lua"
        ).read_bytes()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr

    def imports(module: str) -> subprocess.CompletedProcess[str]:
        # from an empty directory: the checkout must not be on sys.path
        return subprocess.run(
            [str(py), "-c", f"import {module}; print({module}.__file__)"],
            capture_output=True, text=True, cwd=tmp_path, timeout=60,
        )  # fmt: skip

    ok = imports("certagent")
    assert ok.returncode == 0, ok.stderr
    assert str(venv) in ok.stdout
    missing = imports("agent")
    assert missing.returncode != 0
    assert "No module named 'agent'" in missing.stderr


def test_install_sh_provides_promtool_and_systemd_analyze() -> None:
    """What scripts/install.sh adds for the tests: without these, tests would skip or fail."""
    promtool = Path(sys.executable).with_name("promtool")
    assert promtool.exists(), f"{promtool} is missing: run scripts/install.sh"
    version = subprocess.run(
        [str(promtool), "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("promtool, version 2."), version.stdout
    # tests/integration/test_init.py skips its `systemd-analyze verify` without it
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: run scripts/install.sh"
