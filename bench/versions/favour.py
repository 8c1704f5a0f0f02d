"""``--favour``: the bench and every process it starts ahead of other sessions' work.

On this shared machine, other sessions' test suites and benches take most of the CPU at
times.  ``nice -n -20`` alone does not help: with autogroup scheduling (Linux's default,
``/proc/sys/kernel/sched_autogroup_enabled``) the CPU is first shared between sessions,
and nice only weighs processes within one.  HAProxy, the agent, Redis and the clients are
each started in a session of their own.  So a thread here gives the autogroup of this
process and of each descendant, as soon as it appears, the nice value -20
(``/proc/<pid>/autogroup``, root only): such a group weighs about 87 times a default one,
so other work gets the CPU only when the bench leaves it idle, while the bench's own
processes keep the normal scheduler among themselves (unlike ``--realtime``, whose
round-robin slices of 100 ms add to latencies).  Only our own processes are touched.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

NICE = -20
EVERY_S = 0.01  # a new process runs at the default weight for at most about this long


def _children(pid: int) -> list[int]:
    """Children of ``pid``'s main thread (every process here starts its children from it)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []  # it ended meanwhile


def _descendants(root: int) -> list[int]:
    found, todo = [], [root]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice value of ``pid``'s autogroup; None where the kernel shows none (a container
    or a kernel without autogroup scheduling: ``/proc/<pid>/autogroup`` missing or empty)."""
    try:
        words = Path(f"/proc/{pid}/autogroup").read_text().split()
    except FileNotFoundError:
        return None
    try:
        return int(words[-1]) if words else None
    except ValueError:
        return None


def set_autogroup_nice(pid: int, nice: int = NICE) -> bool:
    """False if the process is gone; PermissionError without root."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return True


class Favour:
    """While running: this process's autogroup and every descendant's at nice -20."""

    def __init__(self) -> None:
        self._before = 0  # this process's autogroup nice value, restored by stop()
        self._stop = threading.Event()
        self._done: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="favour", daemon=True)

    def start(self) -> Favour:
        try:
            before = autogroup_nice()
            if before is None:
                raise SystemExit(
                    "bench.versions: --favour needs autogroup scheduling "
                    "(/proc/self/autogroup is missing or empty here)"
                )
            self._before = before
            set_autogroup_nice(os.getpid())
        except PermissionError as exc:
            raise SystemExit(
                "bench.versions: --favour needs root (writes /proc/<pid>/autogroup)"
            ) from exc
        self._thread.start()
        return self

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.wait(EVERY_S):
            alive = _descendants(me)
            for pid in alive:
                if pid not in self._done and set_autogroup_nice(pid):
                    self._done.add(pid)
            self._done &= set(alive)  # a reused PID is a new process

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        set_autogroup_nice(os.getpid(), self._before)  # the session we were started from
