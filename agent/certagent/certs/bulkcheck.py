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

import binascii
import hashlib
import itertools
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import SignatureAlgorithmOID

from certagent.certs.ocsp import aia_responder_url
from certagent.certs.pem import (
    CERTIFICATE,
    KEY_LABELS,
    CertBundle,
    RsaKeyCheck,
    key_type_of,
    load_private_key,
    names_of,
    normalise_names,
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
        self._curves: dict[str, str | None] = {}  # EC curve -> key type; None: refused

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
            der = _pem_der(cert_texts[0])
            if der is None:
                return None
            leaf = x509.load_der_x509_certificate(der)  # so ``der`` is the leaf, byte for byte
            chain = [self._chain_cert(text) for text in cert_texts[1:]]
            key = load_private_key(key_texts[0], unchecked_rsa=self.rsa_key_check != "openssl")
            public = leaf.public_key()
            if key.public_key() != public:
                return None  # the leaf is not first, or no certificate is the key's
            found = _leaf_extensions(leaf)
            if found is None:
                return None  # a CA certificate: check_not_ca refuses it
            san, aia = found
            if self.rsa_key_check == "sign" and isinstance(key, rsa.RSAPrivateKey):
                probe_rsa_key(key, leaf)
            names = names_of(leaf) if san is None else normalise_names(san)
            if not names:
                return None
            key_type = self._key_type(public)
            if key_type is None:
                return None  # check_key refuses it
            bundle = CertBundle(
                pem=b"".join([*cert_texts, key_texts[0]]),
                names=names,
                fingerprint_sha1=_sha1(der),
                fingerprint_sha256=_sha256(der),
                serial=leaf.serial_number,
                not_before=leaf.not_valid_before_utc,
                not_after=leaf.not_valid_after_utc,
                key_type=key_type,
                ocsp_url=None if aia is None else aia_responder_url(aia),
                ders=(der, *(link.der for link in chain)),
            )
            check_validity(bundle, now, policy)
            ders = bundle.ders or ()
            if len(set(ders)) != len(ders):
                return None
            if chain and not chain[0].signed(leaf, _tbs_of(der)):
                return None
        except (CertificateError, ValueError, TypeError, IndexError, UnsupportedAlgorithm):
            return None  # validate_upload says which check failed, in its words
        for cert, issuer in itertools.pairwise(chain):
            if not self._linked(cert, issuer):
                return None
        return bundle

    def _key_type(self, public: CertificatePublicKeyTypes) -> str | None:
        """``key_type_of(public)`` if ``check_key`` takes it, else None; once per EC curve."""
        if not isinstance(public, ec.EllipticCurvePublicKey):
            try:
                check_key(public, self.policy)
            except CertificateError:
                return None
            return key_type_of(public)
        curve = public.curve.name
        if curve not in self._curves:  # check_key's answer for an EC key is its curve's
            try:
                check_key(public, self.policy)
                self._curves[curve] = key_type_of(public)
            except CertificateError:
                self._curves[curve] = None
        return self._curves[curve]

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

    def signed(self, cert: x509.Certificate, tbs: bytes | None = None) -> bool:
        """``issued(self.cert, cert)``: this certificate's subject and key issued ``cert``.

        With an ECDSA key, as ``verify_directly_issued_by`` does it but with this
        certificate's key parsed once and the names compared as DER bytes (equal
        bytes are equal names; any other case goes the full way).  ``tbs``:
        ``cert.tbs_certificate_bytes`` if the caller has them (cut from the DER
        it parsed ``cert`` from: cryptography encodes them again, ≈7 µs).
        """
        ecdsa = _ECDSA.get(cert.signature_algorithm_oid)
        if self._key is None or self._subject is None or ecdsa is None:
            return issued(self.cert, cert)
        if tbs is None:
            tbs = cert.tbs_certificate_bytes
        try:
            if _tbs_names(tbs)[0] != self._subject:
                return issued(self.cert, cert)
            self._key.verify(cert.signature, tbs, ecdsa)
        except InvalidSignature:
            return False
        except (ValueError, IndexError):
            return issued(self.cert, cert)
        return True


def _leaf_extensions(
    leaf: x509.Certificate,
) -> tuple[list[str] | None, x509.AuthorityInformationAccess | None] | None:
    """The leaf's SAN DNS names and AIA (None: absent), in one pass; None if it is a CA.

    What ``check_not_ca``, ``names_of`` and ``responder_url`` each look up
    (cryptography refuses a certificate with an extension twice: one of each
    at most); ValueError if the extensions cannot be parsed.
    """
    san: list[str] | None = None
    aia: x509.AuthorityInformationAccess | None = None
    for extension in leaf.extensions:
        value = extension.value
        # by exact type: these classes are ABCs, each isinstance ≈1 µs (no subclass is parsed)
        if type(value) is x509.BasicConstraints:
            if value.ca:
                return None
        elif type(value) is x509.SubjectAlternativeName:
            san = value.get_values_for_type(x509.DNSName)
        elif type(value) is x509.AuthorityInformationAccess:
            aia = value
    return san, aia


#: The signature algorithm of each ECDSA signature OID (immutable: made once).
_ECDSA: dict[x509.ObjectIdentifier, ec.ECDSA] = {
    SignatureAlgorithmOID.ECDSA_WITH_SHA256: ec.ECDSA(hashes.SHA256()),
    SignatureAlgorithmOID.ECDSA_WITH_SHA384: ec.ECDSA(hashes.SHA384()),
    SignatureAlgorithmOID.ECDSA_WITH_SHA512: ec.ECDSA(hashes.SHA512()),
}


def _pem_der(text: bytes) -> bytes | None:
    """The DER of one PEM block of :func:`split_blocks` (strict base64); None if not strict.

    What OpenSSL's PEM reader decodes from it, wherever strict base64 decodes it.
    """
    body = text[text.index(b"\n") + 1 : text.rindex(b"-----END ")]
    try:
        return binascii.a2b_base64(body.replace(b"\n", b""), strict_mode=True)
    except binascii.Error:
        return None


def _tbs_of(der: bytes) -> bytes:
    """The TBSCertificate of a certificate's DER (IndexError, ValueError if malformed)."""
    start = _header(der, 0)[0]  # Certificate ::= SEQUENCE { tbsCertificate, ... }
    return der[start : _skip(der, start)]


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
