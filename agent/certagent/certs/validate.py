"""Validation of an uploaded certificate chain and key: pure, no I/O, no clock.

:func:`validate_upload` is what ``POST /v1/certificates`` runs on the request
body before anything is stored.  It parses like :func:`certagent.certs.pem.parse_bundle`
(so CRLF line endings, blank lines and a combined chain + key PEM are accepted)
and adds the policy checks of :class:`UploadPolicy`.  Every failure is a
:class:`~certagent.errors.CertificateError` subclass whose ``code`` is stable and
whose message says what to do; :data:`UPLOAD_ERRORS` / :data:`UPLOAD_CODES`
enumerate them for the REST layer and the docs.

The checks run in this order and the first failure is raised:

1. size of the body (``too-large``);
2. PEM structure, before any certificate is parsed: malformed PEM or no
   certificate (``bad-pem``), too many certificates (``chain-too-long``), more
   than one key (``multiple-keys``), no key (``missing-key``), a key with a
   passphrase (``encrypted-key``), a key in a PEM format we do not take
   (``unsupported-key``);
3. :func:`~certagent.certs.pem.parse_blocks`: unparseable certificate or key
   (``bad-pem``), key matching no certificate (``key-mismatch``), the key's
   certificate is a CA (``ca-certificate``), no usable DNS name (``no-names``);
4. the leaf's key: algorithm and curve (``unsupported-key``), RSA size
   (``weak-key``);
5. the leaf's validity at ``now`` (``not-yet-valid``, ``expired``);
6. the chain: a repeated certificate (``duplicate-certificate``), a chain
   that would be valid in another order (``chain-order``), a certificate that
   is not on the leaf's issuer path (``unrelated-chain``).

Only the leaf's dates are checked: a chain may legitimately carry an expired
cross-signed root for old clients (Let's Encrypt did from 2021 to 2024).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from certagent.certs.pem import (
    CERTIFICATE,
    KEY_LABELS,
    CertBundle,
    RsaKeyCheck,
    parse_blocks,
    split_blocks,
)
from certagent.errors import (
    BundleTooLarge,
    CaLeaf,
    CertificateError,
    ChainOrder,
    ChainTooLong,
    ConfigError,
    DuplicateCertificate,
    EncryptedKey,
    Expired,
    KeyMismatch,
    MissingKey,
    MultipleKeys,
    NoNames,
    NotYetValid,
    PemError,
    UnrelatedChain,
    UnsupportedKey,
    WeakKey,
)

__all__ = [
    "CURVES",
    "UPLOAD_CODES",
    "UPLOAD_ERRORS",
    "UploadPolicy",
    "check_key",
    "check_validity",
    "issued",
    "validate_upload",
]

#: Every error :func:`validate_upload` raises, roughly in the order the checks run.
UPLOAD_ERRORS: tuple[type[CertificateError], ...] = (
    BundleTooLarge,
    PemError,
    ChainTooLong,
    MultipleKeys,
    MissingKey,
    EncryptedKey,
    UnsupportedKey,
    KeyMismatch,
    NoNames,
    CaLeaf,
    WeakKey,
    NotYetValid,
    Expired,
    DuplicateCertificate,
    ChainOrder,
    UnrelatedChain,
)
#: Their stable ``code`` strings, for the REST layer's problem types and the docs.
UPLOAD_CODES: tuple[str, ...] = tuple(error.code for error in UPLOAD_ERRORS)

#: cryptography's curve names -> the names policies and messages use.
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}

_ENCRYPTED_LABEL = "ENCRYPTED PRIVATE KEY"
_LEGACY_ENCRYPTION = b"Proc-Type: 4,ENCRYPTED"
_KEY_FORMATS = {"DSA": "a DSA key", "OPENSSH": "an OpenSSH key"}

# Appended to the terse messages of certagent.certs.pem so every message says what to do.
_HINTS = {
    PemError.code: "upload the PEM certificate chain your CA issued"
    " (BEGIN CERTIFICATE blocks) and its unencrypted private key",
    MissingKey.code: "include the certificate's private key, in the body or as the key part",
    KeyMismatch.code: "upload the private key the certificate was issued for"
    " (the one its CSR was made with)",
    NoNames.code: "reissue the certificate with the hostnames in its subjectAltName",
}
_SEARCH_BUDGET = 10_000
_NEW_KEY = "generate a new key and have the certificate reissued for it"


@dataclass(frozen=True)
class UploadPolicy:
    """What an upload must satisfy.  Build it once from the settings."""

    #: Largest accepted body (chain and key together), in bytes.
    max_bytes: int = 256 * 1024
    #: Most certificates in the upload, leaf included.
    max_chain: int = 6
    #: How far in the future notBefore may be (clock skew at the CA).
    not_before_grace: timedelta = timedelta(0)
    #: How long after notAfter a certificate is still accepted.
    expiry_grace: timedelta = timedelta(0)
    #: Smallest RSA modulus, in bits.
    min_rsa_bits: int = 2048
    #: ECDSA curves accepted for the leaf key, as named in :data:`CURVES`.
    allowed_curves: tuple[str, ...] = ("P-256", "P-384")

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError("max_bytes must be at least 1")
        if self.max_chain < 1:
            raise ConfigError("max_chain must be at least 1 (the leaf)")
        if self.not_before_grace < timedelta(0) or self.expiry_grace < timedelta(0):
            raise ConfigError("not_before_grace and expiry_grace must not be negative")
        if self.min_rsa_bits < 1024:
            raise ConfigError("min_rsa_bits must be at least 1024")
        unknown = sorted(set(self.allowed_curves) - set(CURVES.values()))
        if unknown:
            raise ConfigError(
                f"allowed_curves: unknown curve {', '.join(unknown)};"
                f" choose from {', '.join(CURVES.values())}"
            )


def validate_upload(
    chain_pem: bytes,
    key_pem: bytes | None,
    *,
    now: datetime,
    policy: UploadPolicy,
    rsa_key_check: RsaKeyCheck = "openssl",
) -> CertBundle:
    """Check an uploaded chain and key against ``policy`` at ``now``; return the bundle.

    ``key_pem=None`` means the key is inside ``chain_pem`` (a combined PEM).
    The chain must start with the leaf (the certificate of the key), each
    following certificate being the issuer of the one before it.  ``now``
    must be timezone-aware.  Raises one of :data:`UPLOAD_ERRORS`; messages
    never contain key material.  ``rsa_key_check="sign"`` proves an RSA key
    by signing with it instead of OpenSSL's full key check (see
    :data:`~certagent.certs.pem.RsaKeyCheck`); either way a key that cannot
    sign for the certificate is refused (``bad-pem``).

    Each PEM block is split once and each certificate parsed once.
    """
    if now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    size = len(chain_pem) + len(key_pem or b"")
    if size > policy.max_bytes:
        raise BundleTooLarge(
            f"the upload is {size} bytes; the limit is {policy.max_bytes}:"
            " send only the leaf certificate, its intermediates and its key"
        )

    blocks = _split(chain_pem, key_pem)
    _check_structure(blocks, chain_pem, policy)
    try:
        parsed = parse_blocks(blocks, rsa_key_check=rsa_key_check)
    except CertificateError as exc:
        hint = _HINTS.get(exc.code)
        if hint is None:
            raise
        raise type(exc)(f"{exc}; {hint}") from exc

    bundle, certs, leaf = parsed.bundle, parsed.certs, parsed.leaf
    check_key(certs[leaf].public_key(), policy)
    check_validity(bundle, now, policy)
    _check_chain(certs, leaf)
    return bundle


# --- structure ------------------------------------------------------------------------


def _split(chain_pem: bytes, key_pem: bytes | None) -> list[tuple[str, bytes]]:
    try:
        blocks = split_blocks(chain_pem)
        if key_pem is not None:
            blocks += split_blocks(key_pem)
    except PemError as exc:
        raise PemError(f"{exc}; {_HINTS[PemError.code]}") from exc
    return blocks


def _check_structure(
    blocks: Sequence[tuple[str, bytes]], chain_pem: bytes, policy: UploadPolicy
) -> None:
    """Count and classify the PEM blocks (before any certificate is parsed)."""
    certs = [text for label, text in blocks if label == CERTIFICATE]
    keys = [(label, text) for label, text in blocks if label.endswith("PRIVATE KEY")]
    if not certs:
        raise PemError(_no_certificate(chain_pem, [label for label, _ in blocks]))
    if len(certs) > policy.max_chain:
        raise ChainTooLong(
            f"the upload has {len(certs)} certificates; at most {policy.max_chain} are accepted:"
            " send only the leaf and the intermediates your CA issued with it"
        )
    if len(keys) > 1:
        raise MultipleKeys(
            f"the upload has {len(keys)} private keys; send only the key of the certificate"
        )
    if not keys:
        raise MissingKey(f"no private key found; {_HINTS[MissingKey.code]}")
    label, text = keys[0]
    if label == _ENCRYPTED_LABEL or _LEGACY_ENCRYPTION in text:
        raise EncryptedKey(
            "the private key is encrypted with a passphrase; remove it"
            " (openssl pkey -in key.pem -out plain.pem) and upload the plain key"
        )
    if label not in KEY_LABELS:
        kind = _KEY_FORMATS.get(label.split()[0], "a key in an unknown PEM format")
        raise UnsupportedKey(
            f"the private key is {kind}; upload an RSA or ECDSA key in PKCS#8 PEM"
            " (openssl pkcs8 -topk8 -nocrypt)"
        )


def _no_certificate(data: bytes, labels: Sequence[str]) -> str:
    found = sorted({label for label in labels if not label.endswith("PRIVATE KEY")})
    if "CERTIFICATE REQUEST" in found or "NEW CERTIFICATE REQUEST" in found:
        return (
            "the upload holds a certificate request, not a certificate: upload the"
            " certificate your CA issued for it"
        )
    if "PKCS7" in found:
        return "the chain is PKCS#7: convert it with openssl pkcs7 -print_certs and upload the PEM"
    if data[:1] == b"\x30" and b"-----BEGIN" not in data:
        return (
            "the upload looks like binary DER: convert it with"
            " openssl x509 -inform der -out cert.pem and upload the PEM"
        )
    also = f" (found {', '.join(label[:40] for label in found[:5])})" if found else ""
    return f"no certificate found{also}; {_HINTS[PemError.code]}"


# --- key and validity ------------------------------------------------------------------


def check_key(public_key: CertificatePublicKeyTypes, policy: UploadPolicy) -> None:
    accepted = f"use RSA of at least {policy.min_rsa_bits} bits or ECDSA " + " or ".join(
        policy.allowed_curves
    )
    if isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < policy.min_rsa_bits:
            raise WeakKey(
                f"the RSA key has {public_key.key_size} bits, fewer than the"
                f" {policy.min_rsa_bits} required: {_NEW_KEY} ({accepted})"
            )
        return
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        curve = CURVES.get(public_key.curve.name, public_key.curve.name)
        if curve not in policy.allowed_curves:
            raise UnsupportedKey(
                f"ECDSA keys on curve {curve} are not accepted: {_NEW_KEY} ({accepted})"
            )
        return
    raise UnsupportedKey(f"{_key_kind(public_key)} keys are not accepted: {_NEW_KEY} ({accepted})")


def _key_kind(public_key: CertificatePublicKeyTypes) -> str:
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "Ed25519"
    if isinstance(public_key, ed448.Ed448PublicKey):
        return "Ed448"
    if isinstance(public_key, dsa.DSAPublicKey):
        return "DSA"
    return type(public_key).__name__


def check_validity(bundle: CertBundle, now: datetime, policy: UploadPolicy) -> None:
    if now < bundle.not_before - policy.not_before_grace:
        raise NotYetValid(
            f"the certificate is valid only from {_when(bundle.not_before)}"
            f" (now is {_when(now)}): upload it after that time, or check the clock of"
            " the machine that issued it"
        )
    if now > bundle.not_after + policy.expiry_grace:
        raise Expired(
            f"the certificate expired at {_when(bundle.not_after)}"
            f" (now is {_when(now)}): renew it and upload the new certificate"
        )


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- chain ---------------------------------------------------------------------------------


def _check_chain(certs: Sequence[x509.Certificate], leaf: int) -> None:
    """Raise unless ``certs`` is the leaf followed by each certificate's issuer."""
    seen: dict[bytes, int] = {}
    for i, cert in enumerate(certs):
        der = cert.public_bytes(serialization.Encoding.DER)
        if der in seen:
            raise DuplicateCertificate(
                f"certificate #{i + 1} ({_describe(cert)}) repeats certificate"
                f" #{seen[der] + 1}: send each certificate once"
            )
        seen[der] = i

    if leaf == 0 and all(issued(certs[i + 1], certs[i]) for i in range(len(certs) - 1)):
        return

    issuers = [
        [j for j, candidate in enumerate(certs) if j != i and issued(candidate, cert)]
        for i, cert in enumerate(certs)
    ]
    path = _longest_path(leaf, issuers)
    if len(path) == len(certs):
        order = ", ".join(f"#{i + 1}" for i in path)
        if leaf != 0:
            problem = f"the leaf (the certificate of the private key) is #{leaf + 1}, not #1"
        else:
            bad = next(i for i in range(len(certs) - 1) if not issued(certs[i + 1], certs[i]))
            problem = (
                f"certificate #{bad + 2} ({_describe(certs[bad + 1])}) did not issue"
                f" certificate #{bad + 1} ({_describe(certs[bad])})"
            )
        raise ChainOrder(
            f"the chain is out of order: {problem}; send the leaf first, then each"
            f" certificate's issuer: {order}"
        )

    stray = [i for i in range(len(certs)) if i not in path]
    listed = ", ".join(f"#{i + 1} ({_describe(certs[i])})" for i in stray)
    which = f"certificates {listed} are" if len(stray) > 1 else f"certificate {listed} is"
    raise UnrelatedChain(
        f"{which} not part of the leaf's issuer chain; remove"
        f" {'them' if len(stray) > 1 else 'it'} and send the intermediates your CA issued"
        " with this certificate"
    )


