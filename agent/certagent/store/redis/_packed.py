"""The compact record (layout 2): one Redis string per record, its issuers' chain shared.

Pure functions on values, no I/O.  A record written since layout 2 is the
string ``{prefix}cert:{id}``::

    b"\\xcaR2"                          magic and layout
    tag (1 byte) + length (LEB128) + value, for each field, each tag at most once

======  ==========================================================  =========
tag     value                                                       required
======  ==========================================================  =========
``n``   the names, space-separated ASCII                            yes
``S``   serial, unsigned big-endian (``s``: as text, if negative)   one of
``s``   serial, uppercase hex ASCII                                 them
``t``   key type, ASCII (``ECDSA-P256``...)                         yes
``b``   notBefore, Unix seconds (8 bytes, signed, big-endian)       yes
``a``   notAfter, the same                                          yes
``v``   version, decimal ASCII                                      yes
``u``   updated_at, Unix seconds (8 bytes)                          yes
``L``   the leaf certificate, DER                                   yes
``K``   the private key: a ``cak2`` token (binary AES-256-GCM,      yes
        :mod:`certagent.certs.keycrypt`) of one label byte + the
        key's DER, bound to ``record-v2 <id>``
``C``   SHA-256 of the chain (32 bytes): the certificates after     no
        the leaf are the string ``{prefix}chain:{hex}``, their DER
        concatenated, shared by every record with that chain
``m``   managed (``acme``)                                          no
``O``   the OCSP response to staple, DER                            no
``D``   (a cluster only) names a replace dropped, space-separated   no
======  ==========================================================  =========

The leaf's SHA-256 (its fingerprint, the ``fp:`` index) is not stored: it is
computed from ``L`` when read (≈1 µs).  About 750 bytes for an ECDSA P-256 leaf
of 480 bytes with one name (a leaf with SCTs and AIA, as public CAs issue, is
≈1,100: add that), instead of ≈2,600 for
the hash of layout 1 (PEM chain and key, ISO dates, 11 fields, none small
enough for Redis's listpack encoding: a full hashtable per record).  The PEM
HAProxy gets is rebuilt on each load: DER to base64 lines, a few µs.

A record is hostile input: :func:`unpack` checks the magic, every length and
every required field, and raises ValueError saying what is wrong.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CERTIFICATE, KEY_LABELS, CertBundle, der_to_pem, split_blocks
from certagent.errors import KeyDecryptError
from certagent.store.base import CertRecord
from certagent.store.redis._layout import (
    F_KEY_TYPE,
    F_MANAGED,
    F_NAMES,
    F_NOT_AFTER,
    F_NOT_BEFORE,
    F_SERIAL,
    F_SHA256,
    F_UPDATED_AT,
    F_VERSION,
)

__all__ = [
    "LABELS",
    "MAGIC",
    "Packed",
    "bundle_parts",
    "chain_digest",
    "chain_pem",
    "is_packed",
    "pack_record",
    "pack_upload",
    "pem_der",
    "seconds",
    "split_der",
    "unpack",
]

MAGIC = b"\xcaR2"
_ISO = "%Y-%m-%dT%H:%M:%SZ"
_TIME = struct.Struct(">q")
#: The key's PEM label, as one byte before its DER inside the sealed key.
LABELS = {"PRIVATE KEY": 1, "EC PRIVATE KEY": 2, "RSA PRIVATE KEY": 3}
_LABEL_OF = {code: label for label, code in LABELS.items()}
_REQUIRED = b"ntbavuLK"
_KNOWN = frozenset(_REQUIRED + b"SsCmOD")
#: A record larger than this is refused (a leaf with hundreds of names is ≈30 KB).
MAX_RECORD = 1 << 20


@dataclass(frozen=True)
class Packed:
    """A decoded layout-2 record: its fields, as bytes (the key still sealed)."""

    fields: Mapping[int, bytes]

    def meta(self) -> dict[str, bytes | None]:
        """The record's metadata in layout 1's form (:data:`~._layout.META_FIELDS`)."""
        f = self.fields
        return {
            F_NAMES: f[ord("n")],
            F_SHA256: hashlib.sha256(f[ord("L")]).hexdigest().encode("ascii"),
            F_SERIAL: _serial(f),
            F_KEY_TYPE: f[ord("t")],
            F_NOT_BEFORE: _iso(f[ord("b")]),
            F_NOT_AFTER: _iso(f[ord("a")]),
            F_VERSION: f[ord("v")],
            F_UPDATED_AT: _iso(f[ord("u")]),
            F_MANAGED: f.get(ord("m")),
        }

    @property
    def chain_digest(self) -> bytes | None:
        """SHA-256 of the shared chain (``{prefix}chain:{hex}``); None: the leaf alone."""
        return self.fields.get(ord("C"))

    @property
    def key_token(self) -> bytes:
        return self.fields[ord("K")]

    @property
    def ocsp(self) -> bytes | None:
        return self.fields.get(ord("O"))

    @property
    def dropped(self) -> bytes | None:
        return self.fields.get(ord("D"))

    @property
    def not_after_seconds(self) -> float:
        return float(_TIME.unpack(self.fields[ord("a")])[0])

    def leaf_pem(self) -> bytes:
        return _pem(CERTIFICATE, self.fields[ord("L")])

    @property
    def leaf_der(self) -> bytes:
        return self.fields[ord("L")]

    def key_pem(self, ring: KeyRing, cert_id: str) -> bytes:
        """The private key, decrypted, as PEM; KeyDecryptError if it cannot be."""
        return _pem(*self.key_der(ring, cert_id))

    def key_der(self, ring: KeyRing, cert_id: str) -> tuple[str, bytes]:
        """The private key, decrypted: its PEM label and DER; KeyDecryptError if it cannot be."""
        plain = keycrypt.decrypt(ring, self.key_token, key_aad(cert_id))
        label = _LABEL_OF.get(plain[0]) if plain else None
        if label is None:
            raise KeyDecryptError("the decrypted key has no known PEM label")
        return label, plain[1:]

    def with_fields(self, **changes: bytes | None) -> bytes:
        """This record packed again with fields changed (by tag letter); None drops one."""
        fields = dict(self.fields)
        for tag, value in changes.items():
            if value is None:
                fields.pop(ord(tag), None)
            else:
                fields[ord(tag)] = value
        return _join(fields)


def key_aad(cert_id: str) -> bytes:
    """What a layout-2 key is bound to: its record (and the layout: a layout-1 token fails)."""
    return b"record-v2 " + cert_id.encode("ascii")


def is_packed(raw: bytes) -> bool:
    return raw.startswith(MAGIC)


def pack_record(
    ring: KeyRing,
    record: CertRecord,
    bundle: CertBundle,
    *,
    ocsp: bytes | None = None,
    dropped: Iterable[str] = (),
) -> tuple[bytes, bytes]:
    """``(record, chain)``: the string of ``record`` holding ``bundle``, and its chain's DER.

    ``chain`` is the certificates after the leaf, DER, concatenated (``b""`` for
    a leaf alone): the caller stores it once as ``chain:{sha256 of it}``.
    """
    certs, label, key_text = bundle_parts(bundle)
    plain = bytes([LABELS[label]]) + pem_der(key_text)
    leaf, chain = certs[0], b"".join(certs[1:])
    fields: dict[int, bytes] = {
        ord("n"): " ".join(record.names).encode("ascii"),
        **_serial_field(record.serial),
        ord("t"): record.key_type.encode("ascii"),
        ord("b"): seconds(record.not_before),
        ord("a"): seconds(record.not_after),
        ord("v"): str(record.version).encode("ascii"),
        ord("u"): seconds(record.updated_at),
        ord("L"): leaf,
        ord("K"): keycrypt.encrypt(ring, plain, key_aad(record.id), binary=True),
    }
    if chain:
        fields[ord("C")] = chain_digest(chain)
    if record.managed:
        fields[ord("m")] = record.managed.encode("ascii")
    if ocsp is not None:
        fields[ord("O")] = ocsp
    names = " ".join(dict.fromkeys(dropped))
    if names:
        fields[ord("D")] = names.encode("ascii")
    return _join(fields), chain


def pack_upload(
    seal: Callable[[bytes, bytes], bytes],
    cert_id: str,
    bundle: CertBundle,
    updated_at: bytes,
    digests: dict[bytes, bytes],
) -> tuple[bytes, bytes, bytes | None]:
    """``(record, chain, chain's SHA-256 or None)`` of a new upload, in one pass.

    The bytes :func:`pack_record` gives for ``make_record(cert_id, bundle,
    version=1, updated_at=...)`` (not managed, no OCSP response), with
    ``seal`` doing what ``keycrypt.encrypt(ring, ..., binary=True)`` does
    (:class:`~certagent.certs.keycrypt.Sealer`); ``updated_at``: its
    :func:`seconds`.  No record object, no dict of fields: the import packs a
    record per file.  ``digests``: the caller's cache of chain digests (a
    handful of chains shared by every record; at most 64 kept).
    """
    certs, label, key_text = bundle_parts(bundle)
    leaf, chain = certs[0], b"".join(certs[1:])
    names = " ".join(bundle.names).encode("ascii")
    serial = bundle.serial
    if serial >= 0:  # as _serial_field gives it for format(serial, "X")
        tag, value = b"S", serial.to_bytes(max(1, (serial.bit_length() + 7) // 8), "big")
    else:
        tag, value = b"s", format(serial, "X").encode("ascii")
    key_type = bundle.key_type.encode("ascii")
    sealed = seal(bytes([LABELS[label]]) + pem_der(key_text), key_aad(cert_id))
    parts = [
        MAGIC,
        *(b"n", _leb128(len(names)), names),
        *(tag, _leb128(len(value)), value),
        *(b"t", _leb128(len(key_type)), key_type),
        *(b"b\x08", seconds(bundle.not_before), b"a\x08", seconds(bundle.not_after)),
        *(b"v\x011", b"u\x08", updated_at),
        *(b"L", _leb128(len(leaf)), leaf),
        *(b"K", _leb128(len(sealed)), sealed),
    ]
    digest = None
    if chain:
        digest = digests.get(chain)
        if digest is None:
            if len(digests) >= 64:
                digests.clear()
            digest = digests[chain] = chain_digest(chain)
        parts += [b"C\x20", digest]
    return b"".join(parts), chain, digest


def bundle_parts(bundle: CertBundle) -> tuple[list[bytes], str, bytes]:
    """The bundle's certificates (DER), its key's PEM label and block.

    With ``bundle.ders`` (a bulk check had them), only the key's block is cut
    out: it is the last block of ``pem``.
    """
    if bundle.ders is not None:
        at = bundle.pem.rfind(b"-----BEGIN ")
        head = bundle.pem[at + 11 : bundle.pem.find(b"-----", at + 11)]
        label = head.decode("ascii", "replace")
        if label in KEY_LABELS:
            return list(bundle.ders), label, bundle.pem[at:]
    blocks = split_blocks(bundle.pem)
    certs = [pem_der(text) for label, text in blocks if label == CERTIFICATE]
    label, key_text = next((label, text) for label, text in blocks if label in KEY_LABELS)
    return certs, label, key_text


def unpack(raw: bytes) -> Packed:
    """Decode a layout-2 record; ValueError (saying what is wrong) if it is not one."""
    if not raw.startswith(MAGIC):
        raise ValueError("not a layout-2 record (bad magic)")
    if len(raw) > MAX_RECORD:
        raise ValueError(f"{len(raw)} bytes, more than a record can be")
    fields: dict[int, bytes] = {}
    at = len(MAGIC)
    while at < len(raw):
        tag = raw[at]
        if tag not in _KNOWN:
            raise ValueError(f"unknown field {tag:#04x} at byte {at}")
        if tag in fields:
            raise ValueError(f"field {chr(tag)!r} appears twice")
        length, at = _uvarint(raw, at + 1)
        if at + length > len(raw):
            raise ValueError(f"field {chr(tag)!r} is cut short")
        fields[tag] = raw[at : at + length]
        at += length
    missing = [chr(t) for t in _REQUIRED if t not in fields]
    if ord("S") not in fields and ord("s") not in fields:
        missing.append("S")
    if missing:
        raise ValueError(f"fields {''.join(missing)!r} are missing")
    for tag in b"bau":
        if len(fields[tag]) != _TIME.size:
            raise ValueError(f"field {chr(tag)!r} is not a time")
    for tag in b"C":
        if tag in fields and len(fields[tag]) != 32:
            raise ValueError(f"field {chr(tag)!r} is not a SHA-256")
    return Packed(fields)


def chain_digest(chain: bytes) -> bytes:
    return hashlib.sha256(chain).digest()


def split_der(chain: bytes) -> list[bytes]:
    """The certificates of a shared chain (DER, concatenated); ValueError if malformed."""
    certs: list[bytes] = []
    at = 0
    while at < len(chain):
        if chain[at] != 0x30 or at + 2 > len(chain):
            raise ValueError("the chain is not a sequence of DER certificates")
        size, head = chain[at + 1], 2
        if size & 0x80:
            count = size & 0x7F
            if count == 0 or count > 4 or at + 2 + count > len(chain):
                raise ValueError("the chain has a bad DER length")
            size = int.from_bytes(chain[at + 2 : at + 2 + count], "big")
            head += count
        end = at + head + size
        if end > len(chain):
            raise ValueError("the chain is cut short")
        certs.append(chain[at:end])
        at = end
    return certs


def chain_pem(chain: bytes) -> bytes:
    """A shared chain's certificates as PEM, in order; ValueError if malformed."""
    return b"".join(_pem(CERTIFICATE, der) for der in split_der(chain))


