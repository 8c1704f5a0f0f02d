"""Compare the packages installed in an environment with a lock of requirements/.

Run with the environment's own Python (its ``importlib.metadata`` is what is compared):

    .venv/bin/python scripts/lockcheck.py requirements/test.txt           exit 1 unless equal
    .venv-latest/bin/python scripts/lockcheck.py --report requirements/test.txt
                                                                          list, exit 0
    .venv/bin/python scripts/lockcheck.py --extra requirements/test.txt   what to uninstall

A lock line ``name==version ; marker`` counts where its marker holds for this Python.
"Equal" is what ``pip freeze`` would show against the lock: the project itself and the
installer's own packages (pip, and setuptools/wheel unless the lock pins them) are left
out. Standard library only, plus ``packaging`` (pip's own copy where the environment has
none), so that it runs in any environment scripts/install.sh makes.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.utils import canonicalize_name
except ImportError:  # an environment with only the runtime lock: pip brings its own copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]

PROJECT = "certagent"
INSTALLER = {"pip", "setuptools", "wheel", "distribute"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked(path: Path) -> dict[str, str]:
    """Package -> version of every pin of ``path`` whose marker holds here."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker and not Marker(marker).evaluate():
            continue
        pins[canonicalize_name(name)] = version
    if not pins:
        raise SystemExit(f"lockcheck: {path} pins nothing: is it a lock of scripts/lock.sh?")
    return pins


def installed() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[canonicalize_name(name)] = dist.version
    return found


def differences(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    """One line per package that differs, sorted; empty when the environment is the lock."""
    lines = []
    for name in sorted(set(pins) | set(have)):
        if name == PROJECT:
            continue
        want, got = pins.get(name), have.get(name)
        if want == got:
            continue
        if want is None:
            if name in INSTALLER:
                continue
            lines.append(f"{name} {got}: installed, not in the lock")
        elif got is None:
            lines.append(f"{name}: the lock pins {want}, not installed")
        else:
            lines.append(f"{name}: the lock pins {want}, installed {got}")
    return lines


def extras(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    """Installed packages the lock does not pin (the project and the installer's aside)."""
    return sorted(set(have) - set(pins) - INSTALLER - {PROJECT})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lock", type=Path)
    parser.add_argument(
        "--report", action="store_true", help="list the differences and exit 0 (the canary)"
    )
    parser.add_argument(
        "--extra", action="store_true", help="print the installed packages the lock lacks"
    )
    args = parser.parse_args(argv)
    if args.extra:
        print(" ".join(extras(locked(args.lock), installed())))
        return 0
    lines = differences(locked(args.lock), installed())
    if args.report:
        print(f"{len(lines)} package(s) differ from {args.lock}")
        for line in lines:
            print(f"  {line}")
        return 0
    if lines:
        print(f"lockcheck: this environment is not {args.lock}:", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
