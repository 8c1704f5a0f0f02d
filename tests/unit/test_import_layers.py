"""The import layers (pyproject.toml's ``[tool.importlinter]``), checked by import-linter.

scripts/test.sh runs ``lint-imports`` on the tree; these tests show that the
contracts hold today and that they do catch an upward import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(package_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_package_keeps_every_contract() -> None:
    result = _lint(ROOT / "agent")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "agent" / "certagent",
        tmp_path / "certagent",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    probe = tmp_path / "certagent" / "certs" / "hostname.py"
    source = probe.read_text()
    probe.write_text(
        source.replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nimport certagent.service.ensure\n",
            1,
        )
    )
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "certagent.certs is not allowed to import certagent.service" in result.stdout
    assert "certagent.certs.hostname -> certagent.service.ensure" in result.stdout
