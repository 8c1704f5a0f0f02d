"""Key authorizations, HTTP-01 paths and the RFC 8737 TLS-ALPN-01 certificate; CSRs."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certagent.acme.challenges import (
    ACME_IDENTIFIER_OID,
    ACME_TLS_ALPN,
    acme_identifier_value,
    http01_path,
    key_authorization,
    tls_alpn01_certificate,
)
from certagent.acme.csr import key_pem, key_types, make_csr, new_key, order_names
from certagent.acme.errors import AcmeError, AcmeProtocolError
from certagent.acme.jws import AccountKey
from certagent.acme.messages import validate_token
from certagent.errors import InvalidHostname

TOKEN = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"  # RFC 8555 §8.3 example token


@pytest.fixture(scope="module")
def account() -> AccountKey:
    return AccountKey.generate()


def test_key_authorization_is_token_dot_thumbprint(account: AccountKey) -> None:
    assert key_authorization(TOKEN, account) == f"{TOKEN}.{account.thumbprint}"


def test_http01_path() -> None:
    assert http01_path(TOKEN) == f"/.well-known/acme-challenge/{TOKEN}"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "short",
        "a" * 21,
        "a" * 257,
        "../../etc/passwd-aaaaaaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaa aaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaa\naaaaa",
        "aaaaaaaaaaaaaaaaaaaaaaaa=",
        "aaaaaaaaaaaaaaaaaaaaaaa+/",
        "aaaaaaaaaaaaaaaaaaaaaaaaé",
        "aaaaaaaaaaaaaaaaaaaaaa\x00",
        None,
        12345678901234567890123,
        ["aaaaaaaaaaaaaaaaaaaaaaaaa"],
    ],
)
def test_hostile_tokens_are_refused_everywhere(token: object, account: AccountKey) -> None:
    with pytest.raises(AcmeProtocolError, match="token"):
        validate_token(token)
    if isinstance(token, str):
        with pytest.raises(AcmeProtocolError):
            http01_path(token)
        with pytest.raises(AcmeProtocolError):
            key_authorization(token, account)


def test_tokens_of_22_to_256_base64url_characters_pass() -> None:
    for token in ("A" * 22, "-_" * 128, TOKEN):
        assert validate_token(token) == token


# --- TLS-ALPN-01 (RFC 8737) --------------------------------------------------------------


def test_acme_identifier_value_is_der_octet_string_of_sha256() -> None:
    value = acme_identifier_value("token.thumb")
    assert value[:2] == b"\x04\x20" and len(value) == 34
    assert value[2:] == hashlib.sha256(b"token.thumb").digest()


def test_tls_alpn01_certificate(account: AccountKey) -> None:
    keyauth = key_authorization(TOKEN, account)
    now = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
    made = tls_alpn01_certificate("Www.Example.ORG", keyauth, now=now)
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    assert made.name == "www.example.org"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == ["www.example.org"]
    assert len(list(san.value)) == 1
    ext = cert.extensions.get_extension_for_oid(ACME_IDENTIFIER_OID)
    assert ext.critical
    assert isinstance(ext.value, x509.UnrecognizedExtension)
    assert ext.value.value == b"\x04\x20" + hashlib.sha256(keyauth.encode()).digest()
    assert cert.not_valid_before_utc <= now <= cert.not_valid_after_utc
    assert cert.issuer == cert.subject
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    key = serialization.load_pem_private_key(made.key_pem, None)
    assert key.public_key().public_numbers() == public.public_numbers()  # type: ignore[union-attr]
    assert made.pem == made.cert_pem + made.key_pem
    assert "PRIVATE" not in repr(made)
    assert ACME_TLS_ALPN == "acme-tls/1"


@pytest.mark.parametrize("name", ["*.example.org", "example", "a..b", "192.0.2.1", ""])
def test_tls_alpn01_certificate_refuses_what_it_cannot_validate(name: str) -> None:
    with pytest.raises(InvalidHostname):
        tls_alpn01_certificate(name, f"{TOKEN}.x")


def test_each_challenge_certificate_has_its_own_key() -> None:
    one = tls_alpn01_certificate("a.example.org", "k.a")
    two = tls_alpn01_certificate("a.example.org", "k.a")
    assert one.key_pem != two.key_pem


# --- keys and CSRs -----------------------------------------------------------------------


def test_key_types_setting() -> None:
    assert key_types("ecdsa") == ("ecdsa",)
    assert key_types("rsa") == ("rsa",)
    assert key_types("both") == ("ecdsa", "rsa")
    with pytest.raises(AcmeError, match="ecdsa, rsa, both"):
        key_types("ed25519")


def test_new_keys_are_new_and_of_the_type_asked() -> None:
    one, two = new_key(), new_key("ecdsa")
    assert isinstance(one, ec.EllipticCurvePrivateKey) and isinstance(one.curve, ec.SECP256R1)
    assert one.private_numbers() != two.private_numbers()
    big = new_key("rsa")
    assert isinstance(big, rsa.RSAPrivateKey) and big.key_size == 2048
    assert key_pem(one).startswith(b"-----BEGIN PRIVATE KEY-----")
    with pytest.raises(AcmeError):
        new_key("dsa")  # type: ignore[arg-type]


def test_csr_names_key_and_signature() -> None:
    key = new_key()
    der = make_csr(["B.example.com", "a.example.com", "b.example.com", "*.example.com"], key)
    csr = x509.load_der_x509_csr(der)
    assert csr.is_signature_valid
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "b.example.com",
        "a.example.com",
        "*.example.com",
    ]
    cn = csr.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert [a.value for a in cn] == ["b.example.com"]
    assert csr.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]


def test_csr_leaves_out_a_common_name_that_does_not_fit() -> None:
    long_name = ".".join(["a" * 60, "b" * 60, "example", "com"])
    csr = x509.load_der_x509_csr(make_csr([long_name], new_key()))
    assert csr.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME) == []


def test_order_names_validation() -> None:
    assert order_names(["A.example.com", "a.example.com"]) == ("a.example.com",)
    with pytest.raises(AcmeError, match="at least one"):
        order_names([])
    with pytest.raises(AcmeError, match="at most 100"):
        order_names([f"h{i}.example.com" for i in range(101)])
    for bad in ("bad_name.example.com", "example", "*.com", "a.example.com."):
        with pytest.raises(InvalidHostname):
            order_names([bad])
