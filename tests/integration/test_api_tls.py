"""The REST API over TLS and mutual TLS, on the real agent (``certagent run``), Redis, HAProxy.

One stack made by ``certagent init --api-tls-cert --api-tls-key``:

* over https, ``curl --cacert`` works and plain HTTP to that port does not; the
  CLI's ``cert ls --api https://…`` works with ``--api-ca``; sslyze finds the API
  as Mozilla's "intermediate" asks; a renewed certificate is served from the next
  connection on, with no restart;
* restarted with ``api_client_ca``: without a client certificate the handshake is
  refused, as with one from another CA; one from that CA works, with a bearer
  token or, its subject given to a token, without one (curl and the CLI);

and each of those cases leaves exactly one audit line, with the right token name
(or none) and outcome, while no line of the log holds a token or a key.
≈15 s, sslyze's scan (≈2 s) included.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sslyze
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from sslyze.mozilla_tls_profile import tls_config_checker as mozilla

from certagent.api.auth import add_token, hash_token
from certagent.testing import RedisFixture, certagent_argv, free_port
from certagent.testing.certs import CA, cert_pem, key_pem, make_ca, make_key
from tests.integration.apiagent import audit_lines, secrets_of_pem, unsafe_lines
from tests.integration.conftest import PKI, Stack, StackFactory

pytestmark = pytest.mark.integration

CURL = shutil.which("curl") or "/usr/bin/curl"


def leaf(ca: CA, common_name: str, *, client: bool = False) -> tuple[x509.Certificate, bytes]:
    """A 90-day leaf of ``ca`` (and its key's PEM): the API's (localhost, 127.0.0.1) or a
    client's (clientAuth, subject CN + O)."""
    key = make_key()
    now = dt.datetime.now(dt.UTC)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if client:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, "certagent tests"))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=90))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if not client:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca.key, hashes.SHA256()), key_pem(key)


def write_leaf(ca: CA, where: Path, name: str, *, client: bool = False) -> tuple[Path, Path, bytes]:
    """``name``.pem (leaf + chain) and ``name``.key in ``where``, each written as deploy
    tools do (a new file renamed over the old); the key's PEM too."""
    cert, key = leaf(ca, name, client=client)
    paths = (where / f"{name}.pem", where / f"{name}.key")
    for path, data in zip(paths, (cert_pem(cert) + ca.chain_pem, key), strict=True):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return *paths, key


class Curl:
    def __init__(self, base: str, cafile: Path) -> None:
        self.base = base
        self.cafile = cafile

    def get(self, path: str, *options: str, token: str | None = None) -> tuple[int, str]:
        """curl's exit status and what it printed (the body, then the status on a line)."""
        argv = [CURL, "-sS", "--max-time", "10", "-w", "\n%{http_code}", *options]
        if token is not None:
            argv += ["-H", f"Authorization: Bearer {token}"]
        run = subprocess.run(
            [*argv, self.base + path], capture_output=True, text=True, timeout=20, check=False
        )
        return run.returncode, run.stdout


def one_more_line(stack: Stack, action: Callable[[], Any]) -> dict[str, Any]:
    """Run ``action``; the one audit line it left (it must leave exactly one)."""
    before = len(audit_lines(stack))
    action()
    # a refused handshake is written when the server gives up on it: wait for it, bounded
    lines = _wait_lines(stack, before + 1)
    assert len(lines) == before + 1, lines[before:]
    return lines[-1]


