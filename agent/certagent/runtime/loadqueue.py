"""What waits in the loader's queues (load requests and their priority), and its counters."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from certagent.certs.stored import StoredCertificate
from certagent.errors import AgentError
from certagent.runtime.pool import Slot


class Priority(IntEnum):
    """Which queue a load waits in; clients are always served first."""

    CLIENT = 0
    REWARM = 1


@dataclass
class LoadRequest:
    """One host waiting for its certificates to be loaded and marked."""

    host: str
    certs: tuple[StoredCertificate, ...]
    future: asyncio.Future[tuple[Slot, ...]]
    started: bool = False

    @property
    def fingerprints(self) -> set[str]:
        return {c.bundle.fingerprint_sha1 for c in self.certs}


def retrieve(future: asyncio.Future[tuple[Slot, ...]]) -> None:
    """Mark an outcome as seen: a client that gave up (Busy) no longer awaits it."""
    if not future.cancelled():
        future.exception()


def has_failed(future: asyncio.Future[tuple[Slot, ...]]) -> bool:
    return not future.cancelled() and future.exception() is not None


def fail_all(requests: Sequence[LoadRequest], error: AgentError) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


@dataclass
class LoadCounters:
    loads: int = 0
    recycles: int = 0
    mark_only: int = 0  # hosts marked in a slot already loaded (e.g. a wildcard), no load
    remarks: int = 0
    failures: int = 0
    rotations: int = 0
    unloads: int = 0
    adoptions: int = 0
    resets: int = 0
    busy: int = 0
    recoveries: int = 0  # reloads asked for to clear a transaction no command may touch
    staples: int = 0  # OCSP responses stapled onto loaded certificates
