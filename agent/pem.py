"""PEM handling and certificate bundles: pure functions on bytes, no I/O.

HAProxy's runtime API reads a ``set ssl cert <name> <<`` payload up to the first
empty line, so every PEM the agent sends goes through :func:`normalise_pem`
first.  :func:`parse_bundle` turns a chain (and optionally a separate key) into
a :class:`CertBundle`: the exact bytes to send (leaf, chain, key) plus the facts
the agent needs to route and report on it (names, fingerprints, validity).

Nothing here reads files, the clock or the network; expiry checks take ``now``
as a parameter elsewhere.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificatePublicKeyTypes,
    PrivateKeyTypes,
    PublicKeyTypes,
)
from cryptography.x509.oid import NameOID

from agent import hostname
from agent.errors import InvalidHostname, KeyMismatch, MissingKey, NoNames, PemError

__all__ = [
    "CERTIFICATE",
    "KEY_LABELS",
    "CertBundle",
    "LeafInfo",
    "normalise_pem",
    "parse_bundle",
    "parse_leaf",
    "split_blocks",
]

CERTIFICATE = "CERTIFICATE"
#: Labels of unencrypted private keys HAProxy (OpenSSL) accepts in a PEM bundle.
KEY_LABELS = frozenset({"PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"})
_ENCRYPTED_KEY = "ENCRYPTED PRIVATE KEY"

_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9][A-Z0-9 ]*)-----\Z")
_END = re.compile(rb"-----END ([A-Z0-9][A-Z0-9 ]*)-----\Z")

_EC_CURVES = {"secp256r1": "ECDSA-P256", "secp384r1": "ECDSA-P384", "secp521r1": "ECDSA-P521"}


def normalise_pem(data: bytes) -> bytes:
    """Strip ``\\r``, drop blank and whitespace-only lines, end with exactly one ``\\n``.

    Empty (or all-blank) input gives ``b""``.
    """
    lines = [line for line in data.replace(b"\r", b"").split(b"\n") if line.strip()]
    if not lines:
        return b""
    return b"\n".join(lines) + b"\n"


def split_blocks(data: bytes) -> list[tuple[str, bytes]]:
    """Return the PEM blocks of ``data`` as ``(label, text)`` in input order.

    ``text`` is the normalised block from its BEGIN line to its END line, ending
    in ``\\n``.  Text outside blocks is ignored.  Raises :class:`PemError` for a
    BEGIN inside a block, an END without BEGIN or with another label, or a block
    that is never closed.
    """
    blocks: list[tuple[str, bytes]] = []
    label: str | None = None
    current: list[bytes] = []
    for number, raw in enumerate(normalise_pem(data).split(b"\n"), start=1):
        line = raw.strip()
        begin = _BEGIN.match(line)
        end = _END.match(line)
        if begin:
            if label is not None:
                raise PemError(f"line {number}: BEGIN inside the {label} block")
            label = begin.group(1).decode("ascii")
            current = [line]
        elif end:
            end_label = end.group(1).decode("ascii")
            if label is None:
                raise PemError(f"line {number}: END {end_label} without BEGIN")
            if end_label != label:
                raise PemError(f"line {number}: END {end_label} closes a {label} block")
            current.append(line)
            blocks.append((label, b"\n".join(current) + b"\n"))
            label = None
        elif label is not None:
            current.append(line)
    if label is not None:
        raise PemError(f"the {label} block has no END line")
    return blocks


@dataclass(frozen=True)
class CertBundle:
    """A parsed, validated certificate with its chain and private key.

    ``pem`` holds key material: it is left out of ``repr()`` so a bundle can be
    logged.  Never log ``pem`` itself.
    """

    #: Normalised PEM: leaf certificate, chain certificates in input order, private key.
    pem: bytes = field(repr=False)
    #: DNS names (lowercase, ``*.`` wildcards allowed) from the SAN, or the CN if there is no SAN.
    names: tuple[str, ...]
    #: SHA-1 of the leaf DER, uppercase hex without colons, as ``show ssl cert`` prints it.
    fingerprint_sha1: str
    #: SHA-256 of the leaf DER, lowercase hex.
    fingerprint_sha256: str
    serial: int
    not_before: datetime
    not_after: datetime
    #: ``ECDSA-P256``, ``ECDSA-P384``, ``RSA-2048``, ``Ed25519`` ...
    key_type: str


def parse_bundle(chain_pem: bytes, key_pem: bytes | None = None) -> CertBundle:
    """Parse and validate a certificate chain and its private key.

    With ``key_pem=None`` the key must be inside ``chain_pem`` (a combined PEM
    file).  The leaf is the certificate whose public key matches the private
    key, wherever it appears; the other certificates follow it in input order.
    Blocks other than certificates and keys (``EC PARAMETERS``, ``DH
    PARAMETERS``...) are dropped.  The key goes out as the block text given,
    normalised, never re-serialised.

    Raises :class:`PemError` (malformed PEM, no certificate, unparseable or
    encrypted key, more than one key), :class:`MissingKey`, :class:`KeyMismatch`
    and :class:`NoNames`.
    """
    blocks = split_blocks(chain_pem)
    if key_pem is not None:
        blocks += split_blocks(key_pem)

    cert_blocks = [text for label, text in blocks if label == CERTIFICATE]
    key_blocks = [text for label, text in blocks if label in KEY_LABELS]
    if any(label == _ENCRYPTED_KEY for label, _ in blocks):
        raise PemError("the private key is encrypted; give it without a passphrase")
    if not cert_blocks:
        raise PemError("no CERTIFICATE block found")
    if not key_blocks:
        raise MissingKey("no private key found")
    if len(key_blocks) > 1:
        raise PemError(f"{len(key_blocks)} private keys found; expected one")

    certs = [_load_certificate(text, index) for index, text in enumerate(cert_blocks)]
    key = _load_private_key(key_blocks[0])
    key_spki = _spki(key.public_key())

    leaf_index = next(
        (i for i, cert in enumerate(certs) if _cert_spki(cert, i) == key_spki), None
    )
    if leaf_index is None:
        raise KeyMismatch("the private key does not belong to any certificate given")
    leaf = certs[leaf_index]

    names = _names(leaf)
    if not names:
        raise NoNames("the certificate has no valid DNS name in its SAN or CN")

    ordered = [cert_blocks[leaf_index]]
    ordered += [text for i, text in enumerate(cert_blocks) if i != leaf_index]
    der = leaf.public_bytes(serialization.Encoding.DER)
    return CertBundle(
        pem=b"".join([*ordered, key_blocks[0]]),
        names=names,
        fingerprint_sha1=hashlib.sha1(der, usedforsecurity=False).hexdigest().upper(),
        fingerprint_sha256=hashlib.sha256(der).hexdigest(),
        serial=leaf.serial_number,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        key_type=_key_type(key.public_key()),
    )


@dataclass(frozen=True)
class LeafInfo:
    """What a certificate says about itself, read without its private key."""

    names: tuple[str, ...]
    fingerprint_sha1: str
    fingerprint_sha256: str
    serial: int
    not_before: datetime
    not_after: datetime
    key_type: str


def parse_leaf(chain_pem: bytes) -> LeafInfo:
    """The facts of the first certificate in ``chain_pem`` (taken as the leaf); no key needed.

    For listings: cheaper than :func:`parse_bundle` (no private key is loaded),
    but it trusts the order of the file.  Same names and fingerprints as
    :class:`CertBundle`.  Raises :class:`PemError` (no or unparseable
    certificate) and :class:`NoNames`.
    """
    cert_blocks = [text for label, text in split_blocks(chain_pem) if label == CERTIFICATE]
    if not cert_blocks:
        raise PemError("no CERTIFICATE block found")
    leaf = _load_certificate(cert_blocks[0], 0)
    names = _names(leaf)
    if not names:
        raise NoNames("the certificate has no valid DNS name in its SAN or CN")
    try:
        public_key = leaf.public_key()
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PemError("certificate #1 has an unsupported public key") from exc
    der = leaf.public_bytes(serialization.Encoding.DER)
    return LeafInfo(
        names=names,
        fingerprint_sha1=hashlib.sha1(der, usedforsecurity=False).hexdigest().upper(),
        fingerprint_sha256=hashlib.sha256(der).hexdigest(),
        serial=leaf.serial_number,
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        key_type=_key_type(public_key),
    )


# --- helpers ----------------------------------------------------------------------


def _load_certificate(text: bytes, index: int) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(text)
    except ValueError as exc:
        raise PemError(f"certificate #{index + 1} cannot be parsed") from exc


def _load_private_key(text: bytes) -> PrivateKeyTypes:
    # Legacy OpenSSL encryption keeps the "EC/RSA PRIVATE KEY" label and adds headers.
    if b"Proc-Type: 4,ENCRYPTED" in text:
        raise PemError("the private key is encrypted; give it without a passphrase")
    try:
        return serialization.load_pem_private_key(text, password=None)
    except TypeError as exc:  # "Password was not given but private key is encrypted"
        raise PemError("the private key is encrypted; give it without a passphrase") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        # The message of these exceptions never contains key bytes, but keep it out anyway.
        raise PemError("the private key cannot be parsed") from exc


def _cert_spki(cert: x509.Certificate, index: int) -> bytes:
    try:
        return _spki(cert.public_key())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PemError(f"certificate #{index + 1} has an unsupported public key") from exc


def _spki(public_key: CertificatePublicKeyTypes | PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _names(cert: x509.Certificate) -> tuple[str, ...]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        raw = [
            attr.value
            for attr in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
            if isinstance(attr.value, str)
        ]
    except ValueError as exc:  # duplicate or malformed extensions
        raise PemError("the certificate's extensions cannot be parsed") from exc
    else:
        raw = san.value.get_values_for_type(x509.DNSName)

    names: list[str] = []
    for value in raw:
        try:
            name = hostname.normalise_pattern(value.strip().lower())
        except InvalidHostname:
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


def _key_type(key: CertificatePublicKeyTypes | PublicKeyTypes) -> str:
    if isinstance(key, ec.EllipticCurvePublicKey):
        return _EC_CURVES.get(key.curve.name, f"ECDSA-{key.curve.name}")
    if isinstance(key, rsa.RSAPublicKey):
        return f"RSA-{key.key_size}"
    if isinstance(key, ed25519.Ed25519PublicKey):
        return "Ed25519"
    if isinstance(key, ed448.Ed448PublicKey):
        return "Ed448"
    if isinstance(key, dsa.DSAPublicKey):
        return f"DSA-{key.key_size}"
    return type(key).__name__
