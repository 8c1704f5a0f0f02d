"""The Redis store's compact record (layout 2): round trips, old records, corrupt ones."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from datetime import UTC, datetime

import pytest
from redis.crc import key_slot

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.pem import CertBundle, parse_bundle, split_blocks
from certagent.errors import KeyDecryptError
from certagent.store.records import make_record
from certagent.store.redis._layout import META_FIELDS, Keys
from certagent.store.redis._packed import (
    MAGIC,
    chain_digest,
    chain_pem,
    is_packed,
    pack_record,
    split_der,
    unpack,
)
from certagent.store.redis._records import RecordEncoder, decode_record, encode_record, meta_fields
from certagent.store.redis._rows import HASH_FIELDS, decode, state_of
from certagent.testing.certs import CA, KeyFormat, KeyType, issue, make_ca, make_key

NOW = datetime(2026, 11, 27, 8, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ring() -> KeyRing:
    return KeyRing.from_text(generate_key_line("k1"))


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def bundle_for(
    ca: CA, *names: str, key_type: KeyType = "ec", fmt: KeyFormat = "pkcs8"
) -> CertBundle:
    chain, key = issue(ca, *names, key=make_key(key_type), key_format=fmt)
    return parse_bundle(chain, key)


def blocks(pem: bytes, label: str) -> list[bytes]:
    return [text for lab, text in split_blocks(pem) if lab == label]


@pytest.mark.parametrize(
    ("key_type", "fmt"),
    [
        ("ec", "pkcs8"),
        ("ec", "traditional"),
        ("rsa", "pkcs8"),
        ("rsa", "traditional"),
        ("ec384", "pkcs8"),
    ],
)
def test_a_record_round_trips_to_the_same_pem(
    ring: KeyRing, ca: CA, key_type: KeyType, fmt: KeyFormat
) -> None:
    bundle = bundle_for(ca, "a.example.test", "*.example.test", key_type=key_type, fmt=fmt)
    record = make_record("0123456789abcdef", bundle, version=3, updated_at=NOW, managed="acme")
    raw, chain = pack_record(ring, record, bundle)
    assert is_packed(raw) and raw.startswith(MAGIC)
    packed = unpack(raw)
    assert decode_record(record.id, packed.meta()) == record
    certs = blocks(bundle.pem, "CERTIFICATE")
    assert packed.leaf_pem() == certs[0]
    assert packed.chain_digest == chain_digest(chain)
    assert chain_pem(chain) == b"".join(certs[1:])
    key = packed.key_pem(ring, record.id)
    assert key == next(t for label, t in split_blocks(bundle.pem) if "PRIVATE KEY" in label)
    rebuilt = parse_bundle(packed.leaf_pem() + chain_pem(chain), key)
    assert rebuilt == bundle
    assert b"PRIVATE KEY" not in raw and key not in raw


def test_a_leaf_alone_has_no_chain(ring: KeyRing) -> None:
    root_only = make_ca(intermediate=False)
    bundle = bundle_for(root_only, "solo.example.test")
    raw, chain = pack_record(ring, make_record("r1", bundle, version=1, updated_at=NOW), bundle)
    assert chain == b"" and unpack(raw).chain_digest is None


def test_a_p256_record_is_small(ring: KeyRing, ca: CA) -> None:
    """What layout 2 is for: ≈1/4 of the layout-1 hash's bytes."""
    bundle = bundle_for(ca, "h0000001.size.test")
    prepared = RecordEncoder(ring).prepare(bundle, NOW)
    old = encode_record(ring, prepared.record, bundle)
    old_bytes = sum(len(str(k)) + len(v) for k, v in old.items())  # type: ignore[arg-type]
    assert len(prepared.payload) < 760 < 2_000 < old_bytes
    assert (
        prepared.shared and chain_digest(prepared.shared) == unpack(prepared.payload).chain_digest
    )


@pytest.mark.parametrize("serial", ["0", "1", "FF", "100", "7FFFFFFF" * 5, "-1F", "0A"])
def test_serials_round_trip(ring: KeyRing, ca: CA, serial: str) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = dataclasses.replace(
        make_record("r1", bundle, version=1, updated_at=NOW), serial=serial
    )
    raw, _ = pack_record(ring, record, bundle)
    assert unpack(raw).meta()["serial"] == serial.encode()


