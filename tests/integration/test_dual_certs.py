"""ECDSA + RSA for one name: what each HAProxy under test serves per client (openssl s_client).

HAProxy 2.6.12 (src/ssl_sock.c, ssl_sock_switchctx_cbk) looks at the second byte
of each signature algorithm the client offers: 1 is RSA PKCS#1, 3 is ECDSA.  The
RSA-PSS algorithms (0x0804-0x0806) match neither, and ECDSA counts only if the
client also offers an ECDSA TLS 1.2 cipher suite.  Hence its column below; the
one client that fails with both certificates loaded is a client offering RSA-PSS
only, and ``dual_certs = "rsa"`` serves it.  HAProxy 2.9 and 3.2 fixed the choice
(commits 23093c72f and 3912780b1): on Debian's 3.0 and 3.2 (and experimental's
3.4) every client gets a certificate it supports, TLS 1.3 clients ECDSA first.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from certagent.certs.pem import parse_bundle
from certagent.testing import PKI, RedisFixture, Stack, haproxy_build
from certagent.testing.certs import issue, shared_key
from tests.integration.conftest import StackFactory

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl s_client"),
]

HOST = "dual.certs.test"
CLIENTS = {
    "tls1.3 default": ["-tls1_3"],
    "tls1.3 ecdsa only": ["-tls1_3", "-sigalgs", "ecdsa_secp256r1_sha256"],
    "tls1.3 rsa-pss only": ["-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256"],
    "tls1.3 rsa-pss + pkcs1": ["-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256:rsa_pkcs1_sha256"],
    "tls1.2 default": ["-tls1_2"],
    "tls1.2 ecdsa only": ["-tls1_2", "-sigalgs", "ECDSA+SHA256"],
    "tls1.2 rsa pkcs1 only": ["-tls1_2", "-sigalgs", "RSA+SHA256"],
    "tls1.2 rsa-pss only": ["-tls1_2", "-sigalgs", "rsa_pss_rsae_sha256"],
    "tls1.2 ECDHE-RSA cipher only": ["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"],
    "tls1.2 ECDHE-ECDSA cipher only": ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
}
# What each HAProxy serves with both loaded ("fail": the handshake fails, alert 40).
BOTH_26 = {
    "tls1.3 default": "RSA",
    "tls1.3 ecdsa only": "ECDSA",
    "tls1.3 rsa-pss only": "fail",
    "tls1.3 rsa-pss + pkcs1": "RSA",
    "tls1.2 default": "ECDSA",
    "tls1.2 ecdsa only": "ECDSA",
    "tls1.2 rsa pkcs1 only": "RSA",
    "tls1.2 rsa-pss only": "fail",
    "tls1.2 ECDHE-RSA cipher only": "RSA",
    "tls1.2 ECDHE-ECDSA cipher only": "ECDSA",
}
BOTH_3X = {
    **BOTH_26,
    "tls1.3 default": "ECDSA",
    "tls1.3 rsa-pss only": "RSA",
    "tls1.2 rsa-pss only": "RSA",
}
# Measured on each version the test matrix runs (scripts/test.sh); a version not listed
# here fails the test until its column is measured and added.
BOTH = {(2, 6): BOTH_26, (3, 0): BOTH_3X, (3, 2): BOTH_3X, (3, 4): BOTH_3X}
# The clients that get no certificate with both loaded, per version.
FAILING_BOTH = {
    (2, 6): {"tls1.3 rsa-pss only", "tls1.2 rsa-pss only"},
    (3, 0): set(),
    (3, 2): set(),
    (3, 4): set(),
}


def served(stack: Stack, args: list[str]) -> str:
    """``ECDSA``, ``RSA`` (a verified handshake with that key) or ``fail``."""
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{stack.port}", "-servername", HOST,
         "-CAfile", str(stack.cafile), "-verify_return_error", "-verify_hostname", HOST, *args],
        input=b"", capture_output=True, timeout=20,
    )  # fmt: skip
    text = out.stdout.decode(errors="replace")
    if out.returncode != 0 or "Verify return code: 0 (ok)" not in text:
        return "fail"
    bits = re.search(r"Server public key is (\d+) bit", text)
    return "ECDSA" if bits and bits.group(1) == "256" else "RSA"


@pytest.mark.parametrize("policy", ["both", "rsa", "ecdsa"])
def test_what_each_client_gets(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, policy: str
) -> None:
    redis_store.put(
        [parse_bundle(*issue(pki.ca, HOST, key=shared_key(k))) for k in ("ec", "rsa")]
    )
    stack = make_stack(redis_store.url, capacity=10, env={"CERTAGENT_DUAL_CERTS": policy})
    assert stack.handshake(HOST).san == (HOST,)  # loads the name
    got = {name: served(stack, args) for name, args in CLIENTS.items()}
    print(policy, got)
    supports = {
        "ECDSA": {n for n in CLIENTS if "rsa" not in n.lower() or "ECDSA" in n},
        "RSA": {n for n in CLIENTS if "ecdsa" not in n and "ECDSA" not in n},
    }
    if policy == "both":
        branch = haproxy_build().branch
        assert branch in BOTH, f"no dual-certificate column measured for HAProxy {branch}"
        assert got == BOTH[branch]
        assert stack.status()["slots_used"] == 2
        # every client supporting either kind succeeds, except on 2.6 the RSA-PSS-only ones
        failing = {n for n, g in got.items() if g == "fail"}
        assert failing == FAILING_BOTH[branch]
    else:
        kind = policy.upper()
        assert stack.status()["slots_used"] == 1
        assert got == {n: kind if n in supports[kind] else "fail" for n in CLIENTS}
