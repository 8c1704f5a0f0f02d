"""The one interface to certificate storage, and helpers shared by its implementations."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from agent import hostname
from agent.errors import CertificateError, StoreCorrupt
from agent.pem import CertBundle, parse_bundle

__all__ = [
    "Store",
    "StoredCertificate",
    "candidate_names",
    "check_record",
    "load_record",
    "redact_url",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredCertificate:
    """A bundle as found in a store.  ``id`` is store-specific and stable for one record."""

    id: str
    bundle: CertBundle


class Store(Protocol):
    """Where certificates live.  Implementations: RedisStore, DirectoryStore.

    Every method raises :class:`~agent.errors.StoreUnavailable` when the backend
    cannot be reached; other library exceptions never escape.
    """

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        """The certificate for a validated, lowercase ``hostname``, or None.

        Looks for the exact name first, then ``hostname.wildcard_for(hostname)``;
        the first record found decides.  A record that does not parse, or whose
        certificate does not cover ``hostname``, is logged and gives None.
        """
        ...

    async def put(self, bundle: CertBundle) -> str:
        """Store ``bundle`` and point every name in ``bundle.names`` at it; return its id."""
        ...

    async def ping(self) -> None:
        """Return if the store is usable, else raise StoreUnavailable."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> str:
        """Where the store is, for logs: a URL without password."""
        ...


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
        bundle = parse_bundle(chain_pem, key_pem)
    except CertificateError as exc:
        raise StoreCorrupt(f"{store}: record {record_id!r} is not a valid bundle: {exc}") from exc
    return StoredCertificate(id=record_id, bundle=bundle)


def check_record(
    store: str, record_id: str, name: str, chain_pem: bytes, key_pem: bytes | None = None
) -> StoredCertificate | None:
    """Parse a record found for ``name``; None (and a warning) if corrupt or not covering it."""
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
    return stored


def redact_url(url: str) -> str:
    """``url`` with any password (userinfo or ``?password=``) replaced by ``***``."""
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
            [(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*"
        )
    # Not urlunsplit: it turns "unix:///path" into "unix:/path".
    redacted = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else netloc + parts.path
    if query:
        redacted += "?" + query
    if parts.fragment:
        redacted += "#" + parts.fragment
    return redacted