def _wait_lines(stack: Stack, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout
    while True:
        lines = audit_lines(stack)
        if len(lines) >= count or time.monotonic() > end:
            time.sleep(0.2)  # and nothing more comes
            return audit_lines(stack)
        time.sleep(0.02)


def mozilla_intermediate(port: int, cafile: Path) -> None:
    request = sslyze.ServerScanRequest(
        server_location=sslyze.ServerNetworkLocation("localhost", port, ip_address="127.0.0.1"),
        scan_commands=mozilla.SCAN_COMMANDS_NEEDED_BY_MOZILLA_CHECKER,
        scan_commands_extra_arguments=sslyze.ScanCommandsExtraArguments(
            certificate_info=sslyze.CertificateInfoExtraArgument(custom_ca_file=cafile)
        ),
    )
    scanner = sslyze.Scanner()
    scanner.queue_scans([request])
    (result,) = list(scanner.get_results())
    assert result.scan_status == sslyze.ServerScanStatusEnum.COMPLETED, result
    profile = mozilla.MozillaTlsConfiguration.get(mozilla.TlsConfigurationEnum.MOZILLA_INTERMEDIATE)
    mozilla.check_server_against_tls_configuration(result, profile)  # raises with the issues
    # the data plane's groups (tests/integration/test_tls_scanners.py asks HAProxy the same)
    assert result.scan_result is not None
    curves = result.scan_result.elliptic_curves.result
    assert curves is not None and curves.supported_curves is not None
    assert {c.name for c in curves.supported_curves} == {"X25519", "secp256r1", "secp384r1"}


# sslyze's bundled trust stores hold an old root with a negative serial number
@pytest.mark.filterwarnings("ignore:Parsed a serial number which wasn't positive")
def test_tls_and_mutual_tls_on_the_api(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    ca = make_ca("API server CA")
    cafile = tmp_path / "api-ca.pem"
    cafile.write_bytes(ca.root_pem)
    server_cert, server_key, server_key_pem = write_leaf(ca, tmp_path, "api")
    tokens = tmp_path / "api-tokens"
    ops = add_token(tokens, "ops")
    port = free_port()
    redis_store.put([pki.bundle("tls.example.test")])
    stack = make_stack(
        redis_store.url,
        capacity=10,
        env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": f"127.0.0.1:{port}"},
        init_args=["--api-tls-cert", str(server_cert), "--api-tls-key", str(server_key)],
    )
    toml = stack.config_path.read_text()
    assert f'api_tls_cert = "{server_cert}"' in toml and f'api_tls_key = "{server_key}"' in toml
    base = f"https://127.0.0.1:{port}"
    curl = Curl(base, cafile)

    line = one_more_line(
        stack, lambda: _ok(curl.get("/v1/certificates", "--cacert", str(cafile), token=ops))
    )
    assert (line["token"], line["outcome"], line["status"]) == ("ops", "accepted", 200)

    def plain() -> None:
        code, out = Curl(f"http://127.0.0.1:{port}", cafile).get("/v1/certificates", token=ops)
        assert code != 0 and not out.strip("\n0"), (code, out)  # no HTTP answer at all

    line = one_more_line(stack, plain)
    assert (line["event"], line["token"], line["outcome"], line["code"]) == (
        "tls-handshake", None, "refused", "plain-http"
    )  # fmt: skip

    def cli_ls(*options: str, token: str | None = ops) -> subprocess.CompletedProcess[str]:
        env = {key: value for key, value in os.environ.items() if key != "CERTAGENT_TOKEN"}
        if token is not None:
            env["CERTAGENT_TOKEN"] = token  # out of ps, as docs/api.md says
        return subprocess.run(
            [*certagent_argv(), "cert", "ls", "--api", base, "--api-ca", str(cafile), *options],
            capture_output=True, text=True, timeout=30, env=env, check=False,
        )  # fmt: skip

    def listed() -> None:
        run = cli_ls()
        assert run.returncode == 0 and "tls.example.test" in run.stdout, run.stderr

    line = one_more_line(stack, listed)
    assert (line["token"], line["route"], line["outcome"]) == (
        "ops",
        "/v1/certificates",
        "accepted",
    )
    untrusted = cli_ls("--api-ca", str(pki.cafile))  # not the CA of the API's certificate
    assert untrusted.returncode == 1 and "certificate verify failed" in untrusted.stderr

    mozilla_intermediate(port, cafile)

    # a renewed certificate: served from the next connection on, no restart
    before = _served_serial(port, cafile)
    assert before == _serial_of(server_cert)
    _, _, renewed_key_pem = write_leaf(ca, tmp_path, "api")  # the same two paths
    assert _served_serial(port, cafile) == _serial_of(server_cert) != before

    # --- mutual TLS ------------------------------------------------------------------------
    client_ca = make_ca("API client CA")
    client_cafile = tmp_path / "client-ca.pem"
    client_cafile.write_bytes(client_ca.root_pem)
    client_cert, client_key, client_key_pem = write_leaf(client_ca, tmp_path, "deploy", client=True)
    stranger_cert, stranger_key, stranger_key_pem = write_leaf(
        ca, tmp_path, "stranger", client=True
    )
    stack.stop_agent()
    stack.env["CERTAGENT_API_CLIENT_CA"] = str(client_cafile)
    stack.start_agent()
    cacert = ("--cacert", str(cafile))
    with_cert = (*cacert, "--cert", str(client_cert), "--key", str(client_key))

    def refused(*options: str) -> Callable[[], None]:
        def run() -> None:
            code, out = curl.get("/v1/certificates", *options, token=ops)
            assert code != 0 and not out.strip("\n0"), (code, out)

        return run

    line = one_more_line(stack, refused(*cacert))
    assert (line["event"], line["outcome"], line["code"]) == (
        "tls-handshake", "refused", "no-client-certificate"
    )  # fmt: skip
    line = one_more_line(
        stack, refused(*cacert, "--cert", str(stranger_cert), "--key", str(stranger_key))
    )
    assert (line["outcome"], line["code"]) == ("refused", "untrusted-client-certificate")
    subject = x509.load_pem_x509_certificate(client_cert.read_bytes()).subject.rfc4514_string()
    line = one_more_line(stack, lambda: _ok(curl.get("/v1/certificates", *with_cert, token=ops)))
    assert (line["token"], line["client"], line["outcome"]) == ("ops", subject, "accepted")
    # the certificate's subject alone stands for a token (read only here)
    no_token = one_more_line(stack, lambda: _status(curl.get("/v1/certificates", *with_cert), 401))
    assert (no_token["token"], no_token["client"], no_token["code"]) == (
        None,
        subject,
        "missing-token",
    )
    made = subprocess.run(
        [*certagent_argv(), "token", "add", "deploy", "--file", str(tokens), "--scope", "read",
         "--client-subject", subject],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert made.returncode == 0 and made.stdout == "", made.stderr
    line = one_more_line(stack, lambda: _ok(curl.get("/v1/certificates", *with_cert)))
    assert (line["token"], line["client"], line["outcome"]) == ("deploy", subject, "accepted")

    def cli_mutual() -> None:
        run = cli_ls(
            "--api-client-cert", str(client_cert), "--api-client-key", str(client_key), token=None
        )
        assert run.returncode == 0 and "tls.example.test" in run.stdout, run.stderr

    line = one_more_line(stack, cli_mutual)
    assert (line["token"], line["outcome"]) == ("deploy", "accepted")
    forbidden = one_more_line(
        stack,
        lambda: _status(curl.get("/v1/domains/x.example.test", *with_cert, "-X", "DELETE"), 403),
    )
    assert (forbidden["token"], forbidden["code"]) == ("deploy", "forbidden")

    log = stack.agent_log() + stack.haproxy_log()
    secrets = [ops, hash_token(ops)]
    for pem in (server_key_pem, renewed_key_pem, client_key_pem, stranger_key_pem):
        secrets += secrets_of_pem(pem)
    assert unsafe_lines(log, secrets) == []


def _ok(result: tuple[int, str]) -> None:
    _status(result, 200)


def _status(result: tuple[int, str], status: int) -> None:
    code, out = result
    assert code == 0 and out.rsplit("\n", 1)[-1] == str(status), (code, out[-300:])


def _serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def _served_serial(port: int, cafile: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
