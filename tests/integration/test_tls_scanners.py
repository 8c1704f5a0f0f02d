"""The generated TLS settings, scanned on the HAProxy under test: testssl.sh and sslyze.

Both scan the public bind for a host with an ECDSA and an RSA certificate, with
the test CA added to their trust.  ``--tls intermediate`` (the default) must pass
sslyze's check against Mozilla's "intermediate" configuration, and testssl.sh
(Debian's package) must find no TLS below 1.2, no CBC suite, and nothing rated
HIGH or CRITICAL but what the private test CA causes (:data:`TEST_CA_FINDINGS`).
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
import sslyze
from sslyze.mozilla_tls_profile import tls_config_checker as mozilla

from certagent.certs.pem import parse_bundle
from certagent.testing import PKI, RedisFixture, Stack, haproxy_build, tlsclient
from certagent.testing.certs import issue
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

HOST = "scan.tls.test"
TESTSSL = shutil.which("testssl") or "/usr/bin/testssl"
# Findings rated HIGH or CRITICAL that come from the test CA, not from the configuration:
# its leaves name no CRL or OCSP URI.  Each is expected once per certificate (ECDSA, RSA).
TEST_CA_FINDINGS = {"cert_revocation": "Neither CRL nor OCSP URI provided"}
# testssl.sh 3.0's cipher categories (-s) that must be empty: NULL, anonymous, export,
# 64-bit and DES, 3DES/IDEA, and "AVERAGE" (SEED and the 128/256-bit CBC suites).
NOT_OFFERED = (
    "SSLv2",
    "SSLv3",
    "TLS1",
    "TLS1_1",
    "cipherlist_NULL",
    "cipherlist_aNULL",
    "cipherlist_EXPORT",
    "cipherlist_LOW",
    "cipherlist_3DES_IDEA",
    "cipherlist_AVERAGE",
)


def _dual_stack(make_stack: StackFactory, redis_store: RedisFixture, pki: PKI) -> Stack:
    redis_store.put([pki.bundle(HOST), parse_bundle(*issue(pki.ca, HOST, key_type="rsa"))])
    stack = make_stack(redis_store.url, capacity=10)
    assert stack.handshake(HOST).san == (HOST,)  # loads both certificates
    assert stack.status()["slots_used"] == 2
    return stack


@pytest.mark.timeout(600)
def test_testssl_finds_nothing_high_but_the_test_ca(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    assert Path(TESTSSL).exists(), "testssl is missing: run scripts/install.sh --test (testssl.sh)"
    stack = _dual_stack(make_stack, redis_store, pki)
    report = tmp_path / "testssl.json"
    # -p protocols, -s cipher categories, -U vulnerabilities, -S certificates and defaults:
    # what the three questions need (about a minute on 2 vCPUs; the full run takes 3)
    run = subprocess.run(
        [TESTSSL, "--quiet", "--color", "0", "--warnings", "off", "-n", "none",
         "--ip", "127.0.0.1", "--add-ca", str(stack.cafile), "-p", "-s", "-U", "-S",
         "--jsonfile", str(report), f"{HOST}:{stack.port}"],
        capture_output=True, timeout=540, cwd=tmp_path,
    )  # fmt: skip
    assert report.exists(), run.stdout.decode(errors="replace")[-3000:]
    findings = json.loads(report.read_text())
    by_id = {f["id"]: f for f in findings}
    print(f"testssl on {haproxy_build().describe()}: {len(findings)} findings")
    for name in NOT_OFFERED:
        assert by_id[name]["finding"].startswith("not offered"), by_id[name]
    assert by_id["TLS1_2"]["finding"].startswith("offered"), by_id["TLS1_2"]
    assert by_id["TLS1_3"]["finding"].startswith("offered"), by_id["TLS1_3"]
    assert by_id["cipherlist_STRONG"]["finding"].startswith("offered")  # AEAD only
    assert by_id["LUCKY13"]["severity"] == "OK", by_id["LUCKY13"]
    serious = [f for f in findings if f["severity"] in ("HIGH", "CRITICAL")]
    from_test_ca = [
        f for f in serious if TEST_CA_FINDINGS.get(f["id"].split(" ")[0]) == f["finding"]
    ]
    assert [f for f in serious if f not in from_test_ca] == []
    assert len(from_test_ca) == 2 * len(TEST_CA_FINDINGS)  # both certificates, nothing else


# sslyze's bundled trust stores hold an old root with a negative serial number
@pytest.mark.filterwarnings("ignore:Parsed a serial number which wasn't positive")
def test_sslyze_mozilla_intermediate_passes(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    stack = _dual_stack(make_stack, redis_store, pki)
    request = sslyze.ServerScanRequest(
        server_location=sslyze.ServerNetworkLocation(HOST, stack.port, ip_address="127.0.0.1"),
        scan_commands=mozilla.SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER,
        scan_commands_extra_arguments=sslyze.ScanCommandsExtraArguments(
            certificate_info=sslyze.CertificateInfoExtraArgument(custom_ca_file=stack.cafile)
        ),
    )
    scanner = sslyze.Scanner()
    scanner.queue_scans([request])
    (result,) = list(scanner.get_results())
    assert result.scan_status == sslyze.ServerScanStatusEnum.COMPLETED, result
    profile = mozilla.MozillaTlsConfiguration.get(mozilla.TlsConfigurationEnum.MOZILLA_INTERMEDIATE)
    mozilla.check_server_against_tls_configuration(result, profile)  # raises with the issues
    assert result.scan_result is not None
    curves = result.scan_result.elliptic_curves.result
    assert curves is not None and curves.supported_curves is not None
    assert {c.name for c in curves.supported_curves} == {"X25519", "secp256r1", "secp384r1"}


def test_modern_refuses_tls12_and_custom_lists_are_used_as_given(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle(HOST)])
    modern = make_stack(redis_store.url, capacity=10, init_args=["--tls", "modern"])
    assert modern.handshake(HOST).san == (HOST,)
    tls12 = tlsclient.client_context(modern.cafile)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        tlsclient.handshake(modern.port, HOST, context=tls12)
    custom = make_stack(
        redis_store.url,
        capacity=10,
        init_args=["--tls-ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384", "--tls-curves", "secp384r1"],
    )
    cfg = custom.haproxy_cfg.read_text()
    assert "ssl-default-bind-curves secp384r1\n" in cfg
    assert ".if openssl_version_atleast" not in cfg
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{custom.port}", "-servername", HOST,
         "-CAfile", str(custom.cafile), "-verify_return_error", "-tls1_2"],
        input=b"", capture_output=True, timeout=20,
    )  # fmt: skip
    text = out.stdout.decode(errors="replace")
    assert out.returncode == 0, text[-2000:]
    assert "Cipher is ECDHE-ECDSA-AES256-GCM-SHA384" in text
    assert "Server Temp Key: ECDH, secp384r1" in text
