"""Live changes: apply every store write to what HAProxy holds, on every agent.

The store's change feed (a Redis stream, or directory change events) says which
record changed and which names it had before and after.  For each loaded slot
those names touch, the agent asks the store again and then, per slot:

* the slot's certificate is still the one for its hosts: nothing;
* a newer certificate for the same hosts (a rotation): ``set`` + ``commit`` it
  into the same slot, so no connection ever sees a gap;
* the record was deleted (a ``delete`` event): hosts are unmarked, the slot
  gets the placeholder and becomes free;
* hosts whose set of certificates changed in another way (an RSA certificate
  added next to an ECDSA one, names moved between records) are unmarked, and
  their next connection loads what the store now says.

**The store cannot cause an outage.**  A certificate is unloaded only on an
explicit ``delete`` event for its record.  A store that answers nothing for a
loaded host (Redis restarted empty, a FLUSHDB, a failover to an empty replica,
an unmounted directory) leaves the slot serving as it is: it is counted as an
orphan (``status``: ``live.orphans``) and logged once a minute, until the store
has it again (re-imported: nothing to do), an explicit delete unloads it, or
recycling picks it.  A burst of deletes that would unload more than
:data:`BURST_SHARE` of the loaded slots at once (and more than
:data:`BURST_MIN`) is held for ``unload_hold`` seconds with an ERROR alarm,
then each is checked against the store again: only those still gone unload.

The feed position survives a lost Redis connection, so writes missed meanwhile
are replayed; if the feed cannot replay them (trimmed, or a store that lost its
stream), every slot is checked, which rotates or keeps but never unloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from certagent.certs.hostname import covers
from certagent.config import DualCerts
from certagent.errors import AgentError, ChangesLost, StoreError
from certagent.runtime.loader import Loader
from certagent.runtime.pool import Slot, SlotPool
from certagent.service.ensure import NegativeCache, choose_kinds
from certagent.service.namefilter import NameFilter
from certagent.store.base import Change, Store, StoredCertificate

log = logging.getLogger(__name__)

# How long one change-feed call may wait for a write.  A store returns as soon as it has
# one (Redis: XREAD BLOCK, up to its MAX_BLOCK of 30 s), so this only bounds the wait at
# rest: each wake-up of the idle agent costs about 0.2 ms of CPU (asyncio, measured on
# 2 vCPUs with schedstat), which a 1 s wait spent every second.  Stopping cancels it.
WAIT_SECONDS = 30.0
RETRY_MAX = 2.0
#: Deletes that would unload more than this share of the loaded slots at once are held...
BURST_SHARE = 0.25
#: ... when they are more than this many.
BURST_MIN = 20
#: Orphans (loaded, but the store lacks them) are logged at most once per this many seconds.
ORPHAN_LOG_INTERVAL = 60.0


@dataclass
class LiveCounters:
    changes: int = 0
    rotated: int = 0
    unloaded: int = 0
    unmarked: int = 0
    reconciles: int = 0
    feed_errors: int = 0
    orphans: int = 0  # loaded slots kept although the store no longer has their certificate
    held: int = 0  # unloads held back by the burst guard, in total
    stapled: int = 0  # new OCSP responses stapled onto loaded certificates


@dataclass(frozen=True)
class Deleted:
    """What explicit ``delete`` events named: record ids and their names."""

    ids: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    def covers(self, slot: Slot) -> bool:
        """Whether a delete event was about ``slot``'s certificate."""
        if slot.cert_id is not None:
            return slot.cert_id in self.ids
        # an adopted slot whose record id is unknown: by its hosts
        return any(covers(n, h) for h in slot.hosts for n in self.names)


NOTHING_DELETED = Deleted()


