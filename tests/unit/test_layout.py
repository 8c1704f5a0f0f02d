"""The package layout: layers as subpackages, small modules, no product code on the test tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent" / "certagent"
MAX_LINES = 600
# A layer may import only the layers listed for it (and itself); errors/config are the base.
ALLOWED = {
    "certs": set(),
    "acme": {"certs"},
    "runtime": {"certs"},
    "store": {"certs"},
    "api": {"certs", "store", "runtime"},
    "service": {"certs", "acme", "runtime", "store", "api"},
    "cli": {"certs", "acme", "runtime", "store", "api", "service"},
    "testing": {"certs", "runtime", "store"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _product_files() -> list[Path]:
    return sorted(
        p
        for base in (PACKAGE, ROOT / "demo", ROOT / "bench")
        for p in base.rglob("*.py")
        if "__pycache__" not in p.parts
    )


@pytest.mark.parametrize("path", _product_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_never_imports_the_test_tree(path: Path) -> None:
    bad = {m for m in _imports(path) if m == "tests" or m.startswith("tests.")}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    assert not any(m == "agent" or m.startswith("agent.") for m in _imports(path))


def test_no_module_is_over_600_lines() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for base in (PACKAGE, ROOT / "bench")
        for p in base.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert len([p for p in sizes if p.startswith("agent/")]) > 30
    assert len([p for p in sizes if p.startswith("bench/")]) > 10
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_layers_import_only_the_layers_below() -> None:
    for layer, allowed in ALLOWED.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            for module in _imports(path):
                parts = module.split(".")
                if parts[0] != "certagent" or len(parts) < 2 or parts[1] in ("errors", "config"):
                    continue
                other = parts[1]
                assert other == layer or other in allowed, (
                    f"{path.relative_to(ROOT)} ({layer}) imports {module}"
                )


def test_the_readme_layout_section_matches_the_tree() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `certagent\.(\w+)` \|", section, flags=re.M))
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert listed == packages
    assert listed == set(ALLOWED)
    # every module (or subpackage) the cold-SNI walk names exists
    for module in re.findall(r"`((?:service|store|runtime|certs|api|cli)(?:\.\w+)+)`", section):
        path = PACKAGE / module.replace(".", "/")
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), module


def test_no_caller_outside_the_store_asks_which_store_it_has() -> None:
    """Callers use the store's roles; only ``certagent.store`` knows its implementations."""
    asking = re.compile(r"isinstance\([^)]*\b(RedisStore|DirectoryStore)\b")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts and (PACKAGE / "store") not in p.parents
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if asking.search(line)
    ]
    assert found == []


def test_test_modules_have_unique_names_and_unit_tests_mirror_the_package() -> None:
    tests = ROOT / "tests"
    names = [p.name for p in tests.rglob("test_*.py") if "__pycache__" not in p.parts]
    assert len(names) > 50
    assert sorted({n for n in names if names.count(n) > 1}) == []
    unit = tests / "unit"
    folders = {p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    # every folder of tests/unit is a subpackage of certagent, or the bench
    assert folders - packages <= {"bench"}, folders - packages
