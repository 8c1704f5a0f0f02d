"""An in-memory :class:`~certagent.store.base.Store` for tests of code written against its roles.

Ids are the first 32 hex digits of the leaf's SHA-256 (as in RedisStore); the
roles' semantics are followed: ``add`` refuses a certificate already stored,
``replace`` keeps the id and bumps ``version``, ``delete``/``replace`` raise
NotFound, ``list`` pages by id with an opaque cursor.  Like a directory store
it keeps its ticket ring in the file it is given and has neither data keys nor
bulk adds.

Every write is a change in :attr:`MemoryStore.events` (``put``, ``delete``, and the
issuance roles' ``challenge`` and ``domain``), which :meth:`MemoryStore.changes`
serves (positions are indexes into that list).  :meth:`MemoryStore.issuance` has
every issuance role, with the Redis store's semantics (fencing tokens,
``add_issued`` refused with LeaseLost unless its lease is current, entries that
lapse) on the clock ``MemoryStore.clock`` (Unix seconds; replace it to move time):
the in-memory roles of :mod:`certagent.store.localissuance` and
:mod:`certagent.store.localrenewals` (a delete drops the schedule entries of the
names no record holds any more).  Several "nodes" share
one MemoryStore as a fleet shares one Redis (``issuance_shared`` says what
``Issuance.shared`` says).  With ``available`` False every call, issuance
included, raises StoreUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from certagent.certs import hostname
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import ChangesLost, DuplicateCertificate, NotFound, StoreUnavailable
from certagent.store.base import CertRecord, Change, Page, StoredCertificate
from certagent.store.directory import LocalRing
from certagent.store.issuance import ACME_MANAGED, Issuance
from certagent.store.localissuance import (
    LocalBoard,
    LocalLimits,
    LocalLocks,
    MemoryAccounts,
    MemoryDomains,
)
from certagent.store.localrenewals import LocalRenewals
from certagent.store.records import candidate_names


class _Guarded:
    """A role whose every call first checks that the store is available."""

    def __init__(self, role: object, check: Callable[[], None]) -> None:
        self._role = role
        self._check = check

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._role, name)

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            self._check()
            return await method(*args, **kwargs)

        return guarded


@dataclass
class MemorySlot:
    """The name filter snapshot's slot: bytes in memory, with a count of reads and writes."""

    data: bytes | None = None
    reads: int = 0
    writes: int = 0

    def describe(self) -> str:
        return "memory://namefilter"

    async def read(self, limit: int | None = None) -> bytes | None:
        self.reads += 1
        if self.data is None:
            return None
        return self.data if limit is None else self.data[:limit]

    async def write(self, data: bytes) -> None:
        self.writes += 1
        self.data = data


