"""OCSP responses for stapling: checked against their certificate, pure, no I/O, no clock.

HAProxy staples whatever response it is given if the response's CertID matches
the certificate, and silently staples nothing otherwise; it does not check the
signature or the dates.  :func:`check_response` does, before a response is
stored or sent: a successful basic response, one SingleResponse for this leaf
(serial, issuer name and key hashes), signed by the issuer or by a responder
certificate the issuer delegated (``id-kp-OCSPSigning``), current at ``now``.
:func:`build_request` and :func:`responder_url` are for fetching one from the
certificate's AIA responder; :func:`refresh_at` says when to fetch the next.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509 import ocsp
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID

from certagent.errors import OcspError

__all__ = [
    "MAX_BYTES",
    "OcspFacts",
    "aia_responder_url",
    "build_request",
    "check_for_chain",
    "check_response",
    "issuer_of",
    "refresh_at",
    "responder_url",
]

#: A response larger than this is refused (real ones are 0.5-3 KB).
MAX_BYTES = 16 * 1024
#: Clock skew allowed on thisUpdate.
SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class OcspFacts:
    status: str  # "good", "revoked" or "unknown"
    this_update: datetime
    next_update: datetime | None
    sha256: str  # of the DER, to tell one response from another


def issuer_of(chain: list[x509.Certificate]) -> x509.Certificate:
    """The certificate in ``chain[1:]`` that issued ``chain[0]``; OcspError if none."""
    leaf = chain[0]
    for candidate in chain[1:]:
        try:
            leaf.verify_directly_issued_by(candidate)
        except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
            continue
        return candidate
    raise OcspError(
        "the chain does not hold the leaf's issuer; an OCSP response cannot be checked"
        " or stapled without it: store the certificate with its intermediate"
    )


def check_for_chain(chain_pem: bytes, der: bytes, now: datetime) -> OcspFacts:
    """:func:`check_response` for a stored chain (PEM, leaf first)."""
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError as exc:
        raise OcspError(f"the stored chain cannot be parsed: {exc}") from exc
    return check_response(der, chain, now)


def check_response(der: bytes, chain: list[x509.Certificate], now: datetime) -> OcspFacts:
    """Check ``der`` for ``chain[0]`` (the leaf, its issuer further on) at ``now``."""
    if len(der) > MAX_BYTES:
        raise OcspError(f"the OCSP response is {len(der)} bytes; at most {MAX_BYTES}")
    try:
        response = ocsp.load_der_ocsp_response(der)
    except ValueError as exc:
        raise OcspError(f"not a DER OCSP response: {exc}") from exc
    if response.response_status is not ocsp.OCSPResponseStatus.SUCCESSFUL:
        raise OcspError(f"the OCSP responder answered {response.response_status.name}")
    leaf, issuer = chain[0], issuer_of(chain)
    singles = list(response.responses)
    mine = [s for s in singles if _matches(s, leaf, issuer)]
    if not mine:
        raise OcspError(
            f"the OCSP response is for another certificate (serial {leaf.serial_number:X}"
            " not in it, or another issuer)"
        )
    if len(singles) != 1:
        raise OcspError(f"the OCSP response holds {len(singles)} answers; staple one")
    _check_signature(response, issuer)
    single = mine[0]
    this_update = single.this_update_utc
    next_update = single.next_update_utc
    if this_update > now + SKEW:
        raise OcspError(f"the OCSP response's thisUpdate {this_update.isoformat()} is ahead")
    if next_update is not None and next_update <= now:
        raise OcspError(
            f"the OCSP response expired at its nextUpdate {next_update.isoformat()}; fetch a"
            " new one"
        )
    return OcspFacts(
        status=single.certificate_status.name.lower(),
        this_update=this_update,
        next_update=next_update,
        sha256=hashlib.sha256(der).hexdigest(),
    )


def _matches(
    single: ocsp.OCSPSingleResponse, leaf: x509.Certificate, issuer: x509.Certificate
) -> bool:
    if single.serial_number != leaf.serial_number:
        return False
    # the CertID a request for this leaf would carry, with the response's hash algorithm
    expected = ocsp.OCSPRequestBuilder().add_certificate(leaf, issuer, single.hash_algorithm)
    request = expected.build()
    return (
        single.issuer_name_hash == request.issuer_name_hash
        and single.issuer_key_hash == request.issuer_key_hash
    )


def _check_signature(response: ocsp.OCSPResponse, issuer: x509.Certificate) -> None:
    if not _signed_by(response, issuer):
        delegated = [c for c in response.certificates if _delegated(c, issuer)]
        if not any(_signed_by(response, c) for c in delegated):
            raise OcspError(
                "the OCSP response is signed neither by the certificate's issuer nor by a"
                " responder it delegated (id-kp-OCSPSigning)"
            )


def _delegated(responder: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        responder.verify_directly_issued_by(issuer)
        usage = responder.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm, x509.ExtensionNotFound):
        return False
    return ExtendedKeyUsageOID.OCSP_SIGNING in usage


def _signed_by(response: ocsp.OCSPResponse, signer: x509.Certificate) -> bool:
    key = signer.public_key()
    algorithm = response.signature_hash_algorithm
    try:
        if isinstance(key, rsa.RSAPublicKey) and algorithm is not None:
            key.verify(
                response.signature, response.tbs_response_bytes, padding.PKCS1v15(), algorithm
            )
        elif isinstance(key, ec.EllipticCurvePublicKey) and algorithm is not None:
            key.verify(response.signature, response.tbs_response_bytes, ec.ECDSA(algorithm))
        else:
            return False
    except InvalidSignature:
        return False
    return True


def responder_url(leaf: x509.Certificate) -> str | None:
    """The leaf's AIA OCSP responder URL (http only, as OCSP is), or None."""
    try:
        aia = leaf.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return None
    return aia_responder_url(aia)


def aia_responder_url(aia: x509.AuthorityInformationAccess) -> str | None:
    """:func:`responder_url` of the leaf whose AIA extension is ``aia``."""
    for description in aia:
        location = description.access_location
        if (
            description.access_method == AuthorityInformationAccessOID.OCSP
            and isinstance(location, x509.UniformResourceIdentifier)
            and location.value.startswith("http://")
        ):
            return location.value
    return None


def build_request(leaf: x509.Certificate, issuer: x509.Certificate) -> bytes:
    """A DER OCSP request for ``leaf`` (SHA-1 CertID, as responders expect)."""
    builder = ocsp.OCSPRequestBuilder().add_certificate(leaf, issuer, hashes.SHA1())  # noqa: S303
    return builder.build().public_bytes(serialization.Encoding.DER)


def refresh_at(facts: OcspFacts, now: datetime) -> datetime:
    """When to fetch the next response: halfway to nextUpdate, between 5 min and 1 day on."""
    if facts.next_update is None:
        return now + timedelta(hours=1)
    halfway = facts.this_update + (facts.next_update - facts.this_update) / 2
    return min(max(halfway, now + timedelta(minutes=5)), now + timedelta(days=1))
