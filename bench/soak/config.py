"""The soak's settings (from the command line) and its fault schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: on-demand names: ``d000042.ondemand.soak.test`` (the permission policy allows this suffix)
ONDEMAND_SUFFIX = "ondemand.soak.test"
#: imported names: ``i000042.imported.soak.test`` (stored before the nodes start)
IMPORTED_SUFFIX = "imported.soak.test"


def ondemand_host(i: int) -> str:
    return f"d{i:06d}.{ONDEMAND_SUFFIX}"


def imported_host(i: int) -> str:
    return f"i{i:06d}.{IMPORTED_SUFFIX}"


@dataclass(frozen=True)
class Faults:
    """Seconds between faults of each kind (0: never) and how long the CA stays down."""

    kill_every: float = 180.0  # SIGKILL an agent (alternating nodes), restart it at once
    ca_every: float = 420.0  # stop pebble ...
    ca_down: float = 40.0  # ... for this long
    reload_every: float = 300.0  # SIGUSR2 to a node's HAProxy master (alternating nodes)
    failover_every: float = 360.0  # kill the Redis primary (with --sentinel only)

    @classmethod
    def off(cls) -> Faults:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class SoakConfig:
    minutes: float
    nodes: int = 2
    names: int = 200  # on-demand names (issued on first connection)
    imported: int = 200  # imported certificates (a test CA, long-lived)
    capacity: int = 150  # slots per node, below names + imported so slots recycle
    lifetime: int = 300  # pebble's certificate validity, seconds
    clients: int = 3  # verifying client threads
    pause: float = 0.0  # seconds each client sleeps between handshakes
    sample_every: float = 10.0  # process samples
    sentinel: bool = False
    faults: Faults | None = None  # None: no faults

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["faults"] = asdict(self.faults) if self.faults is not None else None
        return out


def schedule(every: float, duration: float, offset: float = 0.0) -> list[float]:
    """Seconds into the run at which a fault of period ``every`` fires: every, 2*every, ...

    ``offset`` shifts them all (faults of different kinds do not land on the same second).
    """
    if every <= 0:
        return []
    times = []
    t = every + offset
    while t < duration:
        times.append(t)
        t += every
    return times
