"""A store assembled from roles: wrap the one role you change, take the rest as they are.

``StoreView(store, writer=NotingWriter(store, names))`` is ``store`` with
its writes going through a wrapper (:mod:`certagent.service.namefilter`);
every other role is ``store``'s own.  Forwarding costs one call per call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.store.base import (
    BulkWriter,
    CertRecord,
    Change,
    ChangeFeed,
    DataKeys,
    FleetBoard,
    Issuance,
    OcspWriter,
    Page,
    Reader,
    RingStore,
    SnapshotSlot,
    Store,
    StoredCertificate,
    Writer,
)

__all__ = ["StoreView"]


class StoreView:
    """A :class:`~certagent.store.base.Store`: ``store``, with the roles given replaced.

    A view with a writer of its own offers no bulk adds (:meth:`bulk` is None):
    they would go around that writer.  Closing the view closes ``store``.
    """

    def __init__(
        self,
        store: Store,
        *,
        reader: Reader | None = None,
        writer: Writer | None = None,
        feed: ChangeFeed | None = None,
        ocsp: OcspWriter | None = None,
    ) -> None:
        self._store = store
        self._reader: Reader = reader or store
        self._writer: Writer = writer or store
        self._feed: ChangeFeed = feed or store
        self._ocsp: OcspWriter = ocsp or store

    # --- Reader ---------------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        return await self._reader.lookup(hostname)

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        return await self._reader.lookup_all(hostname)

    async def get(self, cert_id: str) -> CertRecord | None:
        return await self._reader.get(cert_id)

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        return await self._reader.list(
            name=name, expiring_before=expiring_before, cursor=cursor, limit=limit
        )

    def names(self) -> AsyncIterator[str]:
        return self._reader.names()

    # --- Writer ---------------------------------------------------------------------------

    async def put(self, bundle: CertBundle) -> str:
        return await self._writer.put(bundle)

    async def add(self, bundle: CertBundle) -> CertRecord:
        return await self._writer.add(bundle)

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        return await self._writer.replace(cert_id, bundle)

    async def delete(self, cert_id: str) -> CertRecord:
        return await self._writer.delete(cert_id)

    # --- ChangeFeed, OcspWriter -----------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        return await self._feed.changes(after, timeout)

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        return await self._ocsp.put_ocsp(cert_id, der, now)

    # --- Lifecycle and the accessors: the store's own --------------------------------------

    async def ping(self) -> None:
        await self._store.ping()

    async def close(self) -> None:
        await self._store.close()

    def describe(self) -> str:
        return self._store.describe()

    def ticket_ring(self, local_file: Path) -> RingStore:
        return self._store.ticket_ring(local_file)

    def data_keys(self) -> DataKeys | None:
        return self._store.data_keys()

    def bulk(self) -> BulkWriter | None:
        return None if self._writer is not self._store else self._store.bulk()

    def issuance(self) -> Issuance | None:
        return self._store.issuance()

    def filter_snapshot(self) -> SnapshotSlot | None:
        return self._store.filter_snapshot()

    def fleet(self) -> FleetBoard:
        return self._store.fleet()
