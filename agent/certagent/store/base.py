"""The store's interface: the values it deals in, and its roles, one Protocol each.

A caller asks for the role it uses, not for a kind of store:

* every store has the method roles :class:`Reader`, :class:`Writer`,
  :class:`ChangeFeed`, :class:`OcspWriter` and :class:`Lifecycle`; the
  composite :class:`Store` is all of them;
* a role that stores provide differently, or not at all, is an accessor on
  :class:`Store` returning the role's object, or None where the store has
  none: :meth:`Store.ticket_ring` (:class:`RingStore`), :meth:`Store.data_keys`
  (:class:`DataKeys`), :meth:`Store.bulk` (:class:`BulkWriter`),
  :meth:`Store.issuance` (:class:`~certagent.store.issuance.Issuance`),
  :meth:`Store.filter_snapshot` (:class:`SnapshotSlot`); every store has
  :meth:`Store.fleet` (:class:`FleetBoard`).

Implementations: :class:`~certagent.store.redis.RedisStore` and
:class:`~certagent.store.directory.DirectoryStore`.  A wrapper that changes one
role wraps only that one (:class:`~certagent.store.view.StoreView`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.certs.stored import StoredCertificate
from certagent.certs.ticketkeys import TicketRing
from certagent.store.formats import FormatState, Migration, NodeInfo, NodeSeen
from certagent.store.issuance import Issuance
from certagent.store.unreadable import UnreadableRecords
from certagent.store.values import (
    AddAlone,
    AddResult,
    BulkResult,
    CertRecord,
    Change,
    ChangeKind,
    IdTaken,
    Page,
    PreparedRecord,
    WireRecord,
    WireResult,
)

__all__ = [
    "AddAlone",
    "AddResult",
    "BulkResult",
    "BulkWriter",
    "CertRecord",
    "Change",
    "ChangeFeed",
    "ChangeKind",
    "DataKeys",
    "FleetBoard",
    "IdTaken",
    "Issuance",
    "Lifecycle",
    "OcspWriter",
    "Page",
    "PreparedRecord",
    "Reader",
    "RecordEncoder",
    "RingStore",
    "SnapshotSlot",
    "Store",
    "StoredCertificate",
    "WireRecord",
    "WireResult",
    "Writer",
]


# --- the roles every store has ---------------------------------------------------------------


class Reader(Protocol):
    """Finding certificates: by hostname (the lazy path), by id, by page, every name."""

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        """The best certificate for a validated, lowercase ``hostname``, or None.

        The first of :meth:`lookup_all`.
        """
        ...

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """Every certificate for ``hostname`` (e.g. an ECDSA and an RSA one), best first.

        Looks for the exact name first, then ``hostname.wildcard_for(hostname)``:
        the exact name's records if it has any, otherwise the wildcard's.  A
        record that does not parse, cannot be decrypted, or whose certificate
        does not cover ``hostname`` is logged (never key material) and left
        out.  Order: see :func:`~certagent.store.records.best_first`.
        """
        ...

    async def get(self, cert_id: str) -> CertRecord | None:
        """A record's metadata, or None if there is no record ``cert_id``."""
        ...

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Records by id order, at most ``limit`` per page.

        ``name`` matches a record's names exactly (``*.x`` too; InvalidHostname
        if it is not a valid name); ``expiring_before`` keeps records whose
        notAfter is strictly before it.  ``cursor`` is the opaque value of the
        previous page (InvalidCursor if the store did not hand it out).
        """
        ...

    def names(self) -> AsyncIterator[str]:
        """Every name (or ``*.`` pattern) some record has, each at least once, any order.

        O(N): the agent reads it to build its name filter
        (:mod:`certagent.service.namefilter`) only when there is no usable
        snapshot of it (:meth:`Store.filter_snapshot`) or it goes stale.
        """
        ...


class Writer(Protocol):
    """Adding, rotating and removing records (bundles validated by the caller)."""

    async def put(self, bundle: CertBundle) -> str:
        """Store ``bundle`` unless already stored; return its id (for demos and tests)."""
        ...

    async def add(self, bundle: CertBundle) -> CertRecord:
        """Store a new record.

        Raises DuplicateCertificate if the store already holds it (the Redis
        store: the same leaf; the directory store: a file for its first name).
        """
        ...

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        """Rotate: same id, new certificate and key, version + 1; NotFound if no such id."""
        ...

    async def delete(self, cert_id: str) -> CertRecord:
        """Remove a record and its names; return what it was.  NotFound if no such id."""
        ...


class ChangeFeed(Protocol):
    """Following every write, this agent's and the others'."""

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        """Writes after position ``after``, waiting up to ``timeout`` s; and the new position.

        ``after=None`` means "from now": returns no changes and the current
        position.  Raises ChangesLost if ``after`` is too old to replay (the
        caller then reconciles everything it has loaded).
        """
        ...


class OcspWriter(Protocol):
    """Keeping an OCSP response with its record, to staple."""

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Keep an OCSP response with a record (a ``put`` change).

        Checked first against the record's leaf at ``now``
        (:func:`~certagent.certs.ocsp.check_for_chain`): OcspError if it is not
        a current, signed response about it; NotFound if no such id.
        """
        ...


