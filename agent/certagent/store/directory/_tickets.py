"""The session-ticket key ring of a node whose store cannot share one: a local JSON file.

A directory of PEM files is not a place agents share, so its ring lives beside
HAProxy's ``tls-ticket-keys`` file (``ring.json``, mode 0600).  One agent per
HAProxy owns it, so no lock: sessions resume across reloads of this node, not
across nodes (a fleet needs a shared store: Redis).  O(1) per call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from certagent.certs.ticketkeys import TicketRing, parse_key
from certagent.errors import StoreCorrupt, StoreError
from certagent.store.directory._files import atomic_write

__all__ = ["LocalRing"]

log = logging.getLogger(__name__)


class LocalRing:
    """The ring in a local JSON file (mode 0600); a :class:`~certagent.store.base.RingStore`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def describe(self) -> str:
        return str(self.path)

    async def load(self) -> TicketRing | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read the ticket-key ring {self.path}: {exc}") from exc
        try:
            data = json.loads(raw)
            keys = tuple(parse_key(str(k)) for k in data["keys"])
            return TicketRing(int(data["generation"]), keys, float(data["rotated_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreCorrupt(
                f"the ticket-key ring {self.path} is malformed ({exc});"
                " delete it to start a new one"
            ) from exc

    async def rotate(
        self, expected: int | None, make: Callable[[TicketRing | None], TicketRing]
    ) -> TicketRing:
        current = await self.load()
        if current is not None and current.generation != expected:
            return current
        ring = make(current)
        data = {"generation": ring.generation, "rotated_at": ring.rotated_at, "keys": ring.keys}
        try:
            atomic_write(self.path.parent, self.path.name, json.dumps(data).encode() + b"\n")
        except OSError as exc:
            raise StoreError(f"cannot write the ticket-key ring {self.path}: {exc}") from exc
        log.info("ticket keys rotated to generation %d", ring.generation)
        return ring
