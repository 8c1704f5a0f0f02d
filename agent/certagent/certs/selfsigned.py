"""Self-signed certificates the agent makes for itself (default and placeholder)."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# A freed slot holds a certificate for this name, which no client asks for.
PLACEHOLDER_NAME = "free-slot.certagent.invalid"


def self_signed(common_name: str, dns_names: tuple[str, ...] = (), days: int = 3650) -> bytes:
    """An ECDSA P-256 certificate followed by its PKCS#8 key, as one PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM) + key_pem


def placeholder() -> bytes:
    return self_signed(PLACEHOLDER_NAME, (PLACEHOLDER_NAME,))


def default_certificate() -> bytes:
    """A self-signed ECDSA P-256 certificate + key that clients see as the fallback."""
    return self_signed("certagent default certificate")