class Lifecycle(Protocol):
    """Checking, naming and closing the store."""

    async def ping(self) -> None:
        """Return if the store is usable, else raise StoreUnavailable."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str:
        """Where the store is, for logs: a URL without password."""
        ...


# --- the roles a store provides its own way, or not at all -----------------------------------


class RingStore(Protocol):
    """Where the fleet's session-ticket key ring of record lives (:meth:`Store.ticket_ring`)."""

    def describe(self) -> str: ...

    async def load(self) -> TicketRing | None:
        """The ring as stored; None if there is none yet."""
        ...

    async def rotate(
        self, expected: int | None, make: Callable[[TicketRing | None], TicketRing]
    ) -> TicketRing:
        """Store ``make(ring)`` if the ring's generation is still ``expected``.

        ``expected`` None means "there is no ring yet"; ``make`` gets None when
        there is none.  Returns the ring stored afterwards: the new one, or the
        one another agent wrote meanwhile.  May raise RotationInProgress.
        """
        ...


class DataKeys(Protocol):
    """Private keys encrypted at rest with the data keys of a key file (``key_file``)."""

    @property
    def keyring(self) -> KeyRing | None:
        """The key file's data keys this store was opened with."""
        ...

    async def key_ids_in_use(self, sample: int = 32) -> set[str]:
        """Data-key ids of ``sample`` random records and of the ticket ring: O(sample)."""
        ...

    async def rotate_keys(self) -> int:
        """Re-encrypt every key not made with the current data key; return how many."""
        ...

    async def announce(self, node: str, key_ids: Sequence[str], ttl: float) -> None:
        """Agent ``node`` holds ``key_ids`` for ``ttl`` s more (by the store's clock): O(nodes)."""
        ...

    async def withdraw(self, node: str) -> None:
        """Agent ``node`` stopped: its announcement goes at once."""
        ...

    async def fleet_key_ids(self) -> dict[str, frozenset[str]]:
        """Running agent -> the key ids it announced, lapsed ones left out: one read, O(nodes)."""
        ...

    def unreadable(self) -> UnreadableRecords:
        """The records this store's lookups met and could not decrypt (bounded, this process)."""
        ...


class FleetBoard(Protocol):
    """The store's format and the fleet's board of nodes (:mod:`certagent.store.formats`).

    A store shared by a fleet (Redis) keeps both; a directory has one format and no
    board (its :meth:`nodes` is empty, its :meth:`beat` a no-op).
    """

    def describe(self) -> str: ...

    @property
    def newest(self) -> int:
        """The newest format this release writes for this kind of store."""
        ...

    async def state(self, *, node: str = "") -> FormatState:
        """The store's active format.  A store holding no record and no format yet is
        marked at the newest format first (a new store starts finalized).  O(nodes)."""
        ...

    async def beat(self, node: str, info: NodeInfo, ttl: float) -> FormatState:
        """``node`` runs ``info`` for ``ttl`` s more; the store's format as of then.  O(nodes)."""
        ...

    async def leave(self, node: str, info: NodeInfo) -> None:
        """``node`` stops: listed as stopped from now, for a while."""
        ...

    async def nodes(self) -> tuple[NodeSeen, ...]:
        """The nodes on the board, running or stopped recently, by name.  O(nodes)."""
        ...

    async def finalize(self, target: int, node: str) -> FormatState:
        """Move the store's format up to ``target`` (never down); the state afterwards.

        The caller checked :func:`~certagent.store.formats.holding_back` first.
        """
        ...

    async def migrate(self, progress: Callable[[Migration], None] | None = None) -> Migration:
        """Rewrite the records held in a format older than the active one.  O(N), online."""
        ...


