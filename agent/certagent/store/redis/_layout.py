"""The Redis store's data layout: key names, record fields, events, stream positions.

Pure functions on values, no I/O; :mod:`certagent.store.redis` does the talking.
docs/store.md describes the same layout for operators.

Key layout (``prefix`` defaults to ``certagent:``; all values are bytes)::

    {prefix}cert:{id}     HASH    chain               leaf + chain certificates, PEM, leaf first
                                  key                 the private key: keycrypt token (aad = id)
                                  names               the certificate's names, space-separated
                                  fingerprint_sha1    uppercase hex (as HAProxy prints it)
                                  fingerprint_sha256  lowercase hex
                                  serial              uppercase hex
                                  key_type            ECDSA-P256, RSA-2048, ...
                                  not_before          ISO 8601 UTC, e.g. 2025-01-31T12:00:00Z
                                  not_after           ISO 8601 UTC
                                  version             1 on add, + 1 on every replace
                                  updated_at          ISO 8601 UTC
                                  ocsp                the DER OCSP response to staple (optional)
    {prefix}name:{name}   SET     ids of the records with that name (an ECDSA and an RSA one)
    {prefix}fp:{sha256}   STRING  id of the record holding that leaf (duplicate check)
    {prefix}ids           ZSET    every id, score 0: id order and cursors (ZRANGEBYLEX)
    {prefix}expiry        ZSET    every id, scored by notAfter (Unix seconds)
    {prefix}events        STREAM  one entry per write: kind (put|delete), id, names;
                                  kind tls-keys (no id, no names) when the ring rotates
    {prefix}tls:ring      HASH    generation, rotated_at, k0 k1 k2: the TLS ticket keys,
                                  keycrypt tokens (aad = tls-ticket-key), oldest first
    {prefix}tls:lock      STRING  held (SET NX PX) by the agent rotating the ring
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from redis.typing import EncodableT, FieldT

from certagent.certs import hostname, keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CERTIFICATE, KEY_LABELS, CertBundle, split_blocks
from certagent.errors import InvalidHostname
from certagent.store.base import CertRecord, Change

__all__ = [
    "DEFAULT_PREFIX",
    "F_CHAIN",
    "F_KEY",
    "F_NAMES",
    "LOOKUP_SCRIPT",
    "META_FIELDS",
    "ZERO",
    "Keys",
    "StreamId",
    "StreamInfo",
    "decode_change",
    "decode_record",
    "encode_event",
    "encode_record",
    "entries_lost",
    "expiry_score",
    "meta_fields",
    "parse_stream_id",
    "tickets_event",
    "to_bytes",
    "to_text",
    "valid_id",
]

DEFAULT_PREFIX = "certagent:"

F_CHAIN = "chain"
F_KEY = "key"
F_NAMES = "names"
F_SHA1 = "fingerprint_sha1"
F_SHA256 = "fingerprint_sha256"
F_SERIAL = "serial"
F_KEY_TYPE = "key_type"
F_NOT_BEFORE = "not_before"
F_NOT_AFTER = "not_after"
F_VERSION = "version"
F_UPDATED_AT = "updated_at"
F_OCSP = "ocsp"  # the DER OCSP response to staple, when one was stored
#: The fields a :class:`CertRecord` is made of (no key material).
META_FIELDS = (
    F_NAMES,
    F_SHA256,
    F_SERIAL,
    F_KEY_TYPE,
    F_NOT_BEFORE,
    F_NOT_AFTER,
    F_VERSION,
    F_UPDATED_AT,
)
#: The position before every event.
ZERO = "0-0"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_STREAM_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})\Z")
_ISO = "%Y-%m-%dT%H:%M:%SZ"
_KINDS: dict[str, Literal["put", "delete"]] = {"put": "put", "delete": "delete"}

StreamId = tuple[int, int]


@dataclass(frozen=True)
class Keys:
    """Builds every Redis key the store uses.

    With ``cluster``, keys carry hash tags (see docs/store.md): a record's hash
    is tagged by its id (``cert:{id}``), a name set by its name (``name:{host}``),
    a fingerprint by itself (``fp:{sha256}``), and the keys every write or
    rotation shares -- ``ids``, ``expiry``, ``events``, ``tls:ring``, ``tls:lock``
    -- by one fixed tag (``{global}:events``), so each of those groups stays in
    one slot.
    """

    prefix: str = DEFAULT_PREFIX
    cluster: bool = False

    def __post_init__(self) -> None:
        if self.cluster and ("{" in self.prefix or "}" in self.prefix):
            raise ValueError("a Redis Cluster key prefix cannot hold '{' or '}'")

    def _tag(self, part: str) -> str:
        return f"{{{part}}}" if self.cluster else part

    def _global(self, name: str) -> str:
        return f"{self.prefix}{{global}}:{name}" if self.cluster else f"{self.prefix}{name}"

    def cert(self, cert_id: str) -> str:
        return f"{self.prefix}cert:{self._tag(cert_id)}"

    def name(self, name: str) -> str:
        return f"{self.prefix}name:{self._tag(name)}"

    def name_pattern(self) -> str:
        """The SCAN pattern of every name key."""
        return f"{self.prefix}name:{{*}}" if self.cluster else f"{self.prefix}name:*"

    def name_of(self, key: str) -> str:
        """The name a name key (from :meth:`name_pattern`) is for."""
        raw = key[len(self.prefix) + len("name:") :]
        return raw[1:-1] if self.cluster else raw

    def fingerprint(self, sha256: str) -> str:
        return f"{self.prefix}fp:{self._tag(sha256)}"

    def record_lock(self, cert_id: str) -> str:
        """Held (SET NX PX) while a cluster write changes the record (same slot as it)."""
        return f"{self.prefix}lock:{self._tag(cert_id)}"

    def ids(self) -> str:
        return self._global("ids")

    def expiry(self) -> str:
        return self._global("expiry")

    def events(self) -> str:
        return self._global("events")

    def tls_ring(self) -> str:
        return self._global("tls:ring")

    def tls_lock(self) -> str:
        return self._global("tls:lock")


#: The lazy path's lookup in one round trip (EVALSHA).  KEYS: the name sets to try, in
#: order (the host, then its wildcard); ARGV: the record key prefix, then the fields.
#: Reply: ``{k, members_1 .. members_k [, ids, rows]}``: the members of each set examined
#: (or its error text, e.g. WRONGTYPE), stopping at the first set holding an id that
#: :func:`valid_id` accepts; then that set's valid ids and, for each, ``HMGET`` of the
#: fields (or its error text).  The caller re-validates everything it gets back.
LOOKUP_SCRIPT = """
local prefix, examined = ARGV[1], {}
for i, key in ipairs(KEYS) do
  local members = redis.pcall('SMEMBERS', key)
  if members.err then
    examined[i] = members.err
  else
    examined[i] = members
    local ids, rows = {}, {}
    for _, id in ipairs(members) do
      if #id <= 64 and string.find(id, '^[A-Za-z0-9][A-Za-z0-9_.%-]*$') then
        ids[#ids + 1] = id
      end
    end
    if #ids > 0 then
      for j, id in ipairs(ids) do
        local row = redis.pcall('HMGET', prefix .. id, unpack(ARGV, 2))
        if row.err then rows[j] = row.err else rows[j] = row end
      end
      local out = {#examined}
      for _, m in ipairs(examined) do out[#out + 1] = m end
      out[#out + 1] = ids
      out[#out + 1] = rows
      return out
    end
  end
end
local out = {#examined}
for _, m in ipairs(examined) do out[#out + 1] = m end
return out
"""


def valid_id(cert_id: str) -> bool:
    """Whether ``cert_id`` can be a record id: 1-64 letters, digits, ``_.-``; no ``/`` or ``:``."""
    return _ID.match(cert_id) is not None


# --- records ----------------------------------------------------------------------------


def encode_record(
    ring: KeyRing, record: CertRecord, bundle: CertBundle
) -> dict[FieldT, EncodableT]:
    """The hash fields of ``record`` holding ``bundle``; the key encrypted for ``record.id``."""
    blocks = split_blocks(bundle.pem)
    chain = b"".join(text for label, text in blocks if label == CERTIFICATE)
    key = next(text for label, text in blocks if label in KEY_LABELS)
    return {
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
    )


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


# --- events -------------------------------------------------------------------------------


def encode_event(
    kind: Literal["put", "delete"], cert_id: str, names: Sequence[str]
) -> dict[FieldT, EncodableT]:
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
    cert_id = to_text(fields.get(b"id"))
    if kind not in _KINDS or not valid_id(cert_id):
        return None
    return Change(_KINDS[kind], cert_id, parse_names(fields.get(b"names")))


@dataclass(frozen=True)
class StreamInfo:
    """What XINFO STREAM says about the events stream."""

    first: StreamId | None
    last: StreamId
    max_deleted: StreamId
    #: Entries trimmed or deleted since the stream was created; None before Redis 7.
    removed: int | None

    @classmethod
    def from_reply(cls, raw: Mapping[str, object]) -> StreamInfo:
        """From redis-py's parsed XINFO STREAM (keys decoded, values bytes)."""
        last = parse_stream_id(to_text(raw.get("last-generated-id"))) or (0, 0)
        first_entry = raw.get("first-entry")
        first = (
            parse_stream_id(to_text(first_entry[0]))
            if isinstance(first_entry, (tuple, list)) and first_entry
            else None
        )
        max_deleted = parse_stream_id(to_text(raw.get("max-deleted-entry-id"))) or (0, 0)
        added, length = raw.get("entries-added"), raw.get("length")
        removed = added - length if isinstance(added, int) and isinstance(length, int) else None
        return cls(first=first, last=last, max_deleted=max_deleted, removed=removed)


def parse_stream_id(raw: str) -> StreamId | None:
    match = _STREAM_ID.match(raw)
    return (int(match.group(1)), int(match.group(2))) if match else None


def entries_lost(after: StreamId, info: StreamInfo | None) -> bool:
    """Whether the stream may have dropped an event newer than position ``after``.

    Trimming removes the oldest entries, so if ``after`` is older than the first
    entry left, the events between them may be gone.  That errs on the safe
    side by one entry: when ``after`` was the very last entry trimmed, nothing
    newer was lost, but that cannot be told apart.  ``removed == 0`` (Redis 7)
    proves nothing was ever trimmed, which keeps ``0-0`` usable.  ``info`` is
    None when the stream does not exist.
    """
    if info is None:
        return after != (0, 0)  # the stream was deleted: whatever it held is gone
    if after > info.last or info.max_deleted > after:
        return True  # not a position in this stream, or an XDEL after it
    if info.removed == 0:
        return False
    if info.first is None:
        return after < info.last
    return after < info.first


# --- values ---------------------------------------------------------------------------------


def to_bytes(value: object) -> bytes | None:
    """redis-py types replies loosely; with decode_responses=False they are bytes."""
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None


def to_text(value: object) -> str:
    raw = to_bytes(value)
    return "" if raw is None else raw.decode("ascii", "replace")


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
