"""From /proc, for every bench: a process's on-CPU time and peak RSS, the machine's CPU."""

from __future__ import annotations

from pathlib import Path


def schedstat_ns(pid: int) -> int:
    """On-CPU nanoseconds of every thread of ``pid`` (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def hwm_kb(pid: int) -> int:
    """VmHWM (peak RSS) of ``pid`` in KiB; 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0  # it has just exited: the samples before hold its peak
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU of the machine, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)
