"""Test certificates made on the fly with ``cryptography``.

Plain functions, shared by unit and integration tests::

    ca = make_ca()                                   # root + intermediate, ECDSA P-256
    chain_pem, key_pem = issue(ca, "a.example.test", "*.example.test")
    bundle = parse_bundle(chain_pem, key_pem)        # chain_pem = leaf + intermediate
    ssl_ctx.load_verify_locations(cadata=ca.root_pem.decode())

ECDSA P-256 keys take microseconds; RSA keys tens of milliseconds.  To issue
many leaves quickly pass ``key=shared_key()`` (one cached key for every leaf).
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyType = Literal["ec", "ec384", "rsa", "rsa3072"]
Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
KeyFormat = Literal["pkcs8", "traditional"]


@dataclass(frozen=True)
class CA:
    """A test PKI: ``root`` is the trust anchor, ``cert``/``key`` issue leaves."""

    root: x509.Certificate
    cert: x509.Certificate
    key: Key
    #: Certificates sent after the leaf (the intermediate, if any).
    chain: tuple[x509.Certificate, ...]

    @property
    def root_pem(self) -> bytes:
        return cert_pem(self.root)

    @property
    def chain_pem(self) -> bytes:
        return b"".join(cert_pem(c) for c in self.chain)


def make_key(key_type: KeyType = "ec") -> Key:
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "ec384":
        return ec.generate_private_key(ec.SECP384R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if key_type == "rsa3072":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    raise ValueError(f"unknown key type {key_type!r}")


@functools.cache
def shared_key(key_type: KeyType = "ec") -> Key:
    """One key per type for the whole test run: reuse it for many leaves."""
    return make_key(key_type)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key, fmt: KeyFormat = "pkcs8", password: bytes | None = None) -> bytes:
    """``PRIVATE KEY`` (pkcs8) or ``EC/RSA PRIVATE KEY`` (traditional), maybe encrypted."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    private_format = (
        serialization.PrivateFormat.PKCS8
        if fmt == "pkcs8"
        else serialization.PrivateFormat.TraditionalOpenSSL
    )
    return key.private_bytes(serialization.Encoding.PEM, private_format, encryption)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca_cert(
    subject: str,
    key: Key,
    issuer: x509.Certificate | None,
    issuer_key: Key,
    path_length: int | None,
) -> x509.Certificate:
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_ca(
    name: str = "certagent test CA", *, intermediate: bool = True, key_type: KeyType = "ec"
) -> CA:
    """A root CA and, by default, an intermediate that issues the leaves."""
    root_key = make_key(key_type)
    root = _ca_cert(f"{name} root", root_key, None, root_key, None)
    if not intermediate:
        return CA(root=root, cert=root, key=root_key, chain=())
    inter_key = make_key(key_type)
    inter = _ca_cert(f"{name} intermediate", inter_key, root, root_key, 0)
    return CA(root=root, cert=inter, key=inter_key, chain=(inter,))


def issue_cert(
    ca: CA,
    *names: str,
    key: Key,
    common_name: str | None = None,
    san: bool = True,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    serial: int | None = None,
) -> x509.Certificate:
    """A leaf certificate for ``key``.

    ``names`` go into the SAN as DNS names, unvalidated (tests put invalid ones
    there on purpose).  ``common_name`` defaults to the first name; with
    ``san=False`` there is no SAN extension at all (CN-only certificate).
    """
    now = _now()
    cn = common_name if common_name is not None else (names[0] if names else "certagent leaf")
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(serial if serial is not None else x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(hours=1))
        .not_valid_after(not_after or now + dt.timedelta(days=90))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
    return builder.sign(ca.key, hashes.SHA256())


def issue(
    ca: CA,
    *names: str,
    key_type: KeyType = "ec",
    key: Key | None = None,
    key_format: KeyFormat = "pkcs8",
    common_name: str | None = None,
    san: bool = True,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    serial: int | None = None,
) -> tuple[bytes, bytes]:
    """``(chain_pem, key_pem)`` for a new leaf: chain is the leaf then ``ca.chain``.

    ``key`` reuses an existing key (e.g. :func:`shared_key`); otherwise a new
    ``key_type`` key is made.
    """
    leaf_key = key if key is not None else make_key(key_type)
    cert = issue_cert(
        ca,
        *names,
        key=leaf_key,
        common_name=common_name,
        san=san,
        not_before=not_before,
        not_after=not_after,
        serial=serial,
    )
    return cert_pem(cert) + ca.chain_pem, key_pem(leaf_key, key_format)


def combined(chain_pem: bytes, key: bytes) -> bytes:
    """A combined PEM file (chain then key), as HAProxy and the directory store read it."""
    return chain_pem + key


# --- unusual certificates, for upload validation tests --------------------------------

OddKeyType = Literal["rsa1024", "p521", "secp256k1", "ed25519", "dsa"]
AnyKey = Key | ed25519.Ed25519PrivateKey | dsa.DSAPrivateKey


def make_odd_key(key_type: OddKeyType) -> AnyKey:
    """Keys certagent refuses (weak or unsupported) but ``cryptography`` can certify."""
    if key_type == "rsa1024":
        return rsa.generate_private_key(public_exponent=65537, key_size=1024)
    if key_type == "p521":
        return ec.generate_private_key(ec.SECP521R1())
    if key_type == "secp256k1":
        return ec.generate_private_key(ec.SECP256K1())
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if key_type == "dsa":
        return dsa.generate_private_key(key_size=2048)
    raise ValueError(f"unknown key type {key_type!r}")


def any_key_pem(key: AnyKey) -> bytes:
    """Unencrypted PKCS#8 ``PRIVATE KEY`` for any key :func:`make_odd_key` makes."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue_odd(
    issuer: CA,
    *names: str,
    key: AnyKey,
    subject: x509.Name | None = None,
    ca: bool = False,
) -> x509.Certificate:
    """A minimal leaf for any key type, valid from an hour ago for 90 days.

    ``names`` go into the SAN (none: no SAN extension); ``subject`` defaults to
    ``CN=<first name>``, or an empty name when there are no names.  ``ca``:
    basicConstraints CA:TRUE (a CA certificate posing as a leaf).
    """
    now = _now()
    if subject is None:
        subject = _name(names[0]) if names else x509.Name([])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=90))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
    return builder.sign(issuer.key, hashes.SHA256())


def make_ca_path(depth: int, name: str = "certagent deep CA", key_type: KeyType = "ec") -> CA:
    """A root and ``depth`` intermediates, each issuing the next; the last issues leaves.

    ``chain`` lists the intermediates leaf-side first, as they follow the leaf.
    """
    root_key = make_key(key_type)
    root = _ca_cert(f"{name} root", root_key, None, root_key, None)
    issuer, issuer_key = root, root_key
    chain: list[x509.Certificate] = []
    for level in range(1, depth + 1):
        inter_key = make_key(key_type)
        inter = _ca_cert(f"{name} intermediate {level}", inter_key, issuer, issuer_key, None)
        chain.insert(0, inter)
        issuer, issuer_key = inter, inter_key
    return CA(root=root, cert=issuer, key=issuer_key, chain=tuple(chain))
