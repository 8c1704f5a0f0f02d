"""ARI (RFC 9773): certificate identifiers and renewal windows; Retry-After and polling times."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from cryptography import x509

from certagent.acme.ari import (
    DEFAULT_CHECK,
    RenewalInfo,
    cert_id,
    next_check,
    parse_renewal_info,
    renewal_time,
    serial_bytes,
)
from certagent.acme.errors import AcmeError, AcmeProtocolError
from certagent.acme.timing import MAX_RETRY_AFTER, parse_retry_after, poll_delays
from certagent.testing.certs import issue_cert, make_ca, shared_key

# RFC 9773 Appendix A: the example certificate; §4.1 gives its identifier.
RFC9773_CERT = b"""-----BEGIN CERTIFICATE-----
MIIBQzCB66ADAgECAgUAh2VDITAKBggqhkjOPQQDAjAVMRMwEQYDVQQDEwpFeGFt
cGxlIENBMCIYDzAwMDEwMTAxMDAwMDAwWhgPMDAwMTAxMDEwMDAwMDBaMBYxFDAS
BgNVBAMTC2V4YW1wbGUuY29tMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEeBZu
7cbpAYNXZLbbh8rNIzuOoqOOtmxA1v7cRm//AwyMwWxyHz4zfwmBhcSrf47NUAFf
qzLQ2PPQxdTXREYEnKMjMCEwHwYDVR0jBBgwFoAUaYhba4dGQEHhs3uEe6CuLN4B
yNQwCgYIKoZIzj0EAwIDRwAwRAIge09+S5TZAlw5tgtiVvuERV6cT4mfutXIlwTb
+FYN/8oCIClDsqBklhB9KAelFiYt9+6FDj3z4KGVelYM5MdsO3pK
-----END CERTIFICATE-----
"""
RFC9773_ID = "aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE"
URL = "https://ca.test/renewal-info/x.y"


def test_rfc9773_example_identifier() -> None:
    cert = x509.load_pem_x509_certificate(RFC9773_CERT)
    assert cert_id(cert) == RFC9773_ID


@pytest.mark.parametrize(
    ("serial", "octets"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (0x7F, b"\x7f"),
        (0x80, b"\x00\x80"),
        (0xFF, b"\x00\xff"),
        (0x100, b"\x01\x00"),
        (0x87654321, b"\x00\x87\x65\x43\x21"),
        ((1 << 159) - 1, b"\x7f" + b"\xff" * 19),
    ],
)
def test_serial_content_octets(serial: int, octets: bytes) -> None:
    assert serial_bytes(serial) == octets


def test_negative_serial_refused() -> None:
    with pytest.raises(AcmeError):
        serial_bytes(-1)


def test_cert_id_of_an_issued_certificate() -> None:
    ca = make_ca()
    cert = issue_cert(ca, "ari.example.com", key=shared_key(), serial=0x0102)
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key())
    assert aki.key_identifier is not None
    ident = cert_id(cert)
    left, right = ident.split(".")
    assert "=" not in ident
    assert right == "AQI"
    assert len(left) == 27  # 20-byte SHA-1 key identifier


def test_cert_id_needs_an_authority_key_identifier() -> None:
    ca = make_ca(intermediate=False)
    with pytest.raises(AcmeError, match="Authority Key Identifier"):
        cert_id(ca.root)


def _info(doc: object) -> RenewalInfo:
    return parse_renewal_info(json.dumps(doc).encode(), URL, retry_after=21600.0)


def test_parse_renewal_info() -> None:
    info = _info(
        {
            "suggestedWindow": {"start": "2025-01-02T04:00:00Z", "end": "2025-01-03T04:00:00Z"},
            "explanationURL": "https://acme.example.com/docs/ari",
            "unknown": [1, 2],
        }
    )
    assert info.start == dt.datetime(2025, 1, 2, 4, tzinfo=dt.UTC)
    assert info.end == dt.datetime(2025, 1, 3, 4, tzinfo=dt.UTC)
    assert info.explanation_url == "https://acme.example.com/docs/ari"
    assert info.retry_after == 21600.0
    assert renewal_time(info, 0.0) == info.start
    assert renewal_time(info, 0.5) == dt.datetime(2025, 1, 2, 16, tzinfo=dt.UTC)
    with pytest.raises(ValueError):
        renewal_time(info, 1.5)


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"suggestedWindow": None},
        {"suggestedWindow": "soon"},
        {"suggestedWindow": {"start": "2025-01-02T04:00:00Z"}},
        {"suggestedWindow": {"start": "2025-01-02T04:00:00Z", "end": "2025-01-02T04:00:00Z"}},
        {"suggestedWindow": {"start": "2025-01-03T04:00:00Z", "end": "2025-01-02T04:00:00Z"}},
        {"suggestedWindow": {"start": "yesterday", "end": "2025-01-02T04:00:00Z"}},
        {"suggestedWindow": {"start": 1735790400, "end": 1735876800}},
        {
            "suggestedWindow": {"start": "2025-01-02T04:00:00Z", "end": "2025-01-03T04:00:00Z"},
            "explanationURL": "javascript:alert(1)",
        },
        [],
    ],
)
def test_invalid_renewal_info_is_refused(doc: object) -> None:
    with pytest.raises(AcmeProtocolError):
        _info(doc)


def test_next_check_clamps_retry_after() -> None:
    assert next_check(None) == DEFAULT_CHECK == 6 * 3600
    assert next_check(1) == 60
    assert next_check(3600) == 3600
    assert next_check(10 * 86400) == 86400


# --- Retry-After and polling ----------------------------------------------------------------

NOW = dt.datetime(2026, 10, 21, 7, 0, 0, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("Wed, 21 Oct 2026 07:28:00 GMT", 28 * 60.0),
        ("Wed, 21 Oct 2026 06:00:00 GMT", 0.0),
        ("Wed, 21 Oct 2026 07:00:30 -0000", 30.0),
        ("99999999999999", MAX_RETRY_AFTER),
        ("Fri, 21 Oct 2099 07:28:00 GMT", MAX_RETRY_AFTER),
    ],
)
def test_retry_after(header: str, seconds: float) -> None:
    assert parse_retry_after(header, NOW) == seconds


@pytest.mark.parametrize(
    "header", [None, "", "-5", "1.5", "soon", "\uff19", "Wed, 99 Oct 2026 07:28:00 GMT", "x" * 100]
)
def test_retry_after_garbage_is_none(header: str | None) -> None:
    assert parse_retry_after(header, NOW) is None


def test_poll_delays_back_off_to_a_cap() -> None:
    delays = poll_delays()
    first = [next(delays) for _ in range(12)]
    assert first[:3] == pytest.approx([0.1, 0.15, 0.225])
    assert first == sorted(first) and first[-1] == 2.0
