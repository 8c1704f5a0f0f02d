"""TLS session-ticket keys: one ring for the fleet, rotated on schedule, pushed into HAProxy.

The ring of record lives in the store (:meth:`Store.ticket_ring
<certagent.store.base.Store.ticket_ring>`: Redis keeps one shared by every agent
on it; a directory of PEM files cannot, so it lives in a local file beside
HAProxy's, :class:`~certagent.store.directory.LocalRing`).  The keeper:

* at start, loads the ring (creating it, or rotating it if due) and writes
  HAProxy's ``tls-ticket-keys`` file, so a reload or restart of HAProxy starts
  with the fleet's keys;
* on every new HAProxy session (start, reload, reconnect), compares ``show
  tls-keys`` with the ring and pushes the missing keys (``set ssl tls-key``),
  through the loader: the socket's single writer;
* rotates when due (one agent at a time: the store's lock; every agent's timer
  fires a little after the due time, so the first one rotates and the others
  find it done), and follows the store's ``tls-keys`` events.

Costs O(1) per rotation and per HAProxy session, whatever the number of
certificates; one timer per agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from certagent.certs.ticketkeys import TicketRing, fresh_key, keys_file, new_ring, pushes
from certagent.errors import AgentError, RotationInProgress, StoreError
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient
from certagent.runtime.loader import Loader
from certagent.store.base import RingStore
from certagent.store.directory import atomic_write

__all__ = ["RingStore", "TicketCounters", "TicketKeeper"]

log = logging.getLogger(__name__)

#: Each agent's timer fires this many seconds after the due time at most (random), so
#: one rotates and the others find it done.
JITTER = 5.0
#: After a failed rotation or store read, try again this much later.
RETRY = 30.0
#: At start, while another agent holds the rotation lock (nodes started together, e.g. by
#: docker-compose), read the ring again this often, this many times: its rotation takes
#: milliseconds, and waiting RETRY instead left this node's HAProxy without the fleet's keys
#: (sessions from the other nodes did not resume) for half a minute.
BUSY_WAIT = 0.5
BUSY_TRIES = 20


@dataclass
class TicketCounters:
    rotations: int = 0  # rotations this agent made
    refreshes: int = 0  # rings loaded after another agent's rotation
    pushed: int = 0  # keys sent to HAProxy (set ssl tls-key)
    errors: int = 0


class TicketKeeper:
    def __init__(
        self,
        store: RingStore,
        keys_path: Path,
        interval: float,
        loader: Loader,
        *,
        deadline: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.keys_path = keys_path
        self.interval = interval
        self.loader = loader
        self.deadline = deadline
        self.counters = TicketCounters()
        self.ring: TicketRing | None = None
        #: False once HAProxy showed no ticket-key file of ours (haproxy.cfg lacks it).
        self.in_haproxy: bool | None = None
        self._clock = clock
        self._warned = False

    def status(self) -> dict[str, object]:
        ring = self.ring
        return {
            "store": self.store.describe(),
            "generation": None if ring is None else ring.generation,
            "rotated_at": None if ring is None else round(ring.rotated_at),
            "next_rotation": None if ring is None else round(ring.due(self.interval)),
            "interval": self.interval,
            "in_haproxy": self.in_haproxy,
            **vars(self.counters),
        }

    # --- the ring -------------------------------------------------------------------

    async def start(self) -> None:
        """Load the ring (make it, or rotate it if due) and write HAProxy's keys file."""
        ring = await self.store.load()
        if ring is None or self._clock() >= ring.due(self.interval):
            ring = await self._rotate(ring, force=False)
        self._adopt(ring)

    async def start_quietly(self) -> None:
        """:meth:`start`, logging a store that cannot answer yet (:meth:`run` retries).

        Another agent rotating at this moment is waited out (at most ``BUSY_TRIES`` x
        ``BUSY_WAIT`` seconds): its ring is the one to start with.
        """
        for _ in range(BUSY_TRIES):
            try:
                await self.start()
                return
            except RotationInProgress:
                await asyncio.sleep(BUSY_WAIT)
            except StoreError as exc:
                self.counters.errors += 1
                log.warning("ticket keys: %s; retrying in %.0fs", exc, RETRY)
                return
        self.counters.errors += 1
        log.warning(
            "ticket keys: another agent held the rotation lock for %.0fs; retrying in %.0fs",
            BUSY_TRIES * BUSY_WAIT,
            RETRY,
        )

    async def rotate_now(self) -> TicketRing:
        """Rotate at once (``certagent tls-keys rotate``) and push the new ring."""
        ring = await self._rotate(self.ring, force=True)
        self._adopt(ring)
        await self.push()
        return ring

    async def refresh(self) -> None:
        """Load the ring from the store (another agent rotated it) and push it if it changed.

        A store that lost the ring (Redis restarted empty) gets this agent's back,
        so the fleet keeps resuming sessions.
        """
        ring = await self.store.load()
        if ring is None and self.ring is not None:
            where = self.store.describe()
            log.warning("the store %s lost the ticket-key ring; writing ours back", where)
            kept = self.ring
            ring = await self.store.rotate(None, lambda _: kept)
        if ring is None or ring == self.ring:
            return
        self.counters.refreshes += 1
        self._adopt(ring)
        await self.push()

    async def _rotate(self, seen: TicketRing | None, *, force: bool) -> TicketRing:
        now = round(self._clock(), 3)  # as the store keeps it, so rings compare equal

        def make(current: TicketRing | None) -> TicketRing:
            base = current or self.ring
            if base is None:
                return new_ring(now)
            if not force and now < base.due(self.interval):
                return base  # rotated meanwhile (a store that lost it gets ours back)
            return base.rotated(fresh_key(), now)

        ring = await self.store.rotate(None if seen is None else seen.generation, make)
        if seen is None or ring.generation != seen.generation:
            self.counters.rotations += 1
        return ring

    def _adopt(self, ring: TicketRing) -> None:
        """Make ``ring`` ours and HAProxy's keys file (read at HAProxy's next start or reload)."""
        if ring == self.ring:
            return
        try:
            atomic_write(self.keys_path.parent, self.keys_path.name, keys_file(ring))
        except OSError as exc:
            raise StoreError(
                f"cannot write HAProxy's ticket-key file {self.keys_path}: {exc}"
            ) from exc
        self.ring = ring

    # --- HAProxy --------------------------------------------------------------------

    async def sync(self, client: RuntimeClient) -> None:
        """Make HAProxy hold the ring: the loader's hook for every new HAProxy session."""
        ring = self.ring
        if ring is None:
            return
        path = str(self.keys_path)
        held = protocol.parse_show_tls_keys(await client.execute(protocol.show_tls_keys(path)))
        if held is None:
            self.in_haproxy = False
            if not self._warned:
                self._warned = True
                log.warning(
                    "HAProxy has no ticket-key file %s: sessions will not resume across nodes"
                    " or reloads; add 'tls-ticket-keys %s' to fe_tls's bind (re-run"
                    " certagent init for a current haproxy.cfg)",
                    path,
                    path,
                )
            return
        keys = pushes(held, ring)
        if keys:
            commands = [protocol.set_tls_key(path, key) for key in keys]
            for reply in await client.pipeline(commands):
                protocol.check_set_tls_key(path, reply)
            self.counters.pushed += len(keys)
            log.info(
                "HAProxy now holds ticket-key generation %d (%d keys sent)",
                ring.generation,
                len(keys),
            )
        self.in_haproxy = True

    async def push(self) -> None:
        """Push the ring into HAProxy now, through the loader (the socket's one writer)."""
        try:
            await self.loader.exclusive(self.sync, self.deadline, "pushing ticket keys")
        except AgentError as exc:
            self.counters.errors += 1
            log.warning("pushing ticket keys into HAProxy failed: %s; retried on reconnect", exc)

    # --- schedule -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Rotate when due, until ``stop`` is set; one timer, whatever the fleet's size."""
        while not stop.is_set():
            wait = RETRY
            if self.ring is not None:
                wait = max(0.0, self.ring.due(self.interval) - self._clock())
                wait += random.uniform(0.0, JITTER)  # noqa: S311 - spreading, not secrecy
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if stop.is_set():
                return
            try:
                if self.ring is None or self._clock() >= self.ring.due(self.interval):
                    ring = await self._rotate(self.ring, force=False)
                    if ring != self.ring:
                        self._adopt(ring)
                        await self.push()
                else:
                    await self.refresh()
            except RotationInProgress:
                await asyncio.sleep(1.0)
                await self.refresh_quietly()
            except AgentError as exc:
                self.counters.errors += 1
                log.warning("ticket-key rotation failed: %s; retrying in %.0fs", exc, RETRY)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY)

    async def refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except AgentError as exc:
            self.counters.errors += 1
            log.warning("reading the ticket-key ring failed: %s", exc)
