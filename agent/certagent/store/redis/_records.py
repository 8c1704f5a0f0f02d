"""How the Redis store encodes a record and an event, and decodes them: one module for both writers.

Pure functions on values, no I/O.  A record is written in the store's active
format (:mod:`certagent.store.formats`): format 2 is one string (layout 2,
:mod:`certagent.store.redis._packed`), its private key encrypted with the data key
for its id, its chain stored once (``chain:{sha256}``); format 1, what releases
before 0.2.0 read and a store keeps until ``fleet finalize``, is one hash per
record (fields in :mod:`certagent.store.redis._layout`, :func:`encode_record`).
:class:`RecordEncoder` prepares a new record ahead (in worker processes too) as a
:class:`~certagent.store.base.PreparedRecord`; :func:`encode_as` encodes a record
being replaced; :func:`decode_record` reads the metadata of both.  An event is
one entry of the ``events`` stream.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from redis.typing import EncodableT, FieldT

from certagent.certs import hostname, keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CERTIFICATE, KEY_LABELS, CertBundle, split_blocks
from certagent.errors import InvalidHostname, StoreError
from certagent.store.base import CertRecord, Change, PreparedRecord, WireRecord
from certagent.store.records import make_record
from certagent.store.redis._addscript import AddCall, WirePacker
from certagent.store.redis._layout import (
    F_CHAIN,
    F_DROPPED,
    F_KEY,
    F_KEY_TYPE,
    F_MANAGED,
    F_NAMES,
    F_NOT_AFTER,
    F_NOT_BEFORE,
    F_OCSP,
    F_SERIAL,
    F_SHA1,
    F_SHA256,
    F_UPDATED_AT,
    F_VERSION,
    META_FIELDS,
    to_bytes,
    to_text,
    valid_id,
)
from certagent.store.redis._packed import pack_record

__all__ = [
    "Encoded",
    "EventKind",
    "RecordEncoder",
    "decode_change",
    "decode_record",
    "decode_record_time",
    "encode_as",
    "encode_event",
    "encode_record",
    "expiry_score",
    "hash_fields",
    "meta_fields",
    "pack",
    "parse_names",
    "tickets_event",
]

#: The kinds of event a record's write appends.
EventKind = Literal["put", "delete"]
#: The kinds of event the issuance roles append (:mod:`certagent.store.issuance`).
IssuanceKind = Literal["challenge", "domain"]

_ISO = "%Y-%m-%dT%H:%M:%SZ"
_KINDS: dict[str, EventKind] = {"put": "put", "delete": "delete"}
_ISSUANCE_KINDS: dict[str, IssuanceKind] = {"challenge": "challenge", "domain": "domain"}
_MANAGED = re.compile(r"[a-z0-9-]{0,32}\Z")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}\Z")


# --- records -------------------------------------------------------------------------------


def encode_record(
    ring: KeyRing, record: CertRecord, bundle: CertBundle
) -> dict[FieldT, EncodableT]:
    """Layout 1: the hash fields of ``record`` holding ``bundle``; the key encrypted for its id.

    What a store at format 1 holds: exactly what releases before 0.2.0 wrote and
    read (``HMGET chain key ocsp`` and the metadata fields).  ``managed`` is
    written only when it is not ``""``: an upload's hash is what it always was.
    """
    if not _MANAGED.match(record.managed):
        raise ValueError(f"managed must be a short lowercase word, not {record.managed[:40]!r}")
    blocks = split_blocks(bundle.pem)
    chain = b"".join(text for label, text in blocks if label == CERTIFICATE)
    key = next(text for label, text in blocks if label in KEY_LABELS)
    fields: dict[FieldT, EncodableT] = {
        F_CHAIN: chain,
        F_KEY: keycrypt.encrypt(ring, key, record.id.encode("ascii")),
        F_NAMES: " ".join(record.names).encode("ascii"),
        F_SHA1: bundle.fingerprint_sha1.encode("ascii"),
        F_SHA256: record.fingerprint_sha256.encode("ascii"),
        F_SERIAL: record.serial.encode("ascii"),
        F_KEY_TYPE: record.key_type.encode("ascii"),
        F_NOT_BEFORE: _iso(record.not_before),
        F_NOT_AFTER: _iso(record.not_after),
        F_VERSION: str(record.version).encode("ascii"),
        F_UPDATED_AT: _iso(record.updated_at),
    }
    if record.managed:
        fields[F_MANAGED] = record.managed.encode("ascii")
    return fields


def hash_fields(
    ring: KeyRing,
    record: CertRecord,
    bundle: CertBundle,
    *,
    ocsp: bytes | None = None,
    dropped: Sequence[str] = (),
) -> tuple[bytes, ...]:
    """:func:`encode_record`'s fields and values in turn (``HSET key f v f v ...``), with
    the OCSP response and the names a cluster's replace dropped when there are some."""
    fields = encode_record(ring, record, bundle)
    if ocsp is not None:
        fields[F_OCSP] = ocsp
    names = " ".join(dict.fromkeys(dropped))
    if names:
        fields[F_DROPPED] = names.encode("ascii")
    flat: list[bytes] = []
    for name, value in fields.items():
        flat += [_as_bytes(name), _as_bytes(value)]
    return tuple(flat)


