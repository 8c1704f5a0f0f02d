"""The values the store deals in: records, changes, pages, prepared records.

Plain frozen dataclasses, no I/O; :mod:`certagent.store.base` re-exports them
beside the roles that use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from certagent.errors import DuplicateCertificate, StoreError

__all__ = [
    "AddAlone",
    "AddResult",
    "BulkResult",
    "CertRecord",
    "Change",
    "ChangeKind",
    "IdTaken",
    "Page",
    "PreparedRecord",
    "WireRecord",
    "WireResult",
]


# --- values --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertRecord:
    """A stored certificate's metadata.  Never carries key material (safe to return and log)."""

    id: str
    names: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    fingerprint_sha256: str
    serial: str  # uppercase hex
    key_type: str  # "ECDSA-P256", "RSA-2048", ...
    version: int  # 1 on upload, +1 on every rotation
    updated_at: datetime
    managed: str = ""  # "acme": obtained by the agent from an ACME CA; "": uploaded


ChangeKind = Literal["put", "delete", "tls-keys", "challenge", "domain"]


@dataclass(frozen=True)
class Change:
    """One write to the store, as seen by every agent watching it.

    ``names`` holds the record's names before *and* after the write, so an agent
    can find every loaded host the write may affect.  ``tls-keys``: the fleet's
    ticket-key ring rotated (no id, no names).  ``challenge``: an ACME challenge
    answer was published or withdrawn (``id`` = its token, ``names`` = the name
    being validated); ``domain``: a name was registered or unregistered
    (``id`` and ``names`` = it; :mod:`certagent.store.issuance`).  Consumers
    ignore the kinds they do not handle.
    """

    kind: ChangeKind
    id: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Page:
    records: tuple[CertRecord, ...]
    cursor: str | None  # pass back to get the next page; None at the end


@dataclass(frozen=True)
class PreparedRecord:
    """A new record ready to write (:class:`BulkWriter`): its metadata and its encoding.

    ``payload`` is the store's own encoding of the record, its key encrypted:
    safe to pass between processes and to keep in memory, and ``repr()``
    leaves it out anyway.  ``expiry``: its notAfter in Unix seconds.
    ``shared``: what the record refers to and the store keeps once for many
    records (the Redis store: the chain of issuers' certificates), or ``b""``.
    ``fields``: a record in a store format whose records are hashes (the Redis
    store's format 1, :mod:`certagent.store.formats`): its fields and values in
    turn, and then ``payload`` is ``b""``.
    """

    record: CertRecord
    payload: bytes = field(repr=False)
    expiry: float
    shared: bytes = field(default=b"", repr=False)
    fields: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def layout(self) -> int:
        """The store format this record is encoded in: 1 (a hash) or 2 (one string)."""
        return 1 if self.fields else 2


@dataclass(frozen=True)
class WireRecord:
    """A new record as the store's own ready-to-send write (:class:`BulkWriter`), and little else.

    The bulk import's cheap form: a worker process makes it, the importing
    process sends ``command`` as it is (for one Redis: the ``EVALSHA`` of the
    add script, RESP-encoded) and needs of the record only its id and
    fingerprint (the outcome's words).  Its key is encrypted inside
    ``command``; ``repr()`` leaves ``command`` out anyway.
    """

    id: str
    fingerprint_sha256: str
    command: bytes = field(repr=False)


@dataclass(frozen=True)
class IdTaken:
    """The record's random id was already in use (1 in 2**64 per record): prepare it again."""

    prepared: PreparedRecord | WireRecord


@dataclass(frozen=True)
class AddAlone:
    """The bulk path cannot write this record (``reason``): add it through :meth:`Writer.add`.

    E.g. a Redis user who may not run scripts: the ready-made script call is refused.
    """

    record: WireRecord
    reason: str


#: One result per record of :meth:`BulkWriter.add_prepared`, in order.
BulkResult = CertRecord | DuplicateCertificate | IdTaken | StoreError
#: One result per record of :meth:`BulkWriter.add_wire`, in order (the record itself: added).
WireResult = WireRecord | DuplicateCertificate | IdTaken | AddAlone | StoreError
#: One result per bundle of :meth:`BulkWriter.add_many`, in order.
AddResult = CertRecord | DuplicateCertificate | StoreError
