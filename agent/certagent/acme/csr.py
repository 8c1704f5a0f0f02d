"""Certificate keys and signing requests for orders, without I/O.

Every certificate gets a key of its own (never the account key, never reused):
ECDSA P-256 by default, RSA-2048 where old clients need it, or both (two orders,
two certificates, HAProxy picks per client).  A P-256 key takes ~50 µs to make,
an RSA-2048 key ~50 ms (do that off the event loop when it matters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from certagent.acme.errors import AcmeError
from certagent.certs.hostname import normalise_pattern

CertKeyType = Literal["ecdsa", "rsa"]
CertKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
#: What a ``key_types`` setting may say: one type, or ``both`` (ECDSA first).
KEY_TYPE_CHOICES = ("ecdsa", "rsa", "both")
RSA_BITS = 2048
#: Let's Encrypt's limit of names per certificate.
MAX_NAMES = 100


def key_types(setting: str) -> tuple[CertKeyType, ...]:
    """``"ecdsa"`` / ``"rsa"`` / ``"both"`` as the key types to order, in order."""
    if setting == "ecdsa":
        return ("ecdsa",)
    if setting == "rsa":
        return ("rsa",)
    if setting == "both":
        return ("ecdsa", "rsa")
    raise AcmeError(f"certificate key type {setting!r}: use one of {', '.join(KEY_TYPE_CHOICES)}")


def new_key(key_type: CertKeyType = "ecdsa") -> CertKey:
    """A fresh private key for one certificate."""
    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(65537, RSA_BITS)
    raise AcmeError(f"certificate key type {key_type!r}: use ecdsa or rsa")


def key_pem(key: CertKey) -> bytes:
    """PKCS#8 PEM, unencrypted (key material: the store encrypts it)."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def order_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` validated and lowercased, duplicates dropped, order kept; 1 to 100 of them."""
    seen: dict[str, None] = {}
    for name in names:
        seen.setdefault(normalise_pattern(name), None)
    if not seen:
        raise AcmeError("an order needs at least one name")
    if len(seen) > MAX_NAMES:
        raise AcmeError(f"an order may name at most {MAX_NAMES} hosts, not {len(seen)}")
    return tuple(seen)


def make_csr(names: Sequence[str], key: CertKey) -> bytes:
    """A DER PKCS#10 request for ``names`` (all in the SAN, the first also as CN if it fits)."""
    valid = order_names(names)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, valid[0])] if len(valid[0]) <= 64 else []
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name(subject))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in valid]), False)
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.DER)
