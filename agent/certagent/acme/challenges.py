"""What a challenge asks us to publish (RFC 8555 §8.1, §8.3; RFC 8737), without I/O.

* HTTP-01: answer ``GET /.well-known/acme-challenge/<token>`` on port 80 with the
  key authorization ``<token>.<account key thumbprint>`` as the body.
* TLS-ALPN-01: answer a TLS handshake for the name on port 443 that offers only
  the ALPN protocol ``acme-tls/1`` with a self-signed certificate whose SAN is the
  name and whose critical ``id-pe-acmeIdentifier`` extension holds the SHA-256 of
  the key authorization (:func:`tls_alpn01_certificate`).

Tokens come from the network: :func:`key_authorization` and :func:`http01_path`
validate them (base64url) before they become a URL path or a map key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, ObjectIdentifier

from certagent.acme.jws import AccountKey
from certagent.acme.messages import validate_token
from certagent.certs.hostname import normalise

#: The path prefix HTTP-01 validation requests (RFC 8555 §8.3).
HTTP01_PREFIX = "/.well-known/acme-challenge/"
#: The ALPN protocol of TLS-ALPN-01 validation connections (RFC 8737 §6.2).
ACME_TLS_ALPN = "acme-tls/1"
#: id-pe-acmeIdentifier (RFC 8737 §6.1).
ACME_IDENTIFIER_OID = ObjectIdentifier("1.3.6.1.5.5.7.1.31")
#: How long a challenge certificate claims to be valid (the CA only checks the content).
CHALLENGE_CERT_DAYS = 7


def key_authorization(token: str, account_key: AccountKey) -> str:
    """``token || '.' || thumbprint`` (RFC 8555 §8.1); the token is validated first."""
    return f"{validate_token(token)}.{account_key.thumbprint}"


def http01_path(token: str) -> str:
    """The URL path the CA fetches for HTTP-01: ``/.well-known/acme-challenge/<token>``."""
    return HTTP01_PREFIX + validate_token(token)


def acme_identifier_value(key_authorization: str) -> bytes:
    """The DER of the ``id-pe-acmeIdentifier`` extension: OCTET STRING (SHA-256(keyAuthz))."""
    digest = hashlib.sha256(key_authorization.encode("ascii")).digest()
    return b"\x04\x20" + digest


@dataclass(frozen=True)
class ChallengeCertificate:
    """A TLS-ALPN-01 certificate and its key (PEM).  ``key_pem`` is key material."""

    name: str
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @property
    def pem(self) -> bytes:
        """Certificate then key in one PEM, as HAProxy loads a certificate."""
        return self.cert_pem + self.key_pem


def tls_alpn01_certificate(
    name: str, key_authorization: str, *, now: dt.datetime | None = None
) -> ChallengeCertificate:
    """The self-signed RFC 8737 certificate for ``name`` (a fresh ECDSA P-256 key).

    ``name`` must be a valid hostname (a wildcard cannot be validated by TLS-ALPN-01).
    """
    host = normalise(name)
    when = now if now is not None else dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(when - dt.timedelta(days=1))
        .not_valid_after(when + dt.timedelta(days=CHALLENGE_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(
            x509.UnrecognizedExtension(
                ACME_IDENTIFIER_OID, acme_identifier_value(key_authorization)
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ChallengeCertificate(host, cert.public_bytes(serialization.Encoding.PEM), key_pem)
