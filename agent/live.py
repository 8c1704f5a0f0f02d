"""Live changes: apply every store write to what HAProxy holds, on every agent.

The store's change feed (a Redis stream, or directory polling) says which
record changed and which names it had before and after.  For each loaded slot
those names touch, the agent asks the store again and then, per slot:

* the slot's certificate is still the one for its hosts: nothing;
* a newer certificate for the same hosts (a rotation): ``set`` + ``commit`` it
  into the same slot, so no connection ever sees a gap;
* no certificate any more (a deletion): hosts leave the map, the slot gets the
  placeholder and becomes free;
* hosts whose set of certificates changed in another way (an RSA certificate
  added next to an ECDSA one, names moved between records) leave the map, and
  their next connection loads what the store now says.

The feed position survives a lost Redis connection, so writes missed meanwhile
are replayed; if the feed cannot replay them (trimmed), every slot is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from agent.ensure import NegativeCache
from agent.errors import AgentError, ChangesLost, StoreError
from agent.hostname import covers
from agent.loader import Loader
from agent.pool import Slot, SlotPool
from agent.store.base import Change, Store, StoredCertificate

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
RETRY_MAX = 2.0


@dataclass
class LiveCounters:
    changes: int = 0
    rotated: int = 0
    unloaded: int = 0
    unmapped: int = 0
    reconciles: int = 0
    feed_errors: int = 0


class LiveUpdater:
    def __init__(
        self, store: Store, loader: Loader, negative: NegativeCache, *, deadline: float = 5.0
    ) -> None:
        self.store = store
        self.loader = loader
        self.negative = negative
        self.deadline = deadline
        self.counters = LiveCounters()
        self.position: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the change feed until ``stop`` is set."""
        delay = 0.1
        while not stop.is_set():
            try:
                if self.position is None:
                    _, self.position = await self.store.changes(None, 0)
                    await self.reconcile(self.loader.pool.slots)
                changes, self.position = await self.store.changes(self.position, POLL_SECONDS)
                if changes:
                    await self.apply(changes)
                delay = 0.1
            except ChangesLost as exc:
                log.warning("store change feed lost our position (%s); checking every slot", exc)
                self.position = None
            except StoreError as exc:
                self.counters.feed_errors += 1
                log.warning("store change feed: %s; retrying in %.1fs", exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, RETRY_MAX)

    async def apply(self, changes: Iterable[Change]) -> None:
        ids: set[str] = set()
        names: set[str] = set()
        for change in changes:
            self.counters.changes += 1
            ids.add(change.id)
            names.update(change.names)
        if any(n.startswith("*.") for n in names):
            self.negative.clear()
        for name in names:
            self.negative.discard(name)
        touched = [
            s
            for s in self.loader.pool.slots
            if s.cert_id in ids or any(covers(n, h) for h in s.hosts for n in names)
        ]
        await self.reconcile(touched)

    async def reconcile(self, slots: Iterable[Slot]) -> None:
        """Bring ``slots`` in line with what the store says now for their hosts."""
        self.counters.reconciles += 1
        for slot in list(slots):
            try:
                await self._reconcile_slot(slot)
            except AgentError as exc:
                log.error("applying a store change to %s failed: %s", slot.name, exc)

    async def _reconcile_slot(self, slot: Slot) -> None:
        if self.loader.pool.get(slot.name) is not slot:
            return  # recycled or reset meanwhile
        hosts = sorted(slot.hosts)
        now: dict[str, tuple[StoredCertificate, ...]] = {}
        for host in hosts:
            now[host] = await self.store.lookup_all(host)
        if not hosts:
            if slot.cert_id is not None and await self.store.get(slot.cert_id) is None:
                await self._unload(slot)
            return
        if all(any(c.bundle.fingerprint_sha1 == slot.fingerprint for c in now[h]) for h in hosts):
            await self._unmap_changed(slot, now)
            return
        successor = _successor(slot, now, self.loader.pool)
        if successor is None:
            await self._unload(slot)
            return
        if await self.loader.replace(slot.name, successor, self.deadline):
            self.counters.rotated += 1
            log.info(
                "rotated %s in %s for %s", successor.id, slot.name, " ".join(sorted(slot.hosts))
            )
        await self._unmap_changed(slot, now)

    async def _unload(self, slot: Slot) -> None:
        hosts = " ".join(sorted(slot.hosts)) or "no host"
        if await self.loader.unload(slot.name, self.deadline):
            self.counters.unloaded += 1
            log.info("unloaded %s (%s): its certificate left the store", slot.name, hosts)

    async def _unmap_changed(
        self, slot: Slot, now: dict[str, tuple[StoredCertificate, ...]]
    ) -> None:
        """Unmap hosts whose certificates differ from the slots serving them."""
        for host, certs in now.items():
            served = {s.fingerprint for s in self.loader.pool.for_host(host)}
            if served and served != {c.bundle.fingerprint_sha1 for c in certs}:
                await self.loader.unmap(host, self.deadline)
                self.counters.unmapped += 1


def _successor(
    slot: Slot, now: dict[str, tuple[StoredCertificate, ...]], pool: SlotPool
) -> StoredCertificate | None:
    """The certificate to put into ``slot`` in place, or None to unload it.

    The same record's new version if it still exists (a rotation); otherwise
    (an adopted slot, or names moved to another record) a certificate for all
    of the slot's hosts that no other slot holds yet.
    """
    candidates = [c for certs in now.values() for c in certs]
    for c in candidates:
        if slot.cert_id is not None and c.id == slot.cert_id:
            return c
    for c in candidates:
        if all(c in certs for certs in now.values()) and (
            pool.for_fingerprint(c.bundle.fingerprint_sha1) in (None, slot)
        ):
            return c
    return None
