"""The one interface to certificate storage, and helpers shared by its implementations."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from cryptography.x509 import ocsp as x509_ocsp

from certagent.certs import hostname
from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle, LeafInfo, parse_bundle
from certagent.errors import CertificateError, InvalidCursor, StoreCorrupt

__all__ = [
    "CertRecord",
    "Change",
    "ChangeKind",
    "Page",
    "Store",
    "StoredCertificate",
    "best_first",
    "candidate_names",
    "check_record",
    "decode_cursor",
    "encode_cursor",
    "load_record",
    "make_record",
    "redact_url",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CertRecord:
    """A stored certificate's metadata.  Never carries key material (safe to return and log)."""

    id: str
    names: tuple[str, ...]
    not_before: datetime
    not_after: datetime
    fingerprint_sha256: str
    serial: str  # uppercase hex
    key_type: str  # "ECDSA-P256", "RSA-2048", ...
    version: int  # 1 on upload, +1 on every rotation
    updated_at: datetime


ChangeKind = Literal["put", "delete", "tls-keys"]


@dataclass(frozen=True)
class Change:
    """One write to the store, as seen by every agent watching it.

    ``names`` holds the record's names before *and* after the write, so an agent
    can find every loaded host the write may affect.  ``tls-keys``: the fleet's
    ticket-key ring rotated (no id, no names).
    """

    kind: ChangeKind
    id: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Page:
    records: tuple[CertRecord, ...]
    cursor: str | None  # pass back to get the next page; None at the end


@dataclass(frozen=True)
class StoredCertificate:
    """A bundle as found in a store.  ``id`` is store-specific and stable for one record.

    ``ocsp``: the DER OCSP response kept with it, to staple (checked when stored).
    """

    id: str
    bundle: CertBundle
    ocsp: bytes | None = None


class Store(Protocol):
    """Where certificates live.  Implementations: RedisStore, DirectoryStore.

    Every method raises :class:`~certagent.errors.StoreUnavailable` when the backend
    cannot be reached; other library exceptions never escape.
    """

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        """The best certificate for a validated, lowercase ``hostname``, or None.

        The first of :meth:`lookup_all`.
        """
        ...

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """Every certificate for ``hostname`` (e.g. an ECDSA and an RSA one), best first.

        Looks for the exact name first, then ``hostname.wildcard_for(hostname)``:
        the exact name's records if it has any, otherwise the wildcard's.  A
        record that does not parse, cannot be decrypted, or whose certificate
        does not cover ``hostname`` is logged (never key material) and left
        out.  Order: see :func:`best_first`.
        """
        ...

    async def put(self, bundle: CertBundle) -> str:
        """Store ``bundle`` unless already stored; return its id (for demos and tests)."""
        ...

    async def add(self, bundle: CertBundle) -> CertRecord:
        """Store a new record (validated by the caller).

        Raises DuplicateCertificate if the store already holds it (the Redis
        store: the same leaf; the directory store: a file for its first name).
        """
        ...

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        """Rotate: same id, new certificate and key, version + 1; NotFound if no such id."""
        ...

    async def delete(self, cert_id: str) -> CertRecord:
        """Remove a record and its names; return what it was.  NotFound if no such id."""
        ...

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Keep an OCSP response with a record, to staple (a ``put`` change).

        Checked first against the record's leaf at ``now``
        (:func:`~certagent.certs.ocsp.check_for_chain`): OcspError if it is not
        a current, signed response about it; NotFound if no such id.
        """
        ...

    async def get(self, cert_id: str) -> CertRecord | None:
        """A record's metadata, or None if there is no record ``cert_id``."""
        ...

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        """Records by id order, at most ``limit`` per page.

        ``name`` matches a record's names exactly (``*.x`` too; InvalidHostname
        if it is not a valid name); ``expiring_before`` keeps records whose
        notAfter is strictly before it.  ``cursor`` is the opaque value of the
        previous page (InvalidCursor if the store did not hand it out).
        """
        ...

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        """Writes after position ``after``, waiting up to ``timeout`` s; and the new position.

        ``after=None`` means "from now": returns no changes and the current
        position.  Raises ChangesLost if ``after`` is too old to replay (the
        caller then reconciles everything it has loaded).
        """
        ...

    def names(self) -> AsyncIterator[str]:
        """Every name (or ``*.`` pattern) some record has, each at least once, any order.

        O(N): the agent reads it once at start to build its name filter
        (:mod:`certagent.service.namefilter`) and again only if that goes stale.
        """
        ...

    async def ping(self) -> None:
        """Return if the store is usable, else raise StoreUnavailable."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str:
        """Where the store is, for logs: a URL without password."""
        ...


def make_record(
    cert_id: str, facts: CertBundle | LeafInfo, *, version: int, updated_at: datetime
) -> CertRecord:
    """The metadata of a record holding the certificate described by ``facts``."""
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


_SECRET_PARAMS = ("password", "sentinel_password")


def redact_url(url: str) -> str:
    """``url`` with any password (userinfo, ``?password=``, ``?sentinel_password=``) as ``***``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
        )
    # Not urlunsplit: it turns "unix:///path" into "unix:/path".
    redacted = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    if query:
        redacted += "?" + query
    if parts.fragment:
        redacted += "#" + parts.fragment
    return redacted