def test_optional_fields_and_updates(ring: KeyRing, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = make_record("r1", bundle, version=1, updated_at=NOW)
    raw, _ = pack_record(ring, record, bundle, ocsp=b"\x30\x03der", dropped=["x.test", "x.test"])
    packed = unpack(raw)
    assert packed.ocsp == b"\x30\x03der" and packed.dropped == b"x.test"
    assert packed.meta()["managed"] is None
    cleared = unpack(packed.with_fields(D=None, m=b"acme"))
    assert cleared.dropped is None and cleared.meta()["managed"] == b"acme"
    assert cleared.ocsp == packed.ocsp and cleared.key_token == packed.key_token
    assert state_of(raw) != state_of(packed.with_fields(D=None))


def test_the_key_is_bound_to_its_record_and_layout(ring: KeyRing, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    raw, _ = pack_record(ring, make_record("r1", bundle, version=1, updated_at=NOW), bundle)
    packed = unpack(raw)
    assert packed.key_token.startswith(b"cak2:k1:")
    with pytest.raises(KeyDecryptError, match="another record"):
        packed.key_pem(ring, "r2")
    with pytest.raises(KeyDecryptError):  # a layout-1 aad (the bare id) does not open it
        keycrypt.decrypt(ring, packed.key_token, b"r1")
    stranger = KeyRing.from_text(generate_key_line("k2"))
    with pytest.raises(KeyDecryptError, match="not in the key ring"):
        packed.key_pem(stranger, "r1")


def test_layout1_hashes_still_decode(ring: KeyRing, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = make_record("r1", bundle, version=2, updated_at=NOW)
    fields = encode_record(ring, record, bundle)
    reply = [fields.get(f) for f in (*META_FIELDS, *HASH_FIELDS, "chain")]
    row = decode(reply, ["chain"])
    assert row is not None and row.packed is None
    assert decode_record("r1", row.meta) == record
    token = fields["key"]
    assert isinstance(token, bytes)
    sha1 = hashlib.sha1(token, usedforsecurity=False).hexdigest()
    assert row.state == f"h2 {sha1} {hashlib.sha1(b'').hexdigest()}  ".encode()
    assert row.fields["key"] == token and row.fields["chain"] == fields["chain"]
    assert decode([None] * (len(META_FIELDS) + 4), ["chain"]) is None  # no such record
    old = meta_fields([fields.get(f) for f in META_FIELDS])
    assert old is not None and decode_record("r1", old) == record


CORRUPT = [
    (b"", "bad magic"),
    (b"\xcaR1nope", "bad magic"),
    (MAGIC + b"n", "cut short"),
    (MAGIC + b"n\x05ab", "cut short"),
    (MAGIC + b"n\x01an\x01a", "twice"),
    (MAGIC + b"Z\x00", "unknown field"),
    (MAGIC + b"n\x01a", "missing"),
    (MAGIC + b"n\xff\xff\xff\xff\xff\xff", "cut short"),
]


@pytest.mark.parametrize(("raw", "match"), CORRUPT)
def test_corrupt_records_say_what_is_wrong(raw: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        unpack(raw)


def test_fields_of_the_wrong_size_are_refused(ring: KeyRing, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    raw, _ = pack_record(ring, make_record("r1", bundle, version=1, updated_at=NOW), bundle)
    packed = unpack(raw)
    with pytest.raises(ValueError, match="not a time"):
        unpack(packed.with_fields(a=b"\x00"))
    with pytest.raises(ValueError, match="not a SHA-256"):
        unpack(packed.with_fields(C=b"\x00" * 31))
    with pytest.raises(ValueError, match="missing"):
        unpack(packed.with_fields(S=None))
    far = unpack(packed.with_fields(a=struct.pack(">q", 2**62)))
    with pytest.raises(ValueError, match="out of range"):
        far.meta()
    with pytest.raises(ValueError, match="not a record"):
        decode(b"a string, not a record")


def test_a_shared_chain_splits_into_its_certificates(ca: CA) -> None:
    deep = make_ca("deep")
    bundle = bundle_for(deep, "a.example.test")
    certs = blocks(bundle.pem, "CERTIFICATE")
    ders = [__import__("base64").b64decode(b"".join(c.splitlines()[1:-1])) for c in certs]
    assert split_der(b"".join(ders)) == ders
    for bad in (b"\x31\x00", b"\x30", b"\x30\x85\x00\x00\x00\x00\x01", ders[0][:-1]):
        with pytest.raises(ValueError):
            split_der(bad)


def test_a_chain_key_is_in_its_own_slot_on_a_cluster() -> None:
    digest = chain_digest(b"\x30\x00")
    assert Keys().chain(digest) == f"certagent:chain:{digest.hex()}"
    tagged = Keys(cluster=True).chain(digest)
    assert tagged == f"certagent:chain:{{{digest.hex()}}}"
    assert key_slot(tagged.encode()) == key_slot(digest.hex().encode())
