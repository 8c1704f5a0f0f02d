"""OCSP responses and a loopback OCSP responder for the tests (cryptography's builders)."""

from __future__ import annotations

import datetime as dt
import http.server
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID

from certagent.testing.certs import CA, Key, make_key

__all__ = ["Responder", "delegated_responder", "issue_with_responder", "ocsp_response"]


def ocsp_response(
    ca: CA,
    leaf: x509.Certificate,
    *,
    status: ocsp.OCSPCertStatus = ocsp.OCSPCertStatus.GOOD,
    this_update: dt.datetime | None = None,
    valid_for: dt.timedelta = dt.timedelta(days=3),
    signer: tuple[x509.Certificate, Key] | None = None,
    issuer: x509.Certificate | None = None,
) -> bytes:
    """A DER basic OCSP response for ``leaf``, signed by the CA (or ``signer``)."""
    now = this_update or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    revoked = status is ocsp.OCSPCertStatus.REVOKED
    cert, key = signer or (ca.cert, ca.key)
    builder = (
        ocsp.OCSPResponseBuilder()
        .add_response(
            cert=leaf,
            issuer=issuer or ca.cert,
            algorithm=hashes.SHA1(),
            cert_status=status,
            this_update=now,
            next_update=now + valid_for,
            revocation_time=now if revoked else None,
            revocation_reason=x509.ReasonFlags.key_compromise if revoked else None,
        )
        .responder_id(ocsp.OCSPResponderEncoding.HASH, cert)
    )
    if signer is not None:
        builder = builder.certificates([cert])
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def delegated_responder(ca: CA, *, ocsp_signing: bool = True) -> tuple[x509.Certificate, Key]:
    """A responder certificate issued by ``ca`` (with id-kp-OCSPSigning unless told not)."""
    key = make_key()
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "certagent test OCSP")])
    usages = [ExtendedKeyUsageOID.OCSP_SIGNING if ocsp_signing else ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return cert, key


def issue_with_responder(ca: CA, name: str, url: str, key: Key) -> x509.Certificate:
    """A leaf for ``name`` whose AIA names the OCSP responder ``url``."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=90))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(
            x509.AuthorityInformationAccess(
                [
                    x509.AccessDescription(
                        x509.oid.AuthorityInformationAccessOID.OCSP,
                        x509.UniformResourceIdentifier(url),
                    )
                ]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )


class Responder:
    """An OCSP responder on loopback (a thread): answers for the leaves it was given.

    ``requests`` counts the requests it answered; ``set(leaf, der)`` changes an answer.
    """

    def __init__(self) -> None:
        self.answers: dict[int, bytes] = {}
        self.requests = 0
        responder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(min(size, 65536))
                try:
                    serial = ocsp.load_der_ocsp_request(body).serial_number
                    answer = responder.answers[serial]
                except (ValueError, KeyError):
                    self.send_response(404)
                    self.end_headers()
                    return
                responder.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/ocsp-response")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def set(self, leaf: x509.Certificate, der: bytes) -> None:
        self.answers[leaf.serial_number] = der

    def __enter__(self) -> Responder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
