"""Small TLS clients for the integration tests (loopback only, bounded waits).

* :func:`handshake` / :func:`handshake_async`: a real, verified TLS handshake
  (``check_hostname`` on, ``server_hostname=host``) returning facts about the
  certificate the server sent; they raise on any failure, including a
  certificate that does not verify.
* :func:`https_get`: a verified handshake, timed, then one ``GET /`` whose
  HTTP status it returns (the demo and the benchmarks use it).
* :func:`raw_hello`: a hand-built TLS 1.2 ClientHello carrying an arbitrary raw
  SNI byte string (or none), returning the DER of the first certificate the
  server sends.  Without a ``supported_versions`` extension the server answers
  TLS 1.2, whose Certificate message is not encrypted, so no TLS library has
  to accept the hostile name first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
import time
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import NameOID

__all__ = [
    "CertInfo",
    "Exchange",
    "build_client_hello",
    "cert_info",
    "client_context",
    "handshake",
    "handshake_async",
    "https_get",
    "raw_hello",
]

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class CertInfo:
    """What a client learnt about the server's leaf certificate."""

    der: bytes
    subject_cn: str | None
    san: tuple[str, ...]
    serial: int
    issuer_cn: str | None


def cert_info(der: bytes) -> CertInfo:
    cert = x509.load_der_x509_certificate(der)

    def cn(name: x509.Name) -> str | None:
        attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(attrs[0].value) if attrs else None

    try:
        san = tuple(
            cert.extensions.get_extension_for_class(
                x509.SubjectAlternativeName
            ).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        san = ()
    return CertInfo(der, cn(cert.subject), san, cert.serial_number, cn(cert.issuer))


def client_context(cafile: str | os.PathLike[str]) -> ssl.SSLContext:
    """Verify against ``cafile`` only, with hostname checking (the ssl defaults)."""
    ctx = ssl.create_default_context(cafile=os.fspath(cafile))
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    return ctx


def handshake(
    port: int,
    host: str,
    cafile: str | os.PathLike[str] | None = None,
    *,
    context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
    address: str = LOOPBACK,
) -> CertInfo:
    """A verified TLS handshake with ``address:port`` for ``host``; raises on failure."""
    if context is None:
        if cafile is None:
            raise ValueError("give cafile or context")
        context = client_context(cafile)
    with (
        socket.create_connection((address, port), timeout=timeout) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if der is None:  # pragma: no cover - verified handshakes always have a peer cert
        raise ssl.SSLError("no peer certificate")
    return cert_info(der)


@dataclass(frozen=True)
class Exchange:
    """One verified handshake and one HTTP/1.1 request on it."""

    #: Seconds from connect() to the end of the verified handshake.
    handshake_seconds: float
    cert: CertInfo
    #: The status code of the reply (0 if the reply was not HTTP/1.x).
    status: int


def https_get(
    port: int, host: str, context: ssl.SSLContext, *, timeout: float = 5.0, path: str = "/"
) -> Exchange:
    """Connect to ``127.0.0.1:port``, verified handshake for ``host`` (timed), ``GET path``."""
    start = time.perf_counter()
    with (
        socket.create_connection((LOOPBACK, port), timeout=timeout) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        elapsed = time.perf_counter() - start
        der = tls.getpeercert(binary_form=True)
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        tls.sendall(request.encode())
        reply = b""
        while len(reply) < 12:
            chunk = tls.recv(4096)
            if not chunk:
                break
            reply += chunk
    if der is None:  # pragma: no cover
        raise ssl.SSLError("no peer certificate")
    status = int(reply[9:12]) if reply[:7] == b"HTTP/1." and reply[9:12].isdigit() else 0
    return Exchange(elapsed, cert_info(der), status)


async def handshake_async(
    port: int, host: str, context: ssl.SSLContext, *, timeout: float = 10.0
) -> CertInfo:
    """:func:`handshake` on asyncio, for many concurrent first connections."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            LOOPBACK, port, ssl=context, server_hostname=host, ssl_handshake_timeout=timeout
        ),
        timeout,
    )
    try:
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):  # ssl.SSLError is an OSError
            await asyncio.wait_for(writer.wait_closed(), timeout)
    del reader
    if der is None:  # pragma: no cover
        raise ssl.SSLError("no peer certificate")
    return cert_info(der)


# --- raw TLS 1.2 ClientHello --------------------------------------------------------

_CIPHERS = (
    0xC02B,  # TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    0xC02F,  # TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
)
_GROUPS = (0x001D, 0x0017)  # x25519, secp256r1
_SIGALGS = (
    0x0403,  # ecdsa_secp256r1_sha256
    0x0503,  # ecdsa_secp384r1_sha384
    0x0804,  # rsa_pss_rsae_sha256
    0x0401,  # rsa_pkcs1_sha256
    0x0501,  # rsa_pkcs1_sha384
)
_HANDSHAKE, _ALERT = 22, 21
_CLIENT_HELLO, _CERTIFICATE, _SERVER_HELLO_DONE = 1, 11, 14


def _u16(n: int) -> bytes:
    return struct.pack("!H", n)


def _u24(n: int) -> bytes:
    return struct.pack("!I", n)[1:]


def _ext(ext_type: int, body: bytes) -> bytes:
    return _u16(ext_type) + _u16(len(body)) + body


def build_client_hello(sni: bytes | None) -> bytes:
    """One TLS record holding a TLS 1.2 ClientHello; ``sni`` is sent as given, unchecked.

    ``None`` leaves the server_name extension out; ``b""`` sends an empty host_name.
    """
    extensions = b""
    if sni is not None:
        entry = b"\x00" + _u16(len(sni)) + sni  # name_type host_name
        extensions += _ext(0x0000, _u16(len(entry)) + entry)
    groups = b"".join(_u16(g) for g in _GROUPS)
    extensions += _ext(0x000A, _u16(len(groups)) + groups)  # supported_groups
    extensions += _ext(0x000B, b"\x01\x00")  # ec_point_formats: uncompressed
    sigalgs = b"".join(_u16(s) for s in _SIGALGS)
    extensions += _ext(0x000D, _u16(len(sigalgs)) + sigalgs)  # signature_algorithms
    extensions += _ext(0xFF01, b"\x00")  # renegotiation_info (initial handshake)
    ciphers = b"".join(_u16(c) for c in _CIPHERS)
    body = (
        b"\x03\x03"  # client_version TLS 1.2
        + os.urandom(32)
        + b"\x00"  # no session id
        + _u16(len(ciphers))
        + ciphers
        + b"\x01\x00"  # compression: null
        + _u16(len(extensions))
        + extensions
    )
    handshake_msg = bytes([_CLIENT_HELLO]) + _u24(len(body)) + body
    return b"\x16\x03\x01" + _u16(len(handshake_msg)) + handshake_msg


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes | None:
    data = b""
    while len(data) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete TLS record before the deadline")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def raw_hello(
    port: int, sni: bytes | None, *, timeout: float = 5.0, address: str = LOOPBACK
) -> bytes | None:
    """Send a hand-built ClientHello; return the DER of the server's first certificate.

    Returns None if the server closes the connection or sends an alert before
    any Certificate message.  Raises TimeoutError if nothing conclusive arrives
    within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    with socket.create_connection((address, port), timeout=timeout) as sock:
        sock.sendall(build_client_hello(sni))
        messages = b""  # handshake-layer bytes, which may span records
        while True:
            header = _recv_exact(sock, 5, deadline)
            if header is None:
                return None
            content_type, _version, length = struct.unpack("!BHH", header)
            fragment = _recv_exact(sock, length, deadline)
            if fragment is None or content_type == _ALERT:
                return None
            if content_type != _HANDSHAKE:
                raise ValueError(f"unexpected TLS record type {content_type} before Certificate")
            messages += fragment
            while len(messages) >= 4:
                msg_type = messages[0]
                msg_len = int.from_bytes(messages[1:4], "big")
                if len(messages) < 4 + msg_len:
                    break
                body, messages = messages[4 : 4 + msg_len], messages[4 + msg_len :]
                if msg_type == _CERTIFICATE:
                    # certificate_list<3> then each certificate<3>
                    first_len = int.from_bytes(body[3:6], "big")
                    return body[6 : 6 + first_len]
                if msg_type == _SERVER_HELLO_DONE:
                    return None  # an anonymous suite: no certificate at all
