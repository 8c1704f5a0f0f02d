from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from certagent.certs.pem import (
    CertBundle,
    der_to_pem,
    normalise_pem,
    parse_bundle,
    parse_der_bundle,
    split_blocks,
)
from certagent.errors import (
    CaLeaf,
    CertificateError,
    KeyMismatch,
    MissingKey,
    NoNames,
    PemError,
)
from certagent.testing.certs import (
    CA,
    KeyFormat,
    KeyType,
    cert_pem,
    issue,
    key_pem,
    make_ca,
    make_key,
    shared_key,
)


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def blocks_of(pem: bytes) -> list[str]:
    return [label for label, _ in split_blocks(pem)]


# --- normalise_pem ---------------------------------------------------------------------


def test_normalise_strips_cr_and_blank_lines() -> None:
    raw = b"\r\n-----BEGIN X-----\r\n\r\nAAAA\r\n   \r\n\t\nBBBB\r\n-----END X-----\r\n\r\n\r\n"
    assert normalise_pem(raw) == b"-----BEGIN X-----\nAAAA\nBBBB\n-----END X-----\n"


def test_normalise_adds_trailing_newline_and_is_idempotent() -> None:
    once = normalise_pem(b"a\nb")
    assert once == b"a\nb\n"
    assert normalise_pem(once) == once


@pytest.mark.parametrize("raw", [b"", b"\n", b"\r\n \t\n\n"])
def test_normalise_empty(raw: bytes) -> None:
    assert normalise_pem(raw) == b""


