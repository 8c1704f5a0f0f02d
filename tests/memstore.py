"""An in-memory :class:`~certagent.store.base.Store` for tests of code written against its roles.

Ids are the first 32 hex digits of the leaf's SHA-256 (as in RedisStore); the
roles' semantics are followed: ``add`` refuses a certificate already stored,
``replace`` keeps the id and bumps ``version``, ``delete``/``replace`` raise
NotFound, ``list`` pages by id with an opaque cursor.  Like a directory store
it keeps its ticket ring in the file it is given and has neither data keys nor
bulk adds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from certagent.certs import hostname
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import DuplicateCertificate, NotFound, StoreUnavailable
from certagent.store.base import CertRecord, Change, Page, StoredCertificate
from certagent.store.directory import LocalRing
from certagent.store.records import candidate_names


@dataclass
class MemoryStore:
    records: dict[str, tuple[CertRecord, CertBundle]] = field(default_factory=dict)
    available: bool = True
    writes: int = 0
    ocsp: dict[str, bytes] = field(default_factory=dict)

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("memory://: switched off by the test")

    def _record(self, cert_id: str, bundle: CertBundle, version: int) -> CertRecord:
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
        self._check()
        owner = self._owner(bundle.fingerprint_sha256)
        if owner is not None:
            raise DuplicateCertificate(f"memory://: this certificate is already stored as {owner}")
        cert_id = bundle.fingerprint_sha256[:32]
        record = self._record(cert_id, bundle, 1)
        self.records[cert_id] = (record, bundle)
        self.writes += 1
        return record

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        owner = self._owner(bundle.fingerprint_sha256)
        if owner is not None and owner != cert_id:
            raise DuplicateCertificate(f"memory://: this certificate is already stored as {owner}")
        record = self._record(cert_id, bundle, self.records[cert_id][0].version + 1)
        self.records[cert_id] = (record, bundle)
        self.writes += 1
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        self.writes += 1
        return self.records.pop(cert_id)[0]

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        self._check()
        if cert_id not in self.records:
            raise NotFound(f"memory://: no certificate {cert_id!r}")
        facts = check_for_chain(self.records[cert_id][1].pem, der, now)
        self.ocsp[cert_id] = der
        self.writes += 1
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
        return (), "0"

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

    def issuance(self) -> None:
        return None
