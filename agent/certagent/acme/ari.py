"""ACME Renewal Information (RFC 9773), without I/O.

* :func:`cert_id`: the identifier of a certificate, used in the renewalInfo URL
  and in the ``replaces`` field of a newOrder:
  ``base64url(AKI keyIdentifier) "." base64url(DER serial content octets)``.
* :func:`parse_renewal_info`: the CA's suggested window, strictly validated; a
  window whose end is not after its start is refused, as §4.2 requires.
* :func:`renewal_time` and :func:`next_check`: the RFC's recommended choices (a
  uniform random moment in the window; re-ask after ``Retry-After``, clamped to
  one minute .. one day, six hours when the CA did not say or failed).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509

from certagent.acme._doc import load_object
from certagent.acme.errors import AcmeError, AcmeProtocolError
from certagent.acme.jws import b64url

MIN_CHECK = 60.0
MAX_CHECK = 24 * 3600.0
#: §4.3.3: after a long-term error (or without Retry-After), ask again after six hours.
DEFAULT_CHECK = 6 * 3600.0


def serial_bytes(serial: int) -> bytes:
    """The content octets of the DER INTEGER ``serial`` (a leading 0 keeps it positive)."""
    if serial < 0:
        raise AcmeError("a certificate serial number is never negative")
    return serial.to_bytes(serial.bit_length() // 8 + 1, "big")


def cert_id(cert: x509.Certificate) -> str:
    """The RFC 9773 §4.1 certificate identifier of ``cert``.

    Raises :class:`AcmeError` if the certificate has no Authority Key Identifier
    with a keyIdentifier (RFC 5280 requires one on every CA-issued certificate).
    """
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    except x509.ExtensionNotFound as exc:
        raise AcmeError(
            "the certificate has no Authority Key Identifier: it has no ARI identifier"
        ) from exc
    if not aki.key_identifier:
        raise AcmeError("the certificate's Authority Key Identifier has no keyIdentifier")
    return f"{b64url(aki.key_identifier)}.{b64url(serial_bytes(cert.serial_number))}"


@dataclass(frozen=True)
class RenewalInfo:
    """A renewalInfo answer: renew between ``start`` and ``end`` (aware UTC datetimes).

    ``retry_after``: seconds until the CA wants to be asked again, as it said it
    (None: it did not); use :func:`next_check` to turn it into a bounded interval.
    ``explanation_url``: a page for the operator, if the CA gave one.
    """

    start: dt.datetime
    end: dt.datetime
    explanation_url: str | None = None
    retry_after: float | None = None


def parse_renewal_info(body: bytes, url: str, *, retry_after: float | None) -> RenewalInfo:
    """The RenewalInfo object at ``url`` (RFC 9773 §4.2); AcmeProtocolError if invalid."""
    doc = load_object(body, f"renewalInfo ({url})")
    window = doc.doc("suggestedWindow", required=True)
    assert window is not None
    start = window.time("start", required=True)
    end = window.time("end", required=True)
    assert start is not None and end is not None
    if end <= start:
        raise AcmeProtocolError(
            f"the CA's renewalInfo ({url}) has a window that ends ({end:%Y-%m-%dT%H:%M:%SZ})"
            f" before it starts ({start:%Y-%m-%dT%H:%M:%SZ})"
        )
    explanation = doc.url("explanationURL", https_only=False, required=False)
    return RenewalInfo(start, end, explanation, retry_after)


def renewal_time(info: RenewalInfo, fraction: float) -> dt.datetime:
    """The moment ``fraction`` (0 <= f < 1, from a uniform random source) into the window."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction must be within [0, 1]")
    return info.start + (info.end - info.start) * fraction


def next_check(retry_after: float | None) -> float:
    """Seconds until renewalInfo should be fetched again: Retry-After clamped to 1 min .. 1 day."""
    if retry_after is None:
        return DEFAULT_CHECK
    return min(MAX_CHECK, max(MIN_CHECK, retry_after))