def test_normalise_never_leaves_a_blank_line(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    messy = chain.replace(b"\n", b"\r\n\r\n") + b"\n \n" + key.replace(b"\n", b"\n\n")
    out = normalise_pem(messy)
    assert b"\r" not in out
    assert b"\n\n" not in out
    assert out.endswith(b"\n")
    assert all(line.strip() for line in out.split(b"\n")[:-1])


# --- split_blocks ------------------------------------------------------------------------


def test_split_blocks_labels_in_order_and_ignores_outside_text(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", key_format="traditional")
    preamble = b"Bag Attributes\n    friendlyName: x\nsubject=/CN=a\n"
    data = preamble + chain + b"trailing junk\n" + key
    blocks = split_blocks(data)
    assert [label for label, _ in blocks] == ["CERTIFICATE", "CERTIFICATE", "EC PRIVATE KEY"]
    assert b"".join(text for _, text in blocks) == normalise_pem(chain + key)
    for _, text in blocks:
        assert text.startswith(b"-----BEGIN ")
        assert text.endswith(b"-----\n")


def test_split_blocks_labels() -> None:
    data = b"".join(
        f"-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n".encode()
        for label in ["CERTIFICATE", "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]
    )
    assert blocks_of(data) == ["CERTIFICATE", "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]


@pytest.mark.parametrize(
    "data",
    [
        b"-----BEGIN CERTIFICATE-----\nAA\n"
        b"-----BEGIN CERTIFICATE-----\nBB\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nAA\n-----END PRIVATE KEY-----\n",
        b"AA\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nAA\n",
    ],
    ids=["nested", "mismatched-end", "end-without-begin", "unterminated"],
)
def test_split_blocks_rejects_bad_nesting(data: bytes) -> None:
    with pytest.raises(PemError):
        split_blocks(data)


def test_split_blocks_empty() -> None:
    assert split_blocks(b"no pem here\n") == []


# --- parse_bundle: the good cases ------------------------------------------------------------


def test_parse_separate_chain_and_key(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", "b.example.test")
    bundle = parse_bundle(chain, key)

    leaf = x509.load_pem_x509_certificate(chain)
    assert bundle.pem == normalise_pem(chain + key)
    assert blocks_of(bundle.pem) == ["CERTIFICATE", "CERTIFICATE", "PRIVATE KEY"]
    assert bundle.names == ("a.example.test", "b.example.test")
    assert bundle.fingerprint_sha1 == leaf.fingerprint(hashes.SHA1()).hex().upper()
    assert bundle.fingerprint_sha256 == leaf.fingerprint(hashes.SHA256()).hex()
    assert len(bundle.fingerprint_sha1) == 40
    assert bundle.serial == leaf.serial_number
    assert bundle.not_before == leaf.not_valid_before_utc
    assert bundle.not_after == leaf.not_valid_after_utc
    assert bundle.not_after.utcoffset() == dt.timedelta(0)
    assert bundle.key_type == "ECDSA-P256"


def test_parse_combined_file(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    assert parse_bundle(chain + key) == parse_bundle(chain, key)


def test_parse_crlf_and_blank_lines(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    messy = (b"\r\n" + chain + b"\r\n\r\n" + key).replace(b"\n", b"\r\n")
    bundle = parse_bundle(messy)
    assert bundle.pem == normalise_pem(chain + key)
    assert b"\r" not in bundle.pem
    assert b"\n\n" not in bundle.pem


def test_parse_reorders_leaf_first_key_last(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    leaf_text, inter_text = (text for _, text in split_blocks(chain))
    bundle = parse_bundle(key + inter_text + leaf_text)
    assert bundle.pem == leaf_text + inter_text + normalise_pem(key)
    assert bundle.names == ("a.example.test",)


def test_parse_keeps_chain_order() -> None:
    ca = make_ca()
    chain, key = issue(ca, "a.example.test")
    extra = cert_pem(ca.root)
    bundle = parse_bundle(extra + chain, key)
    leaf_text, inter_text = (text for _, text in split_blocks(chain))
    assert bundle.pem == leaf_text + extra + inter_text + normalise_pem(key)


def test_parse_ignores_text_outside_blocks_and_ec_parameters(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", key_format="traditional")
    params = b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    bundle = parse_bundle(b"junk before\n" + chain + b"junk between\n", params + key)
    assert blocks_of(bundle.pem) == ["CERTIFICATE", "CERTIFICATE", "EC PRIVATE KEY"]
    assert b"junk" not in bundle.pem
    assert b"EC PARAMETERS" not in bundle.pem


def test_parse_keeps_key_text_as_given(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", key_format="traditional")
    bundle = parse_bundle(chain, key)
    assert bundle.pem.endswith(key)
    assert b"-----BEGIN EC PRIVATE KEY-----" in bundle.pem


@pytest.mark.parametrize(
    ("key_type", "expected"),
    [("ec", "ECDSA-P256"), ("ec384", "ECDSA-P384"), ("rsa", "RSA-2048")],
)
def test_key_type(ca: CA, key_type: KeyType, expected: str) -> None:
    chain, key = issue(ca, "a.example.test", key=shared_key(key_type))
    assert parse_bundle(chain, key).key_type == expected


def test_rsa_traditional_key(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", key=shared_key("rsa"), key_format="traditional")
    bundle = parse_bundle(chain + key)
    assert b"-----BEGIN RSA PRIVATE KEY-----" in bundle.pem
    assert bundle.key_type == "RSA-2048"


def test_the_rsa_prime_check_is_skipped_only_when_asked(ca: CA) -> None:
    """A store record skips OpenSSL's slow RSA check (done on upload); the key must still
    match the leaf."""
    good = shared_key("rsa")
    assert isinstance(good, rsa.RSAPrivateKey)
    n = good.private_numbers()
    broken = rsa.RSAPrivateNumbers(
        n.p, n.q, n.d + 2, n.dmp1, n.dmq1, n.iqmp, n.public_numbers
    ).private_key(unsafe_skip_rsa_key_validation=True)
    broken_pem = broken.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain, _ = issue(ca, "a.example.test", key=good)
    with pytest.raises(PemError, match="cannot be parsed"):
        parse_bundle(chain, broken_pem)
    assert parse_bundle(chain, broken_pem, rsa_key_check="match").key_type == "RSA-2048"
    other_chain, _ = issue(ca, "b.example.test", key=shared_key("ec"))
    with pytest.raises(KeyMismatch):
        parse_bundle(other_chain, broken_pem, rsa_key_check="match")


def test_one_key_many_leaves_distinct_fingerprints(ca: CA) -> None:
    key = shared_key()
    a = parse_bundle(*issue(ca, "a.example.test", key=key))
    b = parse_bundle(*issue(ca, "b.example.test", key=key))
    assert a.fingerprint_sha256 != b.fingerprint_sha256
    assert a.serial != b.serial


# --- parse_bundle: names -------------------------------------------------------------------


def test_san_wildcard_and_lowercase(ca: CA) -> None:
    chain, key = issue(ca, "*.Example.TEST", "WWW.example.test", "www.example.test")
    assert parse_bundle(chain, key).names == ("*.example.test", "www.example.test")


def test_invalid_san_names_are_dropped(ca: CA) -> None:
    chain, key = issue(
        ca,
        "bad_name.example.test",
        "*.test",
        "*.*.example.test",
        "a..example.test",
        "-x.example.test",
        "localhost",
        "a b.example.test",
        "",
        "ok.example.test",
        "*.ok.example.test",
    )
    assert parse_bundle(chain, key).names == ("ok.example.test", "*.ok.example.test")


def test_cn_used_only_without_san(ca: CA) -> None:
    chain, key = issue(ca, common_name="Legacy.Example.TEST", san=False)
    assert parse_bundle(chain, key).names == ("legacy.example.test",)


def test_cn_ignored_when_san_present(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", common_name="cn.example.test")
    assert parse_bundle(chain, key).names == ("a.example.test",)


def test_no_names_when_san_has_only_invalid_names_even_with_valid_cn(ca: CA) -> None:
    chain, key = issue(ca, "bad_name.example.test", common_name="good.example.test")
    with pytest.raises(NoNames):
        parse_bundle(chain, key)


def test_no_names_with_ip_only_san(ca: CA) -> None:
    key = shared_key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a.example.test")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("192.0.2.1"))]),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    with pytest.raises(NoNames):
        parse_bundle(cert_pem(cert), key_pem(key))


def test_no_names_with_invalid_cn(ca: CA) -> None:
    chain, key = issue(ca, common_name="not a hostname", san=False)
    with pytest.raises(NoNames):
        parse_bundle(chain, key)


# --- parse_bundle: the bad cases -----------------------------------------------------------


def test_missing_key(ca: CA) -> None:
    chain, _ = issue(ca, "a.example.test")
    with pytest.raises(MissingKey):
        parse_bundle(chain)


def test_key_mismatch(ca: CA) -> None:
    chain, _ = issue(ca, "a.example.test")
    with pytest.raises(KeyMismatch):
        parse_bundle(chain, key_pem(make_key()))


def test_key_of_the_intermediate_does_not_make_it_a_leaf() -> None:
    ca = make_ca()
    chain, _ = issue(ca, "a.example.test")
    # The intermediate's key matches the intermediate: a CA, refused as a leaf.
    with pytest.raises(CaLeaf, match="CA:TRUE"):
        parse_bundle(chain, key_pem(ca.key))


def test_a_ca_certificate_with_a_dns_name_is_no_leaf() -> None:
    key = shared_key("ec")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca.example.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("ca.example.test")]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    with pytest.raises(CaLeaf):
        parse_bundle(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def test_no_certificate(ca: CA) -> None:
    _, key = issue(ca, "a.example.test")
    with pytest.raises(PemError, match="no CERTIFICATE"):
        parse_bundle(key)


def test_garbage() -> None:
    with pytest.raises(PemError):
        parse_bundle(b"\x00\xffnot a pem at all")


def test_garbage_inside_certificate_block(ca: CA) -> None:
    _, key = issue(ca, "a.example.test")
    bad = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    with pytest.raises(PemError, match="certificate #1"):
        parse_bundle(bad, key)


def test_garbage_inside_key_block(ca: CA) -> None:
    chain, _ = issue(ca, "a.example.test")
    bad = b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    with pytest.raises(PemError, match="private key"):
        parse_bundle(chain, bad)


@pytest.mark.parametrize("fmt", ["pkcs8", "traditional"])
def test_encrypted_key(ca: CA, fmt: KeyFormat) -> None:
    key = shared_key()
    chain, _ = issue(ca, "a.example.test", key=key)
    encrypted = key_pem(key, fmt, password=b"secret")
    with pytest.raises(PemError, match="encrypted"):
        parse_bundle(chain, encrypted)


def test_two_keys(ca: CA) -> None:
    key = shared_key()
    chain, pem = issue(ca, "a.example.test", key=key)
    with pytest.raises(PemError, match="2 private keys"):
        parse_bundle(chain + pem, pem)


def test_malformed_nesting_is_pem_error(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    with pytest.raises(PemError):
        parse_bundle(chain[:-30], key)


def test_all_errors_are_certificate_errors() -> None:
    for exc in (PemError, MissingKey, KeyMismatch, NoNames):
        assert issubclass(exc, CertificateError)


# --- CertBundle --------------------------------------------------------------------------------


def test_bundle_is_frozen_and_repr_has_no_key_material(ca: CA) -> None:
    bundle = parse_bundle(*issue(ca, "a.example.test"))
    assert isinstance(bundle, CertBundle)
    assert "PRIVATE KEY" not in repr(bundle)
    assert "a.example.test" in repr(bundle)
    with pytest.raises(dataclasses.FrozenInstanceError):
        bundle.names = ()  # type: ignore[misc]


def test_pem_round_trips_through_parse(ca: CA) -> None:
    bundle = parse_bundle(*issue(ca, "a.example.test", "*.example.test"))
    again = parse_bundle(bundle.pem)
    assert again == bundle
    assert (
        serialization.load_pem_private_key(
            split_blocks(bundle.pem)[-1][1], password=None
        ).public_key()
        == x509.load_pem_x509_certificate(bundle.pem).public_key()
    )


# --- parse_der_bundle (a compact store record's leaf and key, as DER) ---------------------


def _der_parts(chain: bytes, key: bytes) -> tuple[bytes, str, bytes, bytes]:
    """``(leaf DER, key label, key DER, the rest of the chain as PEM)``."""
    blocks = split_blocks(chain)
    (label, key_block), *_ = split_blocks(key)
    return (
        x509.load_pem_x509_certificate(blocks[0][1]).public_bytes(serialization.Encoding.DER),
        label,
        _pem_body(key_block),
        b"".join(text for _, text in blocks[1:]),
    )


def _pem_body(block: bytes) -> bytes:
    return base64.b64decode(b"".join(block.splitlines()[1:-1]))


@pytest.mark.parametrize(
    ("key_type", "fmt"),
    [("ec", "pkcs8"), ("ec", "traditional"), ("ec384", "pkcs8"), ("rsa", "pkcs8"),
     ("rsa", "traditional")],
)  # fmt: skip
def test_der_bundle_is_the_pem_bundle(ca: CA, key_type: KeyType, fmt: KeyFormat) -> None:
    chain, key = issue(ca, "a.example.test", "*.b.example.test", key_type=key_type, key_format=fmt)
    leaf, label, key_der, rest = _der_parts(chain, key)
    assert parse_der_bundle(leaf, label, key_der, rest) == parse_bundle(
        chain, key, rsa_key_check="match"
    )
    assert parse_der_bundle(leaf, label, key_der, rest, rsa_key_check="sign") == parse_bundle(
        chain, key
    )


def test_der_bundle_of_a_leaf_alone(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    leaf, label, key_der, _ = _der_parts(chain, key)
    leaf_pem = split_blocks(chain)[0][1]
    assert parse_der_bundle(leaf, label, key_der) == parse_bundle(leaf_pem, key)


def test_der_bundle_refuses_what_the_pem_bundle_refuses(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    leaf, label, key_der, rest = _der_parts(chain, key)
    other = _pem_body(key_pem(make_key()))
    with pytest.raises(KeyMismatch):
        parse_der_bundle(leaf, label, other, rest)
    with pytest.raises(PemError, match="certificate #1"):
        parse_der_bundle(leaf[:-5], label, key_der, rest)
    with pytest.raises(PemError, match="private key cannot be parsed"):
        parse_der_bundle(leaf, label, key_der[:-5], rest)
    with pytest.raises(PemError, match="not a private key label"):
        parse_der_bundle(leaf, "CERTIFICATE", key_der, rest)
    ca_der = ca.cert.public_bytes(serialization.Encoding.DER)
    with pytest.raises(CaLeaf):
        parse_der_bundle(ca_der, "PRIVATE KEY", _pem_body(key_pem(ca.key)))
    no_names, no_names_key = issue(ca, common_name="not a name", san=False)
    leaf, label, key_der, rest = _der_parts(no_names, no_names_key)
    with pytest.raises(NoNames):
        parse_der_bundle(leaf, label, key_der, rest)


def test_der_to_pem_is_the_normalised_block(ca: CA) -> None:
    chain, _ = issue(ca, "a.example.test")
    block = split_blocks(chain)[0][1]
    assert der_to_pem("CERTIFICATE", _pem_body(block)) == block
