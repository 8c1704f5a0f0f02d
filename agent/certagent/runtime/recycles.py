"""Recycled hosts that come back: what HTTP/3 clients holding an Alt-Svc for them meet.

A client learns ``Alt-Svc: h3=...; ma=N`` from a response and, for N seconds,
tries HTTP/3 first.  QUIC connections go straight to fe_tls, with no agent on
the way: if the host's slot was recycled meanwhile, the client gets the default
certificate, fails that handshake and comes back over TCP, which loads the
host again.  HAProxy cannot say for which host a QUIC handshake failed (it
counts them per frontend), so the agent counts the other half here: hosts
loaded again within ``window`` seconds of losing their slot.  It also keeps
how long recycled slots had been idle, the figure ``http3_max_age`` is chosen
from (docs/haproxy.md#http3).

Pure bookkeeping, O(1) per recycle and per load; memory bounded by ``keep``.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

#: Recycled hosts remembered at most (the oldest are forgotten first).
KEEP = 10_000
#: Idle times of the latest recycles kept for the status.
IDLE_KEPT = 256


class RecycleLog:
    """Hosts that lost their slot lately, and the idle time of the slots recycled."""

    def __init__(self, window: float, keep: int = KEEP) -> None:
        self.window = window
        self.keep = keep
        self.returns = 0  # hosts loaded again within ``window`` of losing their slot
        self._gone: OrderedDict[str, float] = OrderedDict()  # host -> when its slot went
        self._idle: deque[float] = deque(maxlen=IDLE_KEPT)

    def recycled(self, hosts: Iterable[str], idle: float, now: float) -> None:
        """A slot serving ``hosts``, unused for ``idle`` seconds, gets another certificate."""
        self._idle.append(max(0.0, idle))
        if self.window <= 0:
            return
        for host in hosts:
            self._gone[host] = now
            self._gone.move_to_end(host)
        while len(self._gone) > self.keep:
            self._gone.popitem(last=False)

    def loaded(self, host: str, now: float) -> bool:
        """``host`` is loaded again: True (and counted) if it lost a slot within the window."""
        gone = self._gone.pop(host, None)
        if gone is None or now - gone > self.window:
            return False
        self.returns += 1
        return True

    def status(self) -> dict[str, Any]:
        """Returns counted, and the idle time of the latest recycled slots (s)."""
        idle = sorted(self._idle)
        return {
            "returns": self.returns,
            "window_s": self.window,
            "recycled_idle_s": {
                "recycles": len(idle),
                "min": round(idle[0], 3) if idle else None,
                "p10": round(idle[len(idle) // 10], 3) if idle else None,
                "median": round(statistics.median(idle), 3) if idle else None,
            },
        }
