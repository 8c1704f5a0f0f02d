"""Debian's ``pebble`` (a test ACME CA) and ``pebble-challtestsrv`` (its DNS) on loopback.

::

    with Pebble(tmp_path, eab_keys={"kid-1": key_b64}) as ca:
        client = AcmeClient(ca.directory_url, key, ca_file=str(ca.ca_file))
        ...                       # answer HTTP-01 on ca.http_port, TLS-ALPN-01 on ca.tls_port
        roots = ca.roots_pem()    # what issued certificates chain to (new at every start)
        assert ca.orders() == 1   # orders pebble created (from its log)

* pebble's ACME endpoint gets a throwaway CA made here (``ca_file`` trusts it;
  ``endpoint_cert``/``endpoint_key`` let a test double on 127.0.0.1 use the same
  certificate); the Debian package ships none.
* Every name resolves to 127.0.0.1: pebble asks challtestsrv's DNS, whose own
  challenge responders are switched off so they take no ports.  The CA validates
  HTTP-01 on ``http_port`` and TLS-ALPN-01 on ``tls_port`` (free high ports unless
  given): the test (or HAProxy) answers there.
* ``PEBBLE_VA_NOSLEEP=1`` (no 0-15 s sleep before each validation); nonce rejection
  (pebble's default: 5 % of good nonces) and authorization reuse (50 %) can be set;
  ``validity`` (seconds) makes short-lived certificates; ``eab_keys`` with
  ``eab_required`` turns on external account binding.
* :meth:`stop_ca` / :meth:`start_ca` stop and start pebble alone, by PID, on the
  same ports (a CA outage; a restarted pebble has forgotten every account).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certagent.testing.certs import cert_pem, key_pem, make_ca, make_key
from certagent.testing.processes import (
    PORT_ATTEMPTS,
    START_TIMEOUT,
    StackError,
    free_port,
    spawn,
    stop_process,
    tail,
    wait_for,
)

PEBBLE = shutil.which("pebble") or "/usr/bin/pebble"
CHALLTESTSRV = shutil.which("pebble-challtestsrv") or "/usr/bin/pebble-challtestsrv"
_REQUEST = re.compile(r"\b([A-Z]+) (/\S*) -> calling handler\(\)")


def installed() -> bool:
    """True if both pebble binaries are there (``scripts/install.sh`` installs them)."""
    return Path(PEBBLE).exists() and Path(CHALLTESTSRV).exists()


def _endpoint_pki(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway root and a ``localhost``/127.0.0.1 leaf for pebble's own HTTPS."""
    ca = make_ca("certagent pebble endpoint CA", intermediate=False)
    key = make_key("ec")
    now = dt.datetime.now(dt.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a leaf
        # without an Authority Key Identifier fails ("Missing Authority Key Identifier")
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    paths = workdir / "endpoint-ca.pem", workdir / "endpoint-cert.pem", workdir / "endpoint-key.pem"
    paths[0].write_bytes(ca.root_pem)
    paths[1].write_bytes(cert_pem(leaf))
    paths[2].write_bytes(key_pem(key))
    return paths


class Pebble:
    """pebble + pebble-challtestsrv, started by :meth:`start`, stopped by PID (module docstring)."""

    def __init__(
        self,
        workdir: Path,
        *,
        http_port: int | None = None,
        tls_port: int | None = None,
        validity: int | None = None,
        eab_keys: Mapping[str, str] | None = None,
        eab_required: bool = False,
        nonce_reject: int | None = None,
        authz_reuse: int | None = None,
        always_valid: bool = False,
    ) -> None:
        self.workdir = workdir
        self.http_port = http_port or free_port()
        self.tls_port = tls_port or free_port()
        self.validity = validity
        self.eab_keys = dict(eab_keys or {})
        self.eab_required = eab_required
        self.nonce_reject = nonce_reject
        self.authz_reuse = authz_reuse
        self.always_valid = always_valid
        self.log_path = workdir / "pebble.log"
        self.dns_log_path = workdir / "challtestsrv.log"
        self.port = 0
        self.management_port = 0
        self.dns_port = 0
        self.dns_management_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.dns_proc: subprocess.Popen[bytes] | None = None
        self.ca_file = self.endpoint_cert = self.endpoint_key = Path()

    # --- addresses ---------------------------------------------------------------------

    @property
    def directory_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    @property
    def management_url(self) -> str:
        return f"https://127.0.0.1:{self.management_port}"

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts pebble's ACME and management endpoints."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    # --- processes ---------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> Pebble:
        """Start challtestsrv, then pebble; retried on fresh ports if one was taken meanwhile."""
        if not installed():
            raise StackError(f"pebble is not installed ({PEBBLE}); run scripts/install.sh")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ca_file, self.endpoint_cert, self.endpoint_key = _endpoint_pki(self.workdir)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.dns_port, self.dns_management_port = free_port(), free_port()
            self.port, self.management_port = free_port(), free_port()
            try:
                self._start_dns(timeout)
                self._start_ca(timeout)
                return self
            except StackError as exc:
                self.stop()
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_dns(self, timeout: float) -> None:
        self.dns_proc = spawn(
            [
                CHALLTESTSRV,
                "-dns01", f"127.0.0.1:{self.dns_port}",
                "-http01", "",
                "-https01", "",
                "-tlsalpn01", "",
                "-management", f"127.0.0.1:{self.dns_management_port}",
                "-defaultIPv4", "127.0.0.1",
                "-defaultIPv6", "",
            ],
            self.dns_log_path,
        )  # fmt: skip
        proc = self.dns_proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise StackError(
                    f"pebble-challtestsrv exited with {proc.returncode}:\n{tail(self.dns_log_path)}"
                )
            with socket.create_connection(("127.0.0.1", self.dns_management_port), timeout=1):
                return True

        wait_for(ready, timeout, "pebble-challtestsrv")

    def _config(self) -> Path:
        pebble: dict[str, object] = {
            "listenAddress": f"127.0.0.1:{self.port}",
            "managementListenAddress": f"127.0.0.1:{self.management_port}",
            "certificate": str(self.endpoint_cert),
            "privateKey": str(self.endpoint_key),
            "httpPort": self.http_port,
            "tlsPort": self.tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": self.eab_required,
        }
        if self.eab_keys:
            pebble["externalAccountMACKeys"] = self.eab_keys
        if self.validity is not None:
            pebble["certificateValidityPeriod"] = self.validity
        path = self.workdir / "pebble-config.json"
        path.write_text(json.dumps({"pebble": pebble}, indent=2))
        return path

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEBBLE_")}
        env["PEBBLE_VA_NOSLEEP"] = "1"
        env["PEBBLE_VA_ALWAYS_VALID"] = "1" if self.always_valid else "0"
        if self.nonce_reject is not None:
            env["PEBBLE_WFE_NONCEREJECT"] = str(self.nonce_reject)
        if self.authz_reuse is not None:
            env["PEBBLE_AUTHZREUSE"] = str(self.authz_reuse)
        return env

    def _start_ca(self, timeout: float) -> None:
        argv = [
            PEBBLE,
            "-config", str(self._config()),
            "-dnsserver", f"127.0.0.1:{self.dns_port}",
            "-strict=false",
        ]  # fmt: skip
        self.proc = spawn(argv, self.log_path, self._env())
        proc = self.proc
        context = self.ssl_context()

        def ready() -> bool:
            if proc.poll() is not None:
                raise StackError(f"pebble exited with {proc.returncode}:\n{tail(self.log_path)}")
            with urllib.request.urlopen(self.directory_url, timeout=1, context=context) as reply:
                ok: bool = reply.status == 200
            with urllib.request.urlopen(
                f"{self.management_url}/roots/0", timeout=1, context=context
            ) as reply:
                return ok and bool(reply.status == 200)

        wait_for(ready, timeout, "pebble's directory")

    def start_ca(self, timeout: float = START_TIMEOUT) -> None:
        """Start pebble again on its ports (after :meth:`stop_ca`): no accounts, a new root."""
        if self.running:
            raise StackError(f"pebble pid {self.proc.pid if self.proc else '?'} is running")
        self._start_ca(timeout)

    def stop_ca(self) -> bool:
        """Stop pebble alone by its PID (the DNS stays up); True if it was running."""
        return stop_process(self.proc)

    def restart_ca(self, timeout: float = START_TIMEOUT) -> None:
        self.stop_ca()
        self.start_ca(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> list[str]:
        """Stop both by PID; the list names what was running (for a report)."""
        report = []
        if stop_process(self.proc) and self.proc is not None:
            report.append(f"pebble pid {self.proc.pid}")
        if stop_process(self.dns_proc) and self.dns_proc is not None:
            report.append(f"pebble-challtestsrv pid {self.dns_proc.pid}")
        return report

    def __enter__(self) -> Pebble:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what pebble knows and did -----------------------------------------------------

    def _management(self, path: str) -> bytes:
        with urllib.request.urlopen(
            f"{self.management_url}{path}", timeout=5, context=self.ssl_context()
        ) as reply:
            data: bytes = reply.read()
        return data

    def roots_pem(self) -> bytes:
        """The root issued certificates chain to (``/roots/0``; new at every start)."""
        return self._management("/roots/0")

    def intermediates_pem(self) -> bytes:
        return self._management("/intermediates/0")

    def requests(self, method: str, path: str, *, prefix: bool = False) -> int:
        """How many ``METHOD path`` requests pebble logged (``prefix``: paths starting so).

        Every request counts, also those it refused (a ``badNonce`` included).
        """
        count = 0
        for match in _REQUEST.finditer(self.log()):
            if match.group(1) != method:
                continue
            seen = match.group(2)
            if seen == path or (prefix and seen.startswith(path)):
                count += 1
        return count

    def orders(self) -> int:
        """Orders pebble created so far, across restarts (its ``Added order`` lines).

        Not ``POST /order-plz`` requests: pebble logs those before it checks the
        nonce, so a newOrder retried after a ``badNonce`` is logged twice.
        """
        return self.log().count("Added order ")

    def certificates(self) -> int:
        """Certificates pebble issued so far, across restarts."""
        return self.log().count("Issued certificate serial ")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tails(self, lines: int = 30) -> str:
        return (
            f"pebble ({self.log_path}):\n{tail(self.log_path, lines)}\n"
            f"pebble-challtestsrv ({self.dns_log_path}):\n{tail(self.dns_log_path, lines)}"
        )
