"""JWS, JWK, thumbprints and EAB (RFC 8555 §6.2, §7.3.4; RFC 7515/7518/7638)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from certagent.acme.errors import AcmeError
from certagent.acme.jws import (
    AccountKey,
    ExternalAccountBinding,
    b64url,
    b64url_decode,
    canonical_json,
    eab_jws,
    public_jwk,
    sign_request,
    thumbprint,
)
from tests.unit.acme.fakeca import b64d

# RFC 7638 §3.1: the example RSA key and its thumbprint.
RFC7638_N = (
    "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPe"
    "bWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY36"
    "8QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4l"
    "Fd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"
)
RFC7638_THUMBPRINT = "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


@pytest.fixture(scope="module")
def ec_key() -> AccountKey:
    return AccountKey.generate("ecdsa")


@pytest.fixture(scope="module")
def rsa_key() -> AccountKey:
    return AccountKey.generate("rsa")


# --- base64url -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text"),
    [(b"", ""), (b"\xff", "_w"), (b"\xfb\xff", "-_8"), (b"abc", "YWJj"), (b"\x00\x00", "AAA")],
)
def test_b64url_round_trip_without_padding(raw: bytes, text: str) -> None:
    assert b64url(raw) == text
    assert b64url_decode(text) == raw
    assert b64url_decode(text + "=" * (-len(text) % 4)) == raw


@pytest.mark.parametrize("bad", ["a", "ab+c", "ab/c", "ab c", "é", "abc\n", "abcde"])
def test_b64url_decode_refuses_other_alphabets_and_lengths(bad: str) -> None:
    with pytest.raises(ValueError):
        b64url_decode(bad)


# --- JWK and thumbprints ---------------------------------------------------------------


def test_rfc7638_thumbprint_example() -> None:
    jwk = {"kty": "RSA", "n": RFC7638_N, "e": "AQAB", "alg": "RS256", "kid": "2011-04-29"}
    assert thumbprint(jwk) == RFC7638_THUMBPRINT


def test_rfc7638_thumbprint_from_the_key_itself() -> None:
    n = int.from_bytes(b64d(RFC7638_N), "big")
    key = rsa.RSAPublicNumbers(65537, n).public_key()
    jwk = public_jwk(key)
    assert jwk == {"e": "AQAB", "kty": "RSA", "n": RFC7638_N}
    assert thumbprint(jwk) == RFC7638_THUMBPRINT


def test_thumbprint_uses_only_required_members_in_order() -> None:
    jwk = {"y": "Y", "x": "X", "kty": "EC", "crv": "P-256", "use": "sig"}
    expected = b64url(hashlib.sha256(b'{"crv":"P-256","kty":"EC","x":"X","y":"Y"}').digest())
    assert thumbprint(jwk) == expected
    with pytest.raises(ValueError):
        thumbprint({"kty": "OKP", "crv": "Ed25519", "x": "X"})


def test_ec_jwk_coordinates_are_32_bytes_even_with_leading_zeros() -> None:
    for _ in range(300):  # about one key in 128 has a coordinate below 2**248
        key = ec.generate_private_key(ec.SECP256R1()).public_key()
        numbers = key.public_numbers()
        if min(numbers.x, numbers.y) < 1 << 248:
            break
    jwk = public_jwk(key)
    assert len(b64d(jwk["x"])) == 32 and len(b64d(jwk["y"])) == 32
    assert int.from_bytes(b64d(jwk["x"]), "big") == numbers.x
    assert set(jwk) == {"crv", "kty", "x", "y"}


def test_account_key_types(ec_key: AccountKey, rsa_key: AccountKey) -> None:
    assert ec_key.alg == "ES256" and ec_key.jwk["kty"] == "EC"
    assert rsa_key.alg == "RS256" and rsa_key.jwk["kty"] == "RSA"
    assert ec_key.thumbprint == thumbprint(ec_key.jwk)


def test_account_key_pem_round_trip(ec_key: AccountKey, rsa_key: AccountKey) -> None:
    for key in (ec_key, rsa_key):
        again = AccountKey.from_pem(key.to_pem())
        assert again.thumbprint == key.thumbprint and again.alg == key.alg
    traditional = ec_key.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert AccountKey.from_pem(traditional).thumbprint == ec_key.thumbprint


@pytest.mark.parametrize(
    "make",
    [
        lambda: ec.generate_private_key(ec.SECP384R1()),
        lambda: rsa.generate_private_key(65537, 1024),
        lambda: ed25519.Ed25519PrivateKey.generate(),
        lambda: "not a key",
    ],
)
def test_account_key_refuses_other_keys(make: object) -> None:
    with pytest.raises(AcmeError):
        AccountKey.from_private_key(make())  # type: ignore[operator]


def test_account_key_from_bad_pem() -> None:
    with pytest.raises(AcmeError, match="not an unencrypted PEM"):
        AccountKey.from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    encrypted = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(AcmeError):
        AccountKey.from_pem(encrypted)
    with pytest.raises(AcmeError, match="unknown ACME account key type"):
        AccountKey.generate("dsa")  # type: ignore[arg-type]


def test_repr_shows_no_key_material(ec_key: AccountKey) -> None:
    eab = ExternalAccountBinding("kid-1", b"super secret mac key")
    assert "PRIVATE" not in repr(ec_key) and ec_key.thumbprint in repr(ec_key)
    assert "super secret" not in repr(eab) and "kid-1" in repr(eab)
    assert str(ec_key.private_key.private_numbers().private_value) not in repr(ec_key)


# --- signatures --------------------------------------------------------------------------


def test_es256_signature_is_raw_r_and_s(ec_key: AccountKey) -> None:
    signature = ec_key.sign(b"payload")
    assert len(signature) == 64
    r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
    public = ec_key.private_key.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(encode_dss_signature(r, s), b"payload", ec.ECDSA(hashes.SHA256()))
    with pytest.raises(InvalidSignature):
        public.verify(encode_dss_signature(r, s), b"other", ec.ECDSA(hashes.SHA256()))


def test_rs256_signature(rsa_key: AccountKey) -> None:
    signature = rsa_key.sign(b"payload")
    public = rsa_key.private_key.public_key()
    assert isinstance(public, rsa.RSAPublicKey)
    public.verify(signature, b"payload", padding.PKCS1v15(), hashes.SHA256())


def _verify(key: AccountKey, jws: dict[str, str]) -> None:
    signed = f"{jws['protected']}.{jws['payload']}".encode()
    signature = b64d(jws["signature"])
    public = key.private_key.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        der = encode_dss_signature(
            int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        )
        public.verify(der, signed, ec.ECDSA(hashes.SHA256()))
    else:
        public.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())


@pytest.mark.parametrize("which", ["ec", "rsa"])
def test_sign_request_with_kid(which: str, ec_key: AccountKey, rsa_key: AccountKey) -> None:
    key = ec_key if which == "ec" else rsa_key
    body = sign_request(key, {"b": 1, "a": [2]}, url="https://ca/x", nonce="n1", kid="https://ca/a")
    jws = json.loads(body)
    assert set(jws) == {"protected", "payload", "signature"}
    header = json.loads(b64d(jws["protected"]))
    assert header == {"alg": key.alg, "nonce": "n1", "url": "https://ca/x", "kid": "https://ca/a"}
    assert json.loads(b64d(jws["payload"])) == {"a": [2], "b": 1}
    _verify(key, jws)


def test_sign_request_with_jwk_for_new_account(ec_key: AccountKey) -> None:
    jws = json.loads(sign_request(ec_key, {}, url="https://ca/new", nonce="n", kid=None))
    header = json.loads(b64d(jws["protected"]))
    assert header["jwk"] == ec_key.jwk and "kid" not in header


def test_post_as_get_has_an_empty_payload_and_empty_object_is_not(ec_key: AccountKey) -> None:
    get = json.loads(sign_request(ec_key, None, url="https://ca/o", nonce="n", kid="k"))
    empty = json.loads(sign_request(ec_key, {}, url="https://ca/o", nonce="n", kid="k"))
    assert get["payload"] == ""
    assert empty["payload"] == b64url(b"{}") == "e30"
    _verify(ec_key, get)
    _verify(ec_key, empty)


# --- external account binding ----------------------------------------------------------------


def test_eab_jws_is_hmac_over_the_account_jwk(ec_key: AccountKey) -> None:
    mac_key = b"0123456789abcdef0123456789abcdef"
    eab = ExternalAccountBinding.from_b64("kid-7", b64url(mac_key))
    jws = eab_jws(eab, ec_key.jwk, "https://ca/new-acct")
    header = json.loads(b64d(jws["protected"]))
    assert header == {"alg": "HS256", "kid": "kid-7", "url": "https://ca/new-acct"}
    assert "nonce" not in header
    assert json.loads(b64d(jws["payload"])) == ec_key.jwk
    expected = hmac.new(
        mac_key, f"{jws['protected']}.{jws['payload']}".encode(), hashlib.sha256
    ).digest()
    assert b64d(jws["signature"]) == expected
    assert jws["payload"] == b64url(canonical_json(ec_key.jwk))


def test_eab_hs512_and_padded_keys(ec_key: AccountKey) -> None:
    eab = ExternalAccountBinding.from_b64("k", b64url(b"k" * 64) + "==", alg="HS512")
    jws = eab_jws(eab, ec_key.jwk, "https://ca/n")
    assert len(b64d(jws["signature"])) == 64


@pytest.mark.parametrize(
    ("kid", "key", "alg", "message"),
    [
        ("", "AAAA", "HS256", "key id is empty"),
        ("k", "", "HS256", "HMAC key is empty"),
        ("k", "a+b/", "HS256", "not base64url"),
        ("k", "AAAA", "RS256", "EAB algorithm"),
    ],
)
def test_eab_refuses_bad_credentials(kid: str, key: str, alg: str, message: str) -> None:
    with pytest.raises(AcmeError, match=message):
        ExternalAccountBinding.from_b64(kid, key, alg)
