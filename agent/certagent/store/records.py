"""What both stores do the same way: build, order, page and check records.

Pure functions, no I/O; :mod:`certagent.store.redis` and
:mod:`certagent.store.directory` call them (and the test double may).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable
from datetime import datetime

from cryptography.x509 import ocsp as x509_ocsp

from certagent.certs import hostname
from certagent.certs.pem import CertBundle, LeafInfo, parse_bundle, parse_der_bundle
from certagent.errors import CertificateError, InvalidCursor, StoreCorrupt
from certagent.store.base import CertRecord, StoredCertificate

__all__ = [
    "best_first",
    "candidate_names",
    "check_der_record",
    "check_record",
    "decode_cursor",
    "encode_cursor",
    "load_record",
    "make_record",
    "ocsp_mismatch",
]

log = logging.getLogger(__name__)


def make_record(
    cert_id: str,
    facts: CertBundle | LeafInfo,
    *,
    version: int,
    updated_at: datetime,
    managed: str = "",
) -> CertRecord:
    """The metadata of a record holding the certificate described by ``facts``.

    ``managed``: ``"acme"`` for a certificate the agent obtained, ``""`` for an upload.
    """
    return CertRecord(
        id=cert_id,
        names=facts.names,
        not_before=facts.not_before,
        not_after=facts.not_after,
        fingerprint_sha256=facts.fingerprint_sha256,
        serial=format(facts.serial, "X"),
        key_type=facts.key_type,
        version=version,
        updated_at=updated_at,
        managed=managed,
    )


def best_first(found: Iterable[StoredCertificate]) -> tuple[StoredCertificate, ...]:
    """``found`` ordered best first: ECDSA before other keys, then later notAfter, then id."""
    return tuple(
        sorted(
            found,
            key=lambda s: (
                not s.bundle.key_type.startswith("ECDSA"),
                -s.bundle.not_after.timestamp(),
                s.id,
            ),
        )
    )


_CURSOR_PREFIX = "c1."


def encode_cursor(last_id: str) -> str:
    """An opaque cursor meaning "the records after ``last_id``"."""
    encoded = base64.urlsafe_b64encode(last_id.encode("utf-8")).rstrip(b"=").decode("ascii")
    return _CURSOR_PREFIX + encoded


def decode_cursor(cursor: str) -> str:
    """The id :func:`encode_cursor` encoded; InvalidCursor for anything else."""
    if not cursor.startswith(_CURSOR_PREFIX) or len(cursor) > 400:
        raise InvalidCursor("the cursor is not one this store handed out; list from the start")
    encoded = cursor[len(_CURSOR_PREFIX) :]
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
        last_id = raw.decode("utf-8")
    except (binascii.Error, ValueError) as exc:
        raise InvalidCursor(
            "the cursor is not one this store handed out; list from the start"
        ) from exc
    if not last_id:
        raise InvalidCursor("the cursor is empty; list from the start")
    return last_id


def candidate_names(name: str) -> tuple[str, ...]:
    """The names to look up for ``name``, in order: itself, then its one-label wildcard.

    Re-validates ``name`` (raises InvalidHostname), so nothing unvalidated ever
    becomes a key or a path.
    """
    name = hostname.normalise(name)
    wildcard = hostname.wildcard_for(name)
    return (name,) if wildcard is None else (name, wildcard)


def load_record(
    store: str, record_id: str, chain_pem: bytes, key_pem: bytes | None = None
) -> StoredCertificate:
    """Parse a stored record; raise StoreCorrupt (naming the record, no key material)."""
    try:
        # Checked in full on upload; the key still has to match the leaf (parse_bundle).
        bundle = parse_bundle(chain_pem, key_pem, rsa_key_check="match")
    except CertificateError as exc:
        raise StoreCorrupt(f"{store}: record {record_id!r} is not a valid bundle: {exc}") from exc
    return StoredCertificate(id=record_id, bundle=bundle)


def check_record(
    store: str,
    record_id: str,
    name: str,
    chain_pem: bytes,
    key_pem: bytes | None = None,
    ocsp: bytes | None = None,
) -> StoredCertificate | None:
    """Parse a record found for ``name``; None (and a warning) if corrupt or not covering it.

    An OCSP response that does not even parse as one for this leaf is dropped
    with a warning (the certificate is served without stapling): HAProxy would
    refuse the load.  Its signature and dates were checked when it was stored.
    """
    try:
        stored = load_record(store, record_id, chain_pem, key_pem)
    except StoreCorrupt as exc:
        log.warning("ignoring store record for %s: %s", name, exc)
        return None
    return _covering(store, record_id, name, stored, ocsp)


def check_der_record(
    store: str,
    record_id: str,
    name: str,
    leaf_der: bytes,
    key: tuple[str, bytes],
    chain_pem: bytes = b"",
    ocsp: bytes | None = None,
) -> StoredCertificate | None:
    """:func:`check_record` for a compact record: its leaf and ``key`` (PEM label, DER)
    as DER, ``chain_pem`` the certificates after the leaf, each parsed once already
    (:func:`~certagent.certs.pem.parse_der_bundle`)."""
    try:
        bundle = parse_der_bundle(leaf_der, *key, chain_pem, rsa_key_check="match")
    except CertificateError as exc:
        log.warning(
            "ignoring store record for %s: %s: record %r is not a valid bundle: %s",
            name,
            store,
            record_id,
            exc,
        )
        return None
    return _covering(store, record_id, name, StoredCertificate(id=record_id, bundle=bundle), ocsp)


def _covering(
    store: str, record_id: str, name: str, stored: StoredCertificate, ocsp: bytes | None
) -> StoredCertificate | None:
    """``stored`` if it covers ``name`` (else None and a warning), with ``ocsp`` if it fits."""
    if not any(hostname.covers(pattern, name) for pattern in stored.bundle.names):
        log.warning(
            "ignoring store record for %s: %s: record %r (sha256 %s) covers only %s",
            name,
            store,
            record_id,
            stored.bundle.fingerprint_sha256,
            " ".join(stored.bundle.names),
        )
        return None
    if ocsp is not None:
        reason = ocsp_mismatch(ocsp, stored.bundle)
        if reason is not None:
            log.warning(
                "%s: not stapling the OCSP response of record %r: %s", store, record_id, reason
            )
            ocsp = None
        stored = StoredCertificate(stored.id, stored.bundle, ocsp)
    return stored


def ocsp_mismatch(der: bytes, bundle: CertBundle) -> str | None:
    """Why ``der`` is not a successful OCSP response about ``bundle``'s leaf; None if it is.

    Structure only (µs): no signature check.
    """
    try:
        response = x509_ocsp.load_der_ocsp_response(der)
        if response.response_status is not x509_ocsp.OCSPResponseStatus.SUCCESSFUL:
            return f"status {response.response_status.name}"
        if response.serial_number != bundle.serial:
            return "it is about another certificate"
    except ValueError as exc:
        return f"not an OCSP response ({exc})"
    return None