# --- helpers ----------------------------------------------------------------------


def _join(fields: Mapping[int, bytes]) -> bytes:
    parts = [MAGIC]
    for tag, value in fields.items():
        parts += [bytes([tag]), _leb128(len(value)), value]
    return b"".join(parts)


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _leb128(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _uvarint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(raw) or shift > 28:
            raise ValueError("a field's length is cut short")
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def pem_der(pem_block: bytes) -> bytes:
    """The DER of one PEM block (a private key's, as a record seals it)."""
    body = b"".join(pem_block.splitlines()[1:-1])
    return base64.b64decode(body, validate=True)


def _pem(label: str, der: bytes) -> bytes:
    return der_to_pem(label, der)


def _serial_field(serial: str) -> dict[int, bytes]:
    """``S``: the serial's bytes, half its hex; ``s`` for a serial that is not plain hex."""
    try:
        number = int(serial, 16)
    except ValueError:
        number = -1
    if number < 0 or format(number, "X") != serial:
        return {ord("s"): serial.encode("ascii")}
    return {ord("S"): number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")}


def _serial(fields: Mapping[int, bytes]) -> bytes:
    raw = fields.get(ord("S"))
    if raw is None:
        return fields[ord("s")]
    return format(int.from_bytes(raw, "big"), "X").encode("ascii")


def seconds(moment: datetime) -> bytes:
    """A time field: Unix seconds, 8 bytes (ValueError if ``moment`` is naive)."""
    if moment.utcoffset() is None:
        raise ValueError("dates must be timezone-aware")
    return _TIME.pack(int(moment.timestamp()))


def _iso(raw: bytes) -> bytes:
    try:
        moment = datetime.fromtimestamp(_TIME.unpack(raw)[0], UTC)
    except (OverflowError, OSError) as exc:
        raise ValueError("a time is out of range") from exc
    return moment.strftime(_ISO).encode("ascii")
