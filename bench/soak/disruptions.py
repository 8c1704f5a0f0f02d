"""Disruption windows (agent down, HAProxy reload, CA down, Redis failover) and lookups.

A window opens *before* its fault is done and closes once the system says it is back
(the restarted agent answers with HAProxy's state adopted, the new HAProxy worker
listens, pebble's directory answers, a replica is promoted), so a handshake that
overlaps a fault in any way is counted under it.  Windows of a node apply to that
node's handshakes; fleet-wide ones (CA, Redis) to every node's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

AGENT_DOWN = "agent_down"
HAPROXY_RELOAD = "haproxy_reload"
CA_DOWN = "ca_down"
REDIS_FAILOVER = "redis_failover"
NONE = "none"
#: when windows overlap, a handshake counts under the first kind listed here
PRIORITY = (AGENT_DOWN, REDIS_FAILOVER, HAPROXY_RELOAD, CA_DOWN)
KINDS = (NONE, *PRIORITY)


@dataclass
class Window:
    kind: str
    node: int | None  # None: the whole fleet
    start: float  # time.time()
    end: float | None = None
    note: str = ""

    def overlaps(self, node: int, start: float, end: float) -> bool:
        if self.node is not None and self.node != node:
            return False
        return self.start <= end and (self.end is None or self.end >= start)

    def as_dict(self, t0: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "start_s": round(self.start - t0, 2),
            "end_s": None if self.end is None else round(self.end - t0, 2),
            "seconds": None if self.end is None else round(self.end - self.start, 2),
            "note": self.note,
        }


class Disruptions:
    """Every window of the run; thread-safe (fault threads write, client threads read).

    Lookups scan the windows, newest first: a run has tens of them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: list[Window] = []

    def open(self, kind: str, node: int | None, note: str = "") -> Window:
        window = Window(kind, node, time.time(), note=note)
        with self._lock:
            self._windows.append(window)
        return window

    def close(self, window: Window, note: str = "") -> None:
        with self._lock:
            window.end = time.time()
            if note:
                window.note = f"{window.note}; {note}" if window.note else note

    def during(self, node: int, start: float, end: float) -> str:
        """The disruption a handshake on ``node`` from ``start`` to ``end`` overlapped."""
        with self._lock:
            kinds = {w.kind for w in self._windows if w.overlaps(node, start, end)}
        for kind in PRIORITY:
            if kind in kinds:
                return kind
        return NONE

    def windows(self) -> list[Window]:
        with self._lock:
            return list(self._windows)