class SnapshotSlot(Protocol):
    """Where agents keep the name filter's snapshot (:meth:`Store.filter_snapshot`): one blob."""

    def describe(self) -> str: ...

    async def read(self, limit: int | None = None) -> bytes | None:
        """The blob (its first ``limit`` bytes); None if there is none.  O(its size)."""
        ...

    async def write(self, data: bytes) -> None:
        """Replace the blob with ``data`` (one write, whole or not at all)."""
        ...


class RecordEncoder(Protocol):
    """Encodes new records for :meth:`BulkWriter.add_prepared`: pure, no I/O, picklable."""

    def prepare(self, bundle: CertBundle, updated_at: datetime) -> PreparedRecord:
        """``bundle`` under a new random id, version 1, its key encrypted for that id, in
        the store format the encoder was made for."""
        ...

    def encode(self, bundle: CertBundle, updated_at: datetime) -> PreparedRecord | WireRecord:
        """:meth:`prepare`, in the cheapest form the writer takes: a :class:`WireRecord` if it can.

        A :class:`WireRecord` goes to :meth:`BulkWriter.add_wire`, a
        :class:`PreparedRecord` to :meth:`BulkWriter.add_prepared`.
        """
        ...


class BulkWriter(Protocol):
    """Many adds per round trip, records encoded ahead (``certagent cert import``)."""

    async def encoder(self) -> RecordEncoder:
        """Encodes new records (in worker processes too) in the store's active format.

        ConfigError without a key file.
        """
        ...

    async def add_many(self, bundles: Sequence[CertBundle]) -> list[AddResult]:
        """Add new records, one result per bundle, in order; StoreUnavailable if unreachable."""
        ...

    async def add_prepared(self, records: Sequence[PreparedRecord]) -> list[BulkResult]:
        """:meth:`add_many` for records from :meth:`encoder`; IdTaken: prepare that one again."""
        ...

    async def add_wire(self, records: Sequence[WireRecord]) -> list[WireResult]:
        """:meth:`add_prepared` for :meth:`RecordEncoder.encode`'s wire form.

        AddAlone: add that one through :meth:`Writer.add` instead.
        """
        ...


# --- everything ------------------------------------------------------------------------------


class Store(Reader, Writer, ChangeFeed, OcspWriter, Lifecycle, Protocol):
    """Where certificates live: every role.  Implementations: RedisStore, DirectoryStore.

    Every method raises :class:`~certagent.errors.StoreUnavailable` when the backend
    cannot be reached; other library exceptions never escape.
    """

    def ticket_ring(self, local_file: Path) -> RingStore:
        """The fleet's session-ticket key ring.

        A store that agents share (Redis) keeps it and ignores ``local_file``;
        one that cannot hold it (a directory) keeps it in ``local_file``, for
        this node only (no lock: one agent per HAProxy owns it).
        """
        ...

    def data_keys(self) -> DataKeys | None:
        """The data keys private keys are encrypted with; None if keys are kept as they are."""
        ...

    def bulk(self) -> BulkWriter | None:
        """Many adds per round trip; None if this store adds records one by one."""
        ...

    def issuance(self) -> Issuance | None:
        """What ACME issuance keeps in the store (:mod:`certagent.store.issuance`).

        None if this store cannot keep it.
        """
        ...

    def fleet(self) -> FleetBoard:
        """The store's format and the fleet's board (:mod:`certagent.store.formats`)."""
        ...

    def filter_snapshot(self) -> SnapshotSlot | None:
        """Where the name filter's snapshot is kept (:mod:`certagent.service.bloom`).

        None if this store has no use for one: its change feed does not
        survive the process, so a snapshot could not be brought up to date.
        """
        ...
