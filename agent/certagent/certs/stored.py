"""A certificate with its store id: what a store hands out and the runtime loads.

It lives in the certificate layer so that the HAProxy side (``certagent.runtime``)
and the stores (``certagent.store``) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from certagent.certs.pem import CertBundle

__all__ = ["StoredCertificate"]


@dataclass(frozen=True)
class StoredCertificate:
    """A bundle as found in a store.  ``id`` is store-specific and stable for one record.

    ``ocsp``: the DER OCSP response kept with it, to staple (checked when stored).
    """

    id: str
    bundle: CertBundle
    ocsp: bytes | None = None
