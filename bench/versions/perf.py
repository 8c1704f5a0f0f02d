"""``perf record`` of HAProxy's worker while a storm runs: where its CPU goes, by library.

Flat sampling (no call graph: cheap enough not to change what it measures much);
the report gives each shared object's share of the samples and the top symbols.
Debian's haproxy binaries are stripped, so HAProxy's own time shows as one object.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s*$")


@contextlib.contextmanager
def recording(pid: int, out: Path, into: dict[str, Any]) -> Iterator[None]:
    """Sample ``pid`` at 999 Hz while the block runs; ``into`` gets the summary (or why not)."""
    perf = shutil.which("perf")
    if perf is None:
        into["skipped"] = "no perf on PATH"
        yield
        return
    proc = subprocess.Popen(
        [perf, "record", "-F", "999", "-p", str(pid), "-o", str(out), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # this PID only: perf writes its file and exits
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    if proc.returncode not in (0, -signal.SIGINT) or not out.exists():
        into["skipped"] = f"perf record exited {proc.returncode}: {err.decode()[-300:]}"
        return
    into["by_object_pct"] = _report(perf, out, "dso", 1.0)
    into["top_symbols_pct"] = dict(list(_report(perf, out, "dso,sym", 2.0).items())[:10])


def _report(perf: str, data: Path, sort: str, limit: float) -> dict[str, float]:
    out = subprocess.run(
        [perf, "report", "-i", str(data), "--stdio", "--sort", sort, "--percent-limit", str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    shares: dict[str, float] = {}
    for line in out.splitlines():
        found = None if line.startswith("#") else _LINE.match(line)
        if found:
            shares[" ".join(found[2].split())] = float(found[1])
    return shares
