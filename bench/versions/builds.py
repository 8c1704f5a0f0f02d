"""Which HAProxy builds a run compares: ``LABEL=PATH`` options, or the defaults found here."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from certagent.runtime.build import parse_build

#: Where scripts/haproxy-versions.sh keeps Debian's newer builds, and the suites used.
CACHE = Path(os.environ.get("CERTAGENT_HAPROXY_CACHE", "/var/cache/certagent/haproxy"))
SUITES = ("trixie", "sid")  # HAProxy 3.0 and 3.2


@dataclass(frozen=True)
class Build:
    label: str  # "2.6", "3.2", or what --haproxy named it
    path: str
    describe: str  # version, OpenSSL and Lua, from `haproxy -vv`
    lua: str | None
    # a variant (--global, --build-env): lines added to the generated configuration's
    # global section, settings for this build's agent
    global_lines: tuple[str, ...] = ()
    agent_env: tuple[tuple[str, str], ...] = ()
    # --preload: no certagent; every certificate preloaded on a plain TLS bind (the floor)
    preload: bool = False
    # --build-nice: the agent's CPU priority below HAProxy's (bench/versions/lower.py)
    agent_nice: str | None = None
    # --build-agent: the agent's code from another checkout (its ``agent`` folder, first
    # on the agent's PYTHONPATH), e.g. the revision before a change, in the same run
    agent_source: str | None = None


def probe(label: str | None, path: str) -> Build:
    """``path``'s build from ``haproxy -vv``; ``label`` defaults to its branch ("3.2")."""
    try:
        out = subprocess.run([path, "-vv"], capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"bench.versions: {path} -vv failed: {exc}") from exc
    build = parse_build(out.stdout.decode("utf-8", "replace"))
    branch = ".".join(str(n) for n in build.branch)
    return Build(label or branch, path, build.describe(), build.lua)


def parse_option(value: str) -> tuple[str | None, str]:
    """``"3.2=/path/haproxy"`` or a bare path (labelled by its branch)."""
    label, sep, path = value.partition("=")
    return (label, path) if sep else (None, value)


def add_global_lines(cfg: Path, lines: tuple[str, ...]) -> None:
    """Insert ``lines`` right after the generated configuration's ``global`` line."""
    if not lines:
        return
    text = cfg.read_text()
    head, sep, tail = text.partition("\nglobal\n")
    if not sep:
        raise SystemExit(f"bench.versions: no global section in {cfg}")
    cfg.write_text(head + sep + "".join(f"    {line}\n" for line in lines) + tail)


def default_builds() -> list[Build]:
    """PATH's haproxy (Debian 12: 2.6), then each cached suite whose build is ready."""
    system = shutil.which("haproxy") or "/usr/sbin/haproxy"
    found = [probe(None, system)]
    for suite in SUITES:
        binary = CACHE / suite / "bin" / "haproxy"
        if (CACHE / suite / "ready").exists() and binary.exists():
            found.append(probe(None, str(binary)))
    return found


def config_digest(cfg: Path, port: int, run_dir: Path) -> str:
    """sha256 of a generated haproxy.cfg with its port and run directory blanked: equal
    digests mean the builds ran the same configuration (``DIR``: the init directory)."""
    text = cfg.read_text().replace(str(run_dir), "RUN_DIR").replace(str(cfg.parent), "DIR")
    text = re.sub(rf"\b{port}\b", "PORT", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
