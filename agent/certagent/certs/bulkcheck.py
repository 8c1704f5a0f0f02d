"""Upload validation for many uploads in a row (``cert import``): the same answers, less work.

:class:`UploadChecker` gives, for every upload, exactly what
:func:`~certagent.certs.validate.validate_upload` gives: the same bundle, or
the same error with the same message.  It first tries a fast path that only
accepts: the usual upload (the leaf first, then each certificate's issuer,
one key) passes every check of ``validate_upload`` there, with less work;
anything else (any check failing, any unusual shape) is handed to
``validate_upload`` itself, which finds and words the error.  So an upload is
refused by the one function that refuses uploads, and the fast path needs
only to be no more lenient than it.

Less work, per upload:

* each certificate of the chain after the leaf (an intermediate shared by
  the whole import) is parsed once per checker, not per upload, and whether
  it issued the next one is verified once (by DER bytes: the cache cannot be
  fooled by a look-alike);
* the key is compared with the leaf's public key as key objects (OpenSSL's
  comparison) instead of serialising both to SubjectPublicKeyInfo;
* the leaf's signature is still verified, against the cached issuer, every
  time: the only check that proves the given intermediate issued this leaf.

Cost: one leaf parse, one private key load, one signature verification and
the names per upload; memory: at most :data:`CACHED` chain certificates.
"""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import SignatureAlgorithmOID

from certagent.certs.ocsp import responder_url
from certagent.certs.pem import (
    CERTIFICATE,
    KEY_LABELS,
    CertBundle,
    RsaKeyCheck,
    check_not_ca,
    key_type_of,
    load_private_key,
    names_of,
    probe_rsa_key,
    split_blocks,
)
from certagent.certs.validate import (
    UploadPolicy,
    check_key,
    check_validity,
    issued,
    validate_upload,
)
from certagent.errors import CertificateError

__all__ = ["CACHED", "UploadChecker"]

#: Chain certificates (and their links) kept per checker; all dropped when full.
CACHED = 256


class UploadChecker:
    """``validate_upload(chain, key, now=now, policy=policy, rsa_key_check=...)``, many times.

    Not thread-safe (a cache per checker): one per process or task.
    """

    def __init__(self, policy: UploadPolicy, *, rsa_key_check: RsaKeyCheck = "openssl") -> None:
        self.policy = policy
        self.rsa_key_check: RsaKeyCheck = rsa_key_check
        self._chain: dict[bytes, _ChainCert] = {}  # by block text
        self._links: dict[tuple[bytes, bytes], bool] = {}  # (cert DER, issuer DER) -> issued

    def validate(self, chain_pem: bytes, key_pem: bytes | None, *, now: datetime) -> CertBundle:
        """The bundle, or the error :func:`validate_upload` raises for this upload."""
        bundle = self._fast(chain_pem, key_pem, now)
        if bundle is not None:
            return bundle
        return validate_upload(
            chain_pem, key_pem, now=now, policy=self.policy, rsa_key_check=self.rsa_key_check
        )

    def _fast(self, chain_pem: bytes, key_pem: bytes | None, now: datetime) -> CertBundle | None:
        """The bundle if the upload is the usual shape and passes every check; else None."""
        policy = self.policy
        if now.utcoffset() is None or len(chain_pem) + len(key_pem or b"") > policy.max_bytes:
            return None
        try:
            blocks = split_blocks(chain_pem)
            if key_pem is not None:
                blocks += split_blocks(key_pem)
            cert_texts = [text for label, text in blocks if label == CERTIFICATE]
            key_texts = [text for label, text in blocks if label in KEY_LABELS]
            if (
                not cert_texts
                or len(cert_texts) > policy.max_chain
                or len(key_texts) != 1
                or any(_odd_key(label) for label, _ in blocks)
            ):
                return None
            leaf = x509.load_pem_x509_certificate(cert_texts[0])
            chain = [self._chain_cert(text) for text in cert_texts[1:]]
            key = load_private_key(key_texts[0], unchecked_rsa=self.rsa_key_check != "openssl")
            public = leaf.public_key()
            if key.public_key() != public:
                return None  # the leaf is not first, or no certificate is the key's
            check_not_ca(leaf)
            if self.rsa_key_check == "sign" and isinstance(key, rsa.RSAPrivateKey):
                probe_rsa_key(key, leaf)
            names = names_of(leaf)
            if not names:
                return None
            check_key(public, policy)
            der = leaf.public_bytes(serialization.Encoding.DER)
            bundle = CertBundle(
                pem=b"".join([*cert_texts, key_texts[0]]),
                names=names,
                fingerprint_sha1=_sha1(der),
                fingerprint_sha256=_sha256(der),
                serial=leaf.serial_number,
                not_before=leaf.not_valid_before_utc,
                not_after=leaf.not_valid_after_utc,
                key_type=key_type_of(public),
                ocsp_url=responder_url(leaf),
                ders=(der, *(link.der for link in chain)),
            )
            check_validity(bundle, now, policy)
        except (CertificateError, ValueError, TypeError, UnsupportedAlgorithm):
            return None  # validate_upload says which check failed, in its words
        ders = bundle.ders or ()
        if len(set(ders)) != len(ders):
            return None
        if chain and not chain[0].signed(leaf):
            return None
        for cert, issuer in itertools.pairwise(chain):
            if not self._linked(cert, issuer):
                return None
        return bundle

    def _chain_cert(self, text: bytes) -> _ChainCert:
        """A chain certificate, parsed once per checker (ValueError if it cannot be)."""
        found = self._chain.get(text)
        if found is None:
            found = _ChainCert(x509.load_pem_x509_certificate(text))
            if len(self._chain) >= CACHED:
                self._chain.clear()
            self._chain[text] = found
        return found

    def _linked(self, cert: _ChainCert, issuer: _ChainCert) -> bool:
        """Whether ``issuer`` issued ``cert`` (both from the chain), verified once per pair."""
        pair = (cert.der, issuer.der)
        found = self._links.get(pair)
        if found is None:
            found = issued(issuer.cert, cert.cert)
            if len(self._links) >= CACHED:
                self._links.clear()
            self._links[pair] = found
        return found