def issued(issuer: x509.Certificate, cert: x509.Certificate) -> bool:
    """Whether ``issuer``'s subject is ``cert``'s issuer and its key signed ``cert``.

    verify_directly_issued_by compares the two names (as DER, before any
    signature work: ValueError if they differ) and then the signature, so
    there is no comparison of Name objects here (≈15 us per pair to build them).
    """
    try:
        cert.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return True


def _longest_path(start: int, issuers: Sequence[Sequence[int]]) -> list[int]:
    """The longest issuer path from ``start`` visiting each certificate at most once.

    Stops at the first path through every certificate, and after
    :data:`_SEARCH_BUDGET` steps: self-issued certificates sharing one key all
    "issue" each other, and an upload must not buy a factorial search.
    """
    best = [start]
    budget = _SEARCH_BUDGET

    def walk(path: list[int]) -> bool:
        nonlocal best, budget
        budget -= 1
        if len(path) > len(best):
            best = path
        if len(path) == len(issuers) or budget <= 0:
            return True
        return any(walk([*path, nxt]) for nxt in issuers[path[-1]] if nxt not in path)

    walk([start])
    return best


def _describe(cert: x509.Certificate) -> str:
    subject = cert.subject.rfc4514_string() or "empty subject"
    return subject if len(subject) <= 80 else subject[:77] + "..."