@dataclass
class MemoryStore:
    records: dict[str, tuple[CertRecord, CertBundle]] = field(default_factory=dict)
    available: bool = True
    writes: int = 0
    ocsp: dict[str, bytes] = field(default_factory=dict)
    events: list[Change] = field(default_factory=list)
    #: Unix seconds now, for the issuance roles' expiries
    clock: Callable[[], float] = time.time
    issuance_shared: bool = True
    snapshot_slot: MemorySlot = field(default_factory=lambda: MemorySlot())
    _issuance: Issuance | None = field(default=None, repr=False)
    _renewals: LocalRenewals | None = field(default=None, repr=False)
    _wake: asyncio.Event | None = field(default=None, repr=False)

    def emit(self, change: Change) -> None:
        """Append ``change`` to the feed and wake :meth:`changes`."""
        self.events.append(change)
        if self._wake is not None:
            self._wake.set()

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("memory://: switched off by the test")

    def _record(
        self, cert_id: str, bundle: CertBundle, version: int, managed: str = ""
    ) -> CertRecord:
        return CertRecord(
            id=cert_id,
            names=bundle.names,
            not_before=bundle.not_before,
            not_after=bundle.not_after,
            fingerprint_sha256=bundle.fingerprint_sha256,
            serial=f"{bundle.serial:X}",
            key_type=bundle.key_type,
            version=version,
            updated_at=datetime.now(UTC),
            managed=managed,
        )

    def _owner(self, fingerprint: str) -> str | None:
        return next(
            (i for i, (r, _) in self.records.items() if r.fingerprint_sha256 == fingerprint), None
        )

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        found = await self.lookup_all(hostname)
        return found[0] if found else None

    async def names(self) -> AsyncIterator[str]:
        for record, _ in list(self.records.values()):
            for name in record.names:
                yield name

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        self._check()
        for name in candidate_names(hostname):
            found = tuple(
                StoredCertificate(i, b, self.ocsp.get(i))
                for i, (r, b) in sorted(self.records.items())
                if name in r.names
            )
            if found:
                return found
        return ()

    async def put(self, bundle: CertBundle) -> str:
        owner = self._owner(bundle.fingerprint_sha256)
        if owner is not None:
            return (await self.replace(owner, bundle)).id
        return (await self.add(bundle)).id

    async def add(self, bundle: CertBundle) -> CertRecord:
        return await self._add(bundle, "")

    async def _add(self, bundle: CertBundle, managed: str) -> CertRecord:
        self._check()
        owner = self._owner(bundle.fingerprint_sha256)
        if owner is not None:
            raise DuplicateCertificate(f"memory://: this certificate is already stored as {owner}")
        cert_id = bundle.fingerprint_sha256[:32]
        record = self._record(cert_id, bundle, 1, managed)
        self.records[cert_id] = (record, bundle)
        self.writes += 1
        self.emit(Change("put", cert_id, record.names))
        return record

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        owner = self._owner(bundle.fingerprint_sha256)
        if owner is not None and owner != cert_id:
            raise DuplicateCertificate(f"memory://: this certificate is already stored as {owner}")
        old = self.records[cert_id][0]
        record = self._record(cert_id, bundle, old.version + 1)  # an upload: managed ""
        self.records[cert_id] = (record, bundle)
        self.writes += 1
        self.emit(Change("put", cert_id, tuple(dict.fromkeys((*record.names, *old.names)))))
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        self.writes += 1
        record = self.records.pop(cert_id)[0]
        self.emit(Change("delete", cert_id, record.names))
        await self._schedule().unschedule_orphans(record.names)
        return record

    # --- the renewal schedule's questions to the store ------------------------------------

    def _schedule(self) -> LocalRenewals:
        if self._renewals is None:
            self._renewals = LocalRenewals(self._holds, self._mark)
        return self._renewals

    async def _holds(self, name: str) -> bool:
        return any(name in r.names for r, _ in self.records.values())

    async def _mark(self, name: str) -> float:
        """Mark the records holding ``name`` managed (``Renewals.manage``); latest not_after."""
        held = [i for i, (r, _) in sorted(self.records.items()) if name in r.names]
        if not held:
            raise NotFound(f"memory://: no certificate holds {name}")
        for cert_id in held:
            record, bundle = self.records[cert_id]
            self.records[cert_id] = (dataclasses.replace(record, managed=ACME_MANAGED), bundle)
        return max(self.records[i][0].not_after.timestamp() for i in held)

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        facts = check_for_chain(self.records[cert_id][1].pem, der, now)
        self.ocsp[cert_id] = der
        self.writes += 1
        self.emit(Change("put", cert_id, self.records[cert_id][0].names))
        return facts

    async def get(self, cert_id: str) -> CertRecord | None:
        self._check()
        found = self.records.get(cert_id)
        return None if found is None else found[0]

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        self._check()
        if name is not None:
            name = hostname.normalise_pattern(name)
        matching = [
            r
            for i, (r, _) in sorted(self.records.items())
            if (cursor is None or i > cursor)
            and (name is None or name in r.names)
            and (expiring_before is None or r.not_after < expiring_before)
        ]
        page = tuple(matching[:limit])
        return Page(page, page[-1].id if len(matching) > limit else None)

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        """:attr:`events` after position ``after`` (an index), waiting up to ``timeout`` s."""
        self._check()
        if after is None:
            return (), str(len(self.events))
        if not after.isdigit() or int(after) > len(self.events):
            raise ChangesLost(f"memory://: {after[:40]!r} is not a position of this feed")
        start = int(after)
        if start == len(self.events) and timeout > 0:
            self._wake = self._wake or asyncio.Event()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        return tuple(self.events[start:]), str(len(self.events))

    async def ping(self) -> None:
        self._check()

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return "memory://"

    def ticket_ring(self, local_file: Path) -> LocalRing:
        return LocalRing(local_file)

    def data_keys(self) -> None:
        return None

    def bulk(self) -> None:
        return None

    def filter_snapshot(self) -> MemorySlot:
        return self.snapshot_slot

    def issuance(self) -> Issuance:
        if self._issuance is None:

            def now() -> float:
                return self.clock()

            def guard(role: object) -> Any:
                return _Guarded(role, self._check)

            self._issuance = Issuance(
                accounts=guard(MemoryAccounts(now)),
                locks=guard(LocalLocks(self._add, now, self._schedule())),
                challenges=guard(LocalBoard(self.emit, now)),
                domains=guard(MemoryDomains(self.emit, now)),
                limits=guard(LocalLimits(now)),
                renewals=guard(self._schedule()),
                shared=self.issuance_shared,
            )
        return self._issuance