class LiveUpdater:
    def __init__(
        self,
        store: Store,
        loader: Loader,
        negative: NegativeCache,
        *,
        deadline: float = 5.0,
        dual_certs: DualCerts = DualCerts.BOTH,
        names: NameFilter | None = None,
        on_tickets: Callable[[], Awaitable[None]] | None = None,
        on_loaded: Callable[[str, tuple[StoredCertificate, ...]], None] | None = None,
        on_issuance: Callable[[Change], Awaitable[None]] | None = None,
        unload_hold: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.dual_certs = dual_certs
        self.names = names
        self.loader = loader
        self.negative = negative
        self.deadline = deadline
        self.on_tickets = on_tickets
        #: told about every certificate swapped in (OCSP fetching): a host, the certificate
        self.on_loaded = on_loaded
        #: told about new certificates (``put``), challenges and registrations (issuance)
        self.on_issuance = on_issuance
        self.unload_hold = unload_hold
        self.counters = LiveCounters()
        self.position: str | None = None
        self._orphans: set[str] = set()  # slot names
        self._orphans_logged = float("-inf")
        self._clock = clock
        self._held: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the change feed until ``stop`` is set."""
        delay = 0.1
        try:
            while not stop.is_set():
                try:
                    if self.position is None:
                        _, self.position = await self.store.changes(None, 0)
                        await self.reconcile(self.loader.pool.slots)
                    if self.names is not None:
                        self.names.followed(self.position)  # its filter holds all up to here
                    changes, self.position = await self.store.changes(
                        self.position, WAIT_SECONDS
                    )
                    if changes:
                        await self.apply(changes)
                    delay = 0.1
                except ChangesLost as exc:
                    log.warning("change feed lost our position (%s); checking every slot", exc)
                    self.position = None
                    if self.names is not None:
                        self.names.invalidate()  # writes were missed: rebuild the name filter
                except StoreError as exc:
                    self.counters.feed_errors += 1
                    log.warning("store change feed: %s; retrying in %.1fs", exc, delay)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, RETRY_MAX)
        finally:
            for task in self._held:
                task.cancel()

    async def apply(self, changes: Iterable[Change]) -> None:
        ids: set[str] = set()
        names: set[str] = set()
        deleted_ids: set[str] = set()
        deleted_names: set[str] = set()
        tickets = False
        issuance: list[Change] = []
        for change in changes:
            self.counters.changes += 1
            if change.kind == "tls-keys":
                tickets = True
                continue
            if change.kind in ("challenge", "domain"):  # issuance's, not a certificate's
                issuance.append(change)
                continue
            if change.kind == "put":
                issuance.append(change)
            ids.add(change.id)
            names.update(change.names)
            if change.kind == "delete":
                deleted_ids.add(change.id)
                deleted_names.update(change.names)
            if self.names is not None and change.kind == "put":
                self.names.add(change.names)
        if tickets and self.on_tickets is not None:
            await self.on_tickets()
        if self.on_issuance is not None:
            for change in issuance:
                await self._tell_issuance(change)
        if any(n.startswith("*.") for n in names):
            self.negative.clear()
        for name in names:
            self.negative.discard(name)
        touched = [
            s
            for s in self.loader.pool.slots
            if s.cert_id in ids or any(covers(n, h) for h in s.hosts for n in names)
        ]
        await self.reconcile(touched, Deleted(frozenset(deleted_ids), frozenset(deleted_names)))

    async def _tell_issuance(self, change: Change) -> None:
        """Hand a change to on-demand issuance; its failure never stops the feed."""
        assert self.on_issuance is not None
        try:
            await self.on_issuance(change)
        except AgentError as exc:
            log.warning("issuance: applying the %s change for %s: %s", change.kind,
                        " ".join(change.names) or change.id, exc)

    async def reconcile(self, slots: Iterable[Slot], deleted: Deleted = NOTHING_DELETED) -> None:
        """Bring ``slots`` in line with what the store says now for their hosts.

        Only slots whose record ``deleted`` names are unloaded; a burst of them
        is held back (:meth:`_guard`).
        """
        self.counters.reconciles += 1
        slots = list(slots)
        deleted = self._guard(slots, deleted)
        for slot in slots:
            try:
                await self._reconcile_slot(slot, deleted)
            except AgentError as exc:
                log.error("applying a store change to %s failed: %s", slot.name, exc)
        self._log_orphans()

    def _guard(self, slots: list[Slot], deleted: Deleted) -> Deleted:
        """``deleted`` minus a burst that would unload too much at once (held, alarmed)."""
        doomed = [s for s in slots if deleted.covers(s)]
        limit = max(BURST_MIN, BURST_SHARE * len(self.loader.pool))
        if len(doomed) <= limit:
            return deleted
        self.counters.held += len(doomed)
        log.error(
            "ALARM: deletes would unload %d of %d loaded certificates at once; they keep"
            " serving for %.0f s, then each is checked against the store again",
            len(doomed),
            len(self.loader.pool),
            self.unload_hold,
        )
        task = asyncio.get_running_loop().create_task(self._unload_later(doomed, deleted))
        self._held.add(task)
        task.add_done_callback(self._held.discard)
        return NOTHING_DELETED

    async def _unload_later(self, slots: list[Slot], deleted: Deleted) -> None:
        await asyncio.sleep(self.unload_hold)
        log.warning("checking %d held deletes against the store again", len(slots))
        for slot in slots:
            try:
                await self._reconcile_slot(slot, deleted)
            except AgentError as exc:
                log.error("applying a held delete to %s failed: %s", slot.name, exc)

    async def _reconcile_slot(self, slot: Slot, deleted: Deleted) -> None:
        if self.loader.pool.get(slot.name) is not slot:
            self._orphans.discard(slot.name)
            return  # recycled or reset meanwhile
        hosts = sorted(slot.hosts)
        now: dict[str, tuple[StoredCertificate, ...]] = {}
        for host in hosts:
            now[host] = choose_kinds(await self.store.lookup_all(host), self.dual_certs)
        if not hosts:
            if slot.cert_id is not None and await self.store.get(slot.cert_id) is None:
                await self._unload_or_keep(slot, deleted, serving=False)
            return
        if all(any(c.bundle.fingerprint_sha1 == slot.fingerprint for c in now[h]) for h in hosts):
            self._orphans.discard(slot.name)
            await self._restaple(slot, now[hosts[0]])
            await self._unmark_changed(slot, now, deleted)
            return
        successor = _successor(slot, now, self.loader.pool)
        if successor is None:
            await self._unload_or_keep(slot, deleted)
            return
        self._orphans.discard(slot.name)
        if await self.loader.replace(slot.name, successor, self.deadline):
            self.counters.rotated += 1
            if self.on_loaded is not None:
                self.on_loaded(hosts[0], (successor,))
            log.info(
                "rotated %s in %s for %s", successor.id, slot.name, " ".join(sorted(slot.hosts))
            )
        await self._unmark_changed(slot, now, deleted)

    async def _restaple(self, slot: Slot, certs: tuple[StoredCertificate, ...]) -> None:
        """A new OCSP response stored for the slot's certificate: staple it, no reload."""
        same = next(c for c in certs if c.bundle.fingerprint_sha1 == slot.fingerprint)
        if (
            same.ocsp is not None
            and same.ocsp != slot.ocsp
            and await self.loader.staple(slot.name, same.ocsp, self.deadline)
        ):
            self.counters.stapled += 1
            log.info("stapled a new OCSP response for %s in %s", same.id, slot.name)

    async def _unload_or_keep(self, slot: Slot, deleted: Deleted, serving: bool = True) -> None:
        """Unload on an explicit delete (or a slot no host uses); else keep it (an orphan)."""
        if serving and not deleted.covers(slot):
            self._orphans.add(slot.name)
            return
        self._orphans.discard(slot.name)
        hosts = " ".join(sorted(slot.hosts)) or "no host"
        if await self.loader.unload(slot.name, self.deadline):
            self.counters.unloaded += 1
            log.info("unloaded %s (%s): its certificate was deleted", slot.name, hosts)

    def _log_orphans(self) -> None:
        self._orphans = {n for n in self._orphans if self.loader.pool.get(n) is not None}
        self.counters.orphans = len(self._orphans)
        now = self._clock()
        if self._orphans and now - self._orphans_logged >= ORPHAN_LOG_INTERVAL:
            self._orphans_logged = now
            log.warning(
                "%d loaded certificates are not in the store %s; they keep serving (only a"
                " delete unloads one): re-import them, or delete them to unload",
                len(self._orphans),
                self.store.describe(),
            )

    async def _unmark_changed(
        self, slot: Slot, now: dict[str, tuple[StoredCertificate, ...]], deleted: Deleted
    ) -> None:
        """Unmark hosts whose certificates differ from the slots serving them.

        A host the store has nothing for stays marked unless its slot was deleted.
        """
        for host, certs in now.items():
            if not certs and not deleted.covers(slot):
                continue
            served = {s.fingerprint for s in self.loader.pool.for_host(host)}
            if served and served != {c.bundle.fingerprint_sha1 for c in certs}:
                await self.loader.unmark(host, self.deadline)
                self.counters.unmarked += 1


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
