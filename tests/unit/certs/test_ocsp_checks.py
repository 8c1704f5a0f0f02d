"""OCSP responses checked against their certificate before they are stored or stapled."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import ocsp as x509ocsp

from certagent.certs.ocsp import (
    build_request,
    check_response,
    issuer_of,
    refresh_at,
    responder_url,
)
from certagent.errors import OcspError
from certagent.testing.certs import CA, issue_cert, make_ca, shared_key
from certagent.testing.ocsp import delegated_responder, ocsp_response


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)  # at each use: collection may be minutes before the test


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca("ocsp test CA")


@pytest.fixture(scope="module")
def leaf(ca: CA) -> x509.Certificate:
    return issue_cert(ca, "o.example.test", key=shared_key())


def chain(ca: CA, leaf: x509.Certificate) -> list[x509.Certificate]:
    return [leaf, *ca.chain]


def test_a_response_from_the_issuer(ca: CA, leaf: x509.Certificate) -> None:
    facts = check_response(ocsp_response(ca, leaf), chain(ca, leaf), now())
    assert facts.status == "good" and facts.next_update is not None
    assert facts.this_update < now() < facts.next_update
    revoked = ocsp_response(ca, leaf, status=x509ocsp.OCSPCertStatus.REVOKED)
    assert check_response(revoked, chain(ca, leaf), now()).status == "revoked"


def test_a_response_from_a_delegated_responder(ca: CA, leaf: x509.Certificate) -> None:
    der = ocsp_response(ca, leaf, signer=delegated_responder(ca))
    assert check_response(der, chain(ca, leaf), now()).status == "good"
    forged = ocsp_response(ca, leaf, signer=delegated_responder(ca, ocsp_signing=False))
    with pytest.raises(OcspError, match="signed neither"):
        check_response(forged, chain(ca, leaf), now())
    stranger = make_ca("someone else")
    with pytest.raises(OcspError, match="signed neither"):
        check_response(
            ocsp_response(ca, leaf, signer=(stranger.cert, stranger.key)), chain(ca, leaf), now()
        )


def test_a_response_for_another_certificate(ca: CA, leaf: x509.Certificate) -> None:
    other = issue_cert(ca, "p.example.test", key=shared_key())
    with pytest.raises(OcspError, match="another certificate"):
        check_response(ocsp_response(ca, other), chain(ca, leaf), now())
    # same serial space, other issuer: the issuer hashes differ
    foreign = make_ca("foreign CA")
    twin = issue_cert(foreign, "o.example.test", key=shared_key(), serial=leaf.serial_number)
    with pytest.raises(OcspError, match="another certificate"):
        check_response(ocsp_response(foreign, twin), chain(ca, leaf), now())


def test_dates(ca: CA, leaf: x509.Certificate) -> None:
    stale = ocsp_response(ca, leaf, this_update=now() - dt.timedelta(days=4))
    with pytest.raises(OcspError, match="expired at its nextUpdate"):
        check_response(stale, chain(ca, leaf), now())
    ahead = ocsp_response(ca, leaf, this_update=now() + dt.timedelta(hours=1))
    with pytest.raises(OcspError, match="ahead"):
        check_response(ahead, chain(ca, leaf), now())


@pytest.mark.parametrize("der", [b"", b"garbage", b"\x30\x03\x0a\x01\x01", b"\x30" * 20_000])
def test_not_a_response(ca: CA, leaf: x509.Certificate, der: bytes) -> None:
    with pytest.raises(OcspError):
        check_response(der, chain(ca, leaf), now())


def test_an_unsuccessful_response(ca: CA, leaf: x509.Certificate) -> None:
    unsuccessful = x509ocsp.OCSPResponseBuilder.build_unsuccessful(
        x509ocsp.OCSPResponseStatus.TRY_LATER
    )
    der = unsuccessful.public_bytes(serialization.Encoding.DER)
    with pytest.raises(OcspError, match="TRY_LATER"):
        check_response(der, chain(ca, leaf), now())


def test_the_issuer_must_be_in_the_chain(ca: CA, leaf: x509.Certificate) -> None:
    assert issuer_of(chain(ca, leaf)) == ca.cert
    with pytest.raises(OcspError, match="intermediate"):
        check_response(ocsp_response(ca, leaf), [leaf], now())


def test_responder_url_and_request(ca: CA) -> None:
    key = shared_key()
    plain = issue_cert(ca, "q.example.test", key=key)
    assert responder_url(plain) is None
    request = x509ocsp.load_der_ocsp_request(build_request(plain, ca.cert))
    assert request.serial_number == plain.serial_number


def test_refresh_at_honours_next_update(ca: CA, leaf: x509.Certificate) -> None:
    facts = check_response(ocsp_response(ca, leaf), chain(ca, leaf), now())
    at = refresh_at(facts, now())
    assert facts.next_update is not None
    assert now() < at < facts.next_update
    assert at <= now() + dt.timedelta(days=1)