class _ChainCert:
    """A certificate after the leaf, with what checking the certificates it issued needs."""

    def __init__(self, cert: x509.Certificate) -> None:
        self.cert = cert
        self.der = cert.public_bytes(serialization.Encoding.DER)
        self._subject: bytes | None = None
        self._key: ec.EllipticCurvePublicKey | None = None
        try:
            self._subject = _tbs_names(cert.tbs_certificate_bytes)[1]
            key = cert.public_key()
        except (ValueError, IndexError, UnsupportedAlgorithm):
            return
        if isinstance(key, ec.EllipticCurvePublicKey):
            self._key = key

    def signed(self, cert: x509.Certificate) -> bool:
        """``issued(self.cert, cert)``: this certificate's subject and key issued ``cert``.

        With an ECDSA key, as ``verify_directly_issued_by`` does it but with this
        certificate's key parsed once and the names compared as DER bytes (equal
        bytes are equal names; any other case goes the full way).
        """
        hashed = _ECDSA_HASHES.get(cert.signature_algorithm_oid)
        if self._key is None or self._subject is None or hashed is None:
            return issued(self.cert, cert)
        tbs = cert.tbs_certificate_bytes
        try:
            if _tbs_names(tbs)[0] != self._subject:
                return issued(self.cert, cert)
            self._key.verify(cert.signature, tbs, ec.ECDSA(hashed()))
        except InvalidSignature:
            return False
        except (ValueError, IndexError):
            return issued(self.cert, cert)
        return True


_ECDSA_HASHES: dict[x509.ObjectIdentifier, type[hashes.HashAlgorithm]] = {
    SignatureAlgorithmOID.ECDSA_WITH_SHA256: hashes.SHA256,
    SignatureAlgorithmOID.ECDSA_WITH_SHA384: hashes.SHA384,
    SignatureAlgorithmOID.ECDSA_WITH_SHA512: hashes.SHA512,
}


def _tbs_names(tbs: bytes) -> tuple[bytes, bytes]:
    """The issuer and subject Names of a TBSCertificate, as their DER (IndexError if short).

    TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature,
    issuer, validity, subject, ... } (RFC 5280): skip to the issuer, then the subject.
    """
    pos = _header(tbs, 0)[0]  # inside the SEQUENCE
    if tbs[pos] == 0xA0:
        pos = _skip(tbs, pos)
    pos = _skip(tbs, _skip(tbs, pos))  # serialNumber, signature
    issuer_end = _skip(tbs, pos)
    subject_start = _skip(tbs, issuer_end)  # validity
    return tbs[pos:issuer_end], tbs[subject_start : _skip(tbs, subject_start)]


def _header(der: bytes, pos: int) -> tuple[int, int]:
    """(where the content of the DER element at ``pos`` starts, its length)."""
    first = der[pos + 1]
    if first < 0x80:
        return pos + 2, first
    count = first & 0x7F
    if not 0 < count <= 4:
        raise ValueError("unsupported DER length")
    return pos + 2 + count, int.from_bytes(der[pos + 2 : pos + 2 + count], "big")


def _skip(der: bytes, pos: int) -> int:
    """Where the DER element after the one at ``pos`` starts."""
    start, length = _header(der, pos)
    if start + length > len(der):
        raise IndexError("DER element runs past the end")
    return start + length


def _odd_key(label: str) -> bool:
    """A key block validate_upload refuses (encrypted, DSA, OpenSSH...)."""
    return label.endswith("PRIVATE KEY") and label not in KEY_LABELS


def _sha1(der: bytes) -> str:
    return hashlib.sha1(der, usedforsecurity=False).hexdigest().upper()


def _sha256(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()
