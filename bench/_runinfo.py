"""What every bench records about its run: the machine, the revision, where results go."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from certagent.testing import HAPROXY

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


def say(msg: str) -> None:
    """Progress, on stderr (stdout carries only a bench's JSON)."""
    print(msg, file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """CPUs, memory, kernel and the versions of HAProxy, Redis and Python."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])

    def first_line(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return "?"
        return (out.stdout or out.stderr).splitlines()[0].strip()

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "mem_total_gb": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        # the build the harness starts: $CERTAGENT_TEST_HAPROXY, else PATH's
        "haproxy": " ".join(first_line([HAPROXY, "-v"]).split()[:3]),
        "redis": " ".join(first_line(["redis-server", "--version"]).split()[:3]),
        "python": platform.python_version(),
    }


def fresh_path(out: Path, stem: str, suffix: str) -> Path:
    """``out/stem.suffix``, or ``stem-2``, ``-3``... : never an existing file.

    Every bench writes its results through this: a result once written is history
    and is never overwritten.
    """
    n = 1
    while True:
        path = out / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
        if not path.exists() and not path.with_suffix(".md").exists():
            return path
        n += 1


def run_meta() -> dict[str, Any]:
    """What every bench result's ``meta`` starts with: UTC date, revision, machine."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "revision": git_revision(),
        "machine": machine(),
    }


def write_results(out: Path, stem: str, text: str, markdown: str | None = None) -> Path:
    """Write a bench's JSON ``text`` (and its ``markdown`` report beside it) to a fresh path.

    ``out/stem.json`` (and ``.md``), or ``stem-2``... (:func:`fresh_path`): never over an
    earlier result.  Returns the JSON file's path.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = fresh_path(out, stem, ".json")
    path.write_text(text + "\n")
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown)
    return path


def publish(
    result: dict[str, Any],
    out: Path,
    stem: str,
    markdown: str | None = None,
    *,
    sort_keys: bool = False,
) -> Path:
    """Print a bench's ``result`` as JSON and write it (and ``markdown``) with
    :func:`write_results`; returns the JSON file's path."""
    text = json.dumps(result, indent=2, sort_keys=sort_keys)
    print(text)
    return write_results(out, stem, text, markdown)


def git_revision() -> str:
    """The checked-out commit, ``+dirty`` if agent/ has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "agent")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