def _as_bytes(value: object) -> bytes:
    raw = to_bytes(value)
    if raw is None:
        raise TypeError(f"a record field is {type(value).__name__}, not bytes or text")
    return raw


@dataclass(frozen=True)
class Encoded:
    """A record encoded in a store format: ``payload`` (format 2: one string, its chain
    ``chain`` kept apart) or ``fields`` (format 1: a hash's fields and values in turn)."""

    payload: bytes
    fields: tuple[bytes, ...]
    chain: bytes

    @property
    def layout(self) -> int:
        return 1 if self.fields else 2


def encode_as(
    layout: int,
    ring: KeyRing,
    record: CertRecord,
    bundle: CertBundle,
    *,
    ocsp: bytes | None = None,
    dropped: Sequence[str] = (),
) -> Encoded:
    """``record`` holding ``bundle`` in store format ``layout`` (1 or 2): what a replace writes."""
    if layout == 1:
        return Encoded(b"", hash_fields(ring, record, bundle, ocsp=ocsp, dropped=dropped), b"")
    if layout != 2:
        raise ValueError(f"no store format {layout} in this release")
    payload, chain = pack_record(ring, record, bundle, ocsp=ocsp, dropped=dropped)
    return Encoded(payload, (), chain)


def meta_fields(row: object) -> dict[str, bytes | None] | None:
    """An HMGET reply for META_FIELDS as a dict; None if the record does not exist."""
    if not isinstance(row, list) or len(row) != len(META_FIELDS):
        return None
    fields = dict(zip(META_FIELDS, (to_bytes(v) for v in row), strict=True))
    return None if fields[F_SHA256] is None else fields


def decode_record(cert_id: str, fields: Mapping[str, bytes | None]) -> CertRecord:
    """A CertRecord from :func:`meta_fields`; ValueError if a field is missing or invalid."""
    names = parse_names(fields[F_NAMES])
    if not names:
        raise ValueError("no valid names")
    return CertRecord(
        id=cert_id,
        names=names,
        not_before=_parse_iso(fields[F_NOT_BEFORE]),
        not_after=_parse_iso(fields[F_NOT_AFTER]),
        fingerprint_sha256=_required(fields[F_SHA256]),
        serial=_required(fields[F_SERIAL]),
        key_type=_required(fields[F_KEY_TYPE]),
        version=int(_required(fields[F_VERSION])),
        updated_at=_parse_iso(fields[F_UPDATED_AT]),
        managed=_managed(fields.get(F_MANAGED)),
    )


def _managed(raw: bytes | None) -> str:
    """A record's ``managed`` field; absent (a record older than the field) is ``""``."""
    text = (raw or b"").decode("ascii", "replace")
    if not _MANAGED.match(text):
        raise ValueError("managed is not a short lowercase word")
    return text


def parse_names(raw: bytes | None) -> tuple[str, ...]:
    """The valid names of a space-separated ``names`` value, in order, without repeats."""
    names: list[str] = []
    for part in (raw or b"").decode("ascii", "replace").split():
        try:
            name = hostname.normalise_pattern(part)
        except InvalidHostname:
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


def expiry_score(moment: datetime) -> float:
    """``moment`` as the score of the ``expiry`` sorted set: Unix seconds."""
    if moment.utcoffset() is None:
        raise ValueError("dates must be timezone-aware")
    return moment.timestamp()


def _required(value: bytes | None) -> str:
    if not value:
        raise ValueError("a field is missing")
    return value.decode("ascii", "replace")


def _iso(moment: datetime) -> bytes:
    return moment.astimezone(UTC).strftime(_ISO).encode("ascii")


def _parse_iso(raw: bytes | None) -> datetime:
    moment = datetime.fromisoformat(_required(raw))
    if moment.tzinfo is None:
        raise ValueError("a date has no time zone")
    return moment.astimezone(UTC)


