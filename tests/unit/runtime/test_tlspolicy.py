"""The TLS lines of haproxy.cfg: Mozilla's profiles, the operator's lists, and what is refused."""

from __future__ import annotations

import pytest

from certagent.runtime.tlspolicy import (
    CURVES,
    INTERMEDIATE_CIPHERS,
    PQ_CURVES,
    TlsPolicy,
    tls_lines,
)


def test_intermediate_is_tls12_and_13_with_ecdhe_aead_only() -> None:
    text = tls_lines(TlsPolicy())
    assert "ssl-default-bind-options ssl-min-ver TLSv1.2 prefer-client-ciphers" in text
    assert f"ssl-default-bind-ciphers {INTERMEDIATE_CIPHERS}" in text
    suites = INTERMEDIATE_CIPHERS.split(":")
    assert all(s.startswith("ECDHE-") for s in suites)
    assert all(s.endswith(("GCM-SHA256", "GCM-SHA384", "CHACHA20-POLY1305")) for s in suites)
    assert "CBC" not in text and " DHE-" not in text and ":DHE-" not in text


def test_post_quantum_first_only_under_openssl_35() -> None:
    lines = tls_lines(TlsPolicy()).splitlines()
    start = lines.index(".if openssl_version_atleast(3.5.0)")
    assert lines[start : start + 5] == [
        ".if openssl_version_atleast(3.5.0)",
        f"    ssl-default-bind-curves {PQ_CURVES}",
        ".else",
        f"    ssl-default-bind-curves {CURVES}",
        ".endif",
    ]
    assert PQ_CURVES.startswith("X25519MLKEM768:")
    assert "X448" not in PQ_CURVES and "secp521r1" not in PQ_CURVES


def test_modern_is_tls13_only() -> None:
    text = tls_lines(TlsPolicy("modern"))
    assert "ssl-min-ver TLSv1.3" in text
    assert "ssl-default-bind-ciphers " not in text
    assert "ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256" in text


def test_the_operators_lists_replace_the_profiles() -> None:
    text = tls_lines(
        TlsPolicy(
            ciphers="ECDHE-ECDSA-AES256-GCM-SHA384",
            ciphersuites="TLS_AES_256_GCM_SHA384",
            curves="X25519:prime256v1",
        )
    )
    assert "ssl-default-bind-ciphers ECDHE-ECDSA-AES256-GCM-SHA384\n" in text
    assert "ssl-default-bind-ciphersuites TLS_AES_256_GCM_SHA384" in text
    # a list of the operator's is used as given, on every version
    assert "ssl-default-bind-curves X25519:prime256v1" in text
    assert ".if" not in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile": "old"}, "use one of intermediate, modern"),
        ({"ciphers": "ECDHE-RSA-AES128-GCM-SHA256 ssl-min-ver"}, "TLS ciphers"),
        ({"curves": "X25519\n    stats socket /tmp/x"}, "TLS curves"),
        ({"ciphersuites": ""}, "TLS ciphersuites"),
        ({"curves": "X25519:$EVIL"}, "TLS curves"),
        ({"profile": "modern", "ciphers": "ECDHE-RSA-AES128-GCM-SHA256"}, "TLS 1.3 only"),
    ],
)
def test_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TlsPolicy(**kwargs)
