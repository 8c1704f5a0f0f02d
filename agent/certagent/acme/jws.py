"""JSON Web Signatures as ACME uses them (RFC 8555 §6.2, RFC 7515/7518/7638), without I/O.

Every ACME request is a flattened JWS: a protected header naming the algorithm,
a fresh nonce, the request URL and either the account's public key (``jwk``: only
newAccount and a revocation signed by the certificate's key) or the account URL
(``kid``: every other request).  Account keys are ECDSA P-256 (``ES256``: the
signature is the raw 64-byte ``r || s``, not DER) or RSA of at least 2048 bits
(``RS256``).  External account binding (RFC 8555 §7.3.4) is an HMAC JWS over
the account's JWK.

Key material never reaches ``repr()``: :class:`AccountKey` and
:class:`ExternalAccountBinding` show only what identifies them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from certagent.acme.errors import AcmeError

AccountKeyType = Literal["ecdsa", "rsa"]
MIN_RSA_BITS = 2048
_B64URL = re.compile(r"[A-Za-z0-9_-]*\Z")
_HMAC_ALGS = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}


def b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 §2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode unpadded (or padded) base64url; ValueError for anything else."""
    stripped = text.rstrip("=")
    if not _B64URL.match(stripped) or len(stripped) % 4 == 1:
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(stripped + "=" * (-len(stripped) % 4))
    except binascii.Error as exc:  # pragma: no cover - the pattern rules it out
        raise ValueError("not base64url") from exc


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: the form RFC 7638 hashes and the form we send."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _uint(value: int, length: int | None = None) -> str:
    size = length if length is not None else max(1, (value.bit_length() + 7) // 8)
    return b64url(value.to_bytes(size, "big"))


def public_jwk(key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey) -> dict[str, str]:
    """The JWK of a P-256 or RSA public key: the required members only (RFC 7518 §6)."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise AcmeError(f"ACME account keys on {key.curve.name} are not supported: use P-256")
        numbers = key.public_numbers()
        return {"crv": "P-256", "kty": "EC", "x": _uint(numbers.x, 32), "y": _uint(numbers.y, 32)}
    numbers_rsa = key.public_numbers()
    return {"e": _uint(numbers_rsa.e), "kty": "RSA", "n": _uint(numbers_rsa.n)}


_REQUIRED = {"EC": ("crv", "kty", "x", "y"), "RSA": ("e", "kty", "n"), "oct": ("k", "kty")}


def thumbprint(jwk: dict[str, str]) -> str:
    """The RFC 7638 JWK thumbprint: base64url SHA-256 of the required members, sorted."""
    members = _REQUIRED.get(jwk.get("kty", ""))
    if members is None:
        raise ValueError(f"no thumbprint for key type {jwk.get('kty')!r}")
    return b64url(hashlib.sha256(canonical_json({k: jwk[k] for k in members})).digest())


@dataclass(frozen=True, repr=False)
class AccountKey:
    """An ACME account's private key, with its JWK, thumbprint and JWS algorithm.

    Build with :meth:`generate`, :meth:`from_pem` or :meth:`from_private_key`.
    """

    private_key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey = field(compare=False)
    alg: str
    jwk: dict[str, str] = field(compare=False, hash=False)
    thumbprint: str

    @classmethod
    def generate(cls, key_type: AccountKeyType = "ecdsa") -> AccountKey:
        if key_type == "ecdsa":
            return cls.from_private_key(ec.generate_private_key(ec.SECP256R1()))
        if key_type == "rsa":
            return cls.from_private_key(rsa.generate_private_key(65537, MIN_RSA_BITS))
        raise AcmeError(f"unknown ACME account key type {key_type!r}: use ecdsa or rsa")

    @classmethod
    def from_private_key(cls, key: object) -> AccountKey:
        if isinstance(key, ec.EllipticCurvePrivateKey):
            jwk = public_jwk(key.public_key())
            return cls(key, "ES256", jwk, thumbprint(jwk))
        if isinstance(key, rsa.RSAPrivateKey):
            if key.key_size < MIN_RSA_BITS:
                raise AcmeError(
                    f"an RSA ACME account key needs at least {MIN_RSA_BITS} bits,"
                    f" this one has {key.key_size}"
                )
            jwk = public_jwk(key.public_key())
            return cls(key, "RS256", jwk, thumbprint(jwk))
        raise AcmeError(
            f"unsupported ACME account key {type(key).__name__}: use ECDSA P-256 or RSA"
        )

    @classmethod
    def from_pem(cls, data: bytes) -> AccountKey:
        """Load an unencrypted PEM private key (PKCS#8 or traditional)."""
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise AcmeError("the ACME account key is not an unencrypted PEM private key") from exc
        return cls.from_private_key(key)

    def to_pem(self) -> bytes:
        """PKCS#8 PEM, unencrypted: key material, encrypt it before it is stored."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def sign(self, data: bytes) -> bytes:
        """The JWS signature of ``data`` (ES256: raw 64-byte r||s; RS256: PKCS#1 v1.5)."""
        if isinstance(self.private_key, ec.EllipticCurvePrivateKey):
            r, s = decode_dss_signature(self.private_key.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")
        return self.private_key.sign(data, padding.PKCS1v15(), hashes.SHA256())

    def __repr__(self) -> str:
        return f"AccountKey({self.alg}, thumbprint={self.thumbprint})"


@dataclass(frozen=True, repr=False)
class ExternalAccountBinding:
    """EAB credentials a CA hands out (key id and MAC key) to tie an ACME account to a customer.

    ``hmac_key`` is the raw key; :meth:`from_b64` takes the base64url form CAs print.
    """

    kid: str
    hmac_key: bytes = field(compare=False)
    alg: str = "HS256"

    def __post_init__(self) -> None:
        if not self.kid:
            raise AcmeError("the EAB key id is empty")
        if not self.hmac_key:
            raise AcmeError("the EAB HMAC key is empty")
        if self.alg not in _HMAC_ALGS:
            raise AcmeError(f"EAB algorithm {self.alg!r}: use one of {', '.join(_HMAC_ALGS)}")

    @classmethod
    def from_b64(cls, kid: str, hmac_key_b64: str, alg: str = "HS256") -> ExternalAccountBinding:
        try:
            key = b64url_decode(hmac_key_b64.strip())
        except ValueError as exc:
            raise AcmeError(f"the EAB HMAC key for {kid!r} is not base64url") from exc
        return cls(kid, key, alg)

    def __repr__(self) -> str:
        return f"ExternalAccountBinding(kid={self.kid!r}, alg={self.alg})"


def eab_jws(eab: ExternalAccountBinding, account_jwk: dict[str, str], url: str) -> dict[str, str]:
    """The ``externalAccountBinding`` member of a newAccount payload (RFC 8555 §7.3.4).

    An HMAC JWS over the account's JWK, with the CA's key id and the newAccount URL
    in its protected header, and no nonce.
    """
    protected = b64url(canonical_json({"alg": eab.alg, "kid": eab.kid, "url": url}))
    payload = b64url(canonical_json(account_jwk))
    mac = hmac.new(eab.hmac_key, f"{protected}.{payload}".encode(), _HMAC_ALGS[eab.alg])
    return {"protected": protected, "payload": payload, "signature": b64url(mac.digest())}


def sign_request(
    key: AccountKey, payload: dict[str, Any] | None, *, url: str, nonce: str, kid: str | None
) -> bytes:
    """The flattened JWS body of one ACME POST.

    ``payload=None`` is POST-as-GET (an empty payload, RFC 8555 §6.3); ``{}`` is an
    empty JSON object (answering a challenge).  ``kid=None`` puts the ``jwk`` in the
    header instead (newAccount).
    """
    header: dict[str, Any] = {"alg": key.alg, "nonce": nonce, "url": url}
    if kid is None:
        header["jwk"] = key.jwk
    else:
        header["kid"] = kid
    protected = b64url(canonical_json(header))
    body = b64url(canonical_json(payload)) if payload is not None else ""
    signature = key.sign(f"{protected}.{body}".encode("ascii"))
    return canonical_json({"protected": protected, "payload": body, "signature": b64url(signature)})