def decode_record_time(raw: bytes) -> float:
    """The ``expiry`` score of a record's ``not_after`` field."""
    return expiry_score(datetime.fromisoformat(raw.decode("ascii")))


@dataclass(frozen=True)
class RecordEncoder:
    """Encodes new records for the bulk writer: pure, no I/O; picklable.

    ``ring`` is the store's key ring (its data keys: keep the encoder in the
    process that opened the key file and in the workers it starts).  ``layout``:
    the store format to write (:mod:`certagent.store.formats`), the store's active
    one when the encoder was made.  ``call``: the writer's add script call (one
    Redis), with which :meth:`encode` packs the whole write ahead (format 2 only).
    """

    ring: KeyRing
    call: AddCall | None = None
    layout: int = 2

    def __post_init__(self) -> None:
        if self.layout not in (1, 2):
            raise ValueError(f"no store format {self.layout} in this release")

    def __repr__(self) -> str:
        return (
            f"RecordEncoder(current={self.ring.current!r}, layout={self.layout},"
            f" packed={self.call is not None})"
        )

    def encode(self, bundle: CertBundle, updated_at: datetime) -> PreparedRecord | WireRecord:
        """:meth:`prepare`; with ``call`` (format 2), packed into the write's bytes (a WireRecord).

        The WireRecord in one pass (:class:`~._addscript.WirePacker`, kept per
        process): what ``call.command`` gives for :meth:`prepare`'s record.
        """
        if self.call is None or self.layout != 2:
            return self.prepare(bundle, updated_at)
        return _packer(self.call, self.ring).wire(bundle, updated_at, secrets.token_hex(8))

    def prepare(
        self, bundle: CertBundle, updated_at: datetime, *, managed: str = ""
    ) -> PreparedRecord:
        """``bundle`` under a new random id, version 1, its key encrypted for that id."""
        record = make_record(
            secrets.token_hex(8), bundle, version=1, updated_at=updated_at, managed=managed
        )
        expiry = expiry_score(bundle.not_after)
        if self.layout == 1:
            fields = hash_fields(self.ring, record, bundle)
            return PreparedRecord(record=record, payload=b"", expiry=expiry, fields=fields)
        payload, chain = pack_record(self.ring, record, bundle)
        return PreparedRecord(record=record, payload=payload, expiry=expiry, shared=chain)


@functools.lru_cache(maxsize=4)
def _packer(call: AddCall, ring: KeyRing) -> WirePacker:
    """This process's packer for ``call`` and ``ring``: kept from batch to batch for its caches."""
    return WirePacker(call, ring)


def pack(fields: Mapping[FieldT, EncodableT], record_id: str = "") -> bytes:
    """A hash's fields and values joined by NUL bytes (as the scripts split them)."""
    parts: list[bytes] = []
    for name, value in fields.items():
        for part in (name, value):
            raw = to_bytes(part)
            if raw is None or b"\0" in raw:
                which = f"record {record_id}" if record_id else "a record"
                raise StoreError(f"{which}: a field is not NUL-free bytes")
            parts.append(raw)
    return b"\0".join(parts)


# --- events --------------------------------------------------------------------------------


def encode_event(kind: EventKind, cert_id: str, names: Sequence[str]) -> dict[FieldT, EncodableT]:
    """The fields of an event; ``names`` are the record's names before and after the write."""
    return {"kind": kind, "id": cert_id, "names": " ".join(dict.fromkeys(names))}


def tickets_event() -> dict[FieldT, EncodableT]:
    """The event of a ticket-key rotation."""
    return {"kind": "tls-keys"}


def decode_change(fields: Mapping[bytes, bytes]) -> Change | None:
    """The change an event describes; None if it is not one the store writes."""
    kind = to_text(fields.get(b"kind"))
    if kind == "tls-keys":
        return Change("tls-keys", "", ())
    if kind in _ISSUANCE_KINDS:
        return _issuance_change(
            _ISSUANCE_KINDS[kind], to_text(fields.get(b"id")), fields.get(b"names")
        )
    cert_id = to_text(fields.get(b"id"))
    if kind not in _KINDS or not valid_id(cert_id):
        return None
    return Change(_KINDS[kind], cert_id, parse_names(fields.get(b"names")))


def _issuance_change(kind: IssuanceKind, change_id: str, raw_names: bytes | None) -> Change | None:
    names = parse_names(raw_names)
    if len(names) != 1:
        return None
    if kind == "challenge":
        return Change(kind, change_id, names) if _TOKEN.match(change_id) else None
    return Change(kind, names[0], names) if change_id == names[0] else None
