"""What ``GET /v1/loaded`` reports: the certificates HAProxy holds right now."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from certagent.runtime.pool import Slot

__all__ = ["LoadedSlot", "loaded_slots"]


@dataclass(frozen=True)
class LoadedSlot:
    slot: str
    certificate_id: str | None
    hosts: tuple[str, ...]
    loaded_since: datetime | None
    #: connections to the slot's hosts still counted in HAProxy's usage table
    hits: int


def loaded_slots(
    slots: Iterable[Slot],
    hits_by_host: Mapping[str, int],
    *,
    now: datetime,
    monotonic_now: float,
) -> list[LoadedSlot]:
    """Describe the pool's ``slots`` (their ``loaded_at`` is on the monotonic clock).

    ``hits_by_host`` is :meth:`certagent.runtime.loader.Loader.hits_by_host`; ``now`` and
    ``monotonic_now`` are read together, to turn ``loaded_at`` into a wall time.
    """
    result = []
    for slot in sorted(slots, key=lambda s: s.name):
        since = (
            now - timedelta(seconds=max(0.0, monotonic_now - slot.loaded_at))
            if slot.loaded_at > 0
            else None
        )
        result.append(
            LoadedSlot(
                slot=slot.name,
                certificate_id=slot.cert_id,
                hosts=tuple(sorted(slot.hosts)),
                loaded_since=since,
                hits=sum(hits_by_host.get(host, 0) for host in slot.hosts),
            )
        )
    return result
