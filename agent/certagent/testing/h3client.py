"""A real HTTP/3 client for the tests and benchmarks: aioquic's QUIC on a blocking UDP socket.

aioquic (a test dependency) is sans-I/O: :class:`H3Client` feeds its
``QuicConnection`` from one connected UDP socket, with every wait bounded, and
speaks HTTP/3 through its ``H3Connection``.  The handshake is TLS 1.3 inside
QUIC, verified against ``cafile`` with the host name checked, exactly as a
browser would: a certificate for another name (certagent's default certificate
for a host it has not loaded) fails it with :class:`H3HandshakeFailed`.

    with H3Client(port, "a.example.test", cafile) as client:   # handshake
        client.cert.san, client.resumed                         # what the server sent
        client.get("/").status                                  # 200

Session tickets the server sends are collected in :attr:`H3Client.tickets`; pass one
as ``ticket`` to resume (TLS 1.3 resumption, no certificate exchanged).

Loopback only; each call waits at most ``timeout`` seconds.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted
from aioquic.tls import SessionTicket
from cryptography.hazmat.primitives import serialization

from certagent.testing.tlsclient import LOOPBACK, CertInfo, cert_info

__all__ = ["H3Client", "H3Error", "H3HandshakeFailed", "H3Response", "SessionTicket", "h3_get"]

#: QUIC's error codes for a TLS alert are 0x100 + the alert (RFC 9001, 4.8).
CRYPTO_ERROR = 0x100


class H3Error(Exception):
    """No answer in time, nothing listening, or the connection closed mid-request."""


class H3HandshakeFailed(H3Error):
    """The QUIC handshake failed: ``error_code`` 0x100 + a TLS alert, and why.

    ``by_client`` is True when this client closed it (e.g. the certificate did
    not verify: alert 42 bad_certificate), False when the server did.
    """

    def __init__(self, error_code: int, reason: str, by_client: bool) -> None:
        who = "client" if by_client else "server"
        super().__init__(f"QUIC handshake failed ({who}, error 0x{error_code:x}): {reason}")
        self.error_code = error_code
        self.reason = reason
        self.by_client = by_client

    @property
    def tls_alert(self) -> int | None:
        """The TLS alert number, if the error is one."""
        alert = self.error_code - CRYPTO_ERROR
        return alert if 0 <= alert < 256 else None


@dataclass(frozen=True)
class H3Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class _Stream:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False


class H3Client:
    """One verified QUIC connection to ``address:port`` for ``host``, and HTTP/3 on it."""

    def __init__(
        self,
        port: int,
        host: str,
        cafile: str | Path,
        *,
        address: str = LOOPBACK,
        timeout: float = 5.0,
        ticket: SessionTicket | None = None,
    ) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.tickets: list[SessionTicket] = []
        config = QuicConfiguration(
            is_client=True, alpn_protocols=H3_ALPN, server_name=host, session_ticket=ticket
        )
        config.load_verify_locations(cafile=str(cafile))
        self._quic = QuicConnection(configuration=config, session_ticket_handler=self._ticket)
        self._http = H3Connection(self._quic)
        self._streams: dict[int, _Stream] = {}
        self._handshake: HandshakeCompleted | None = None
        self._peer = (address, port)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_DGRAM)
        self._sock.connect(self._peer)

    def _ticket(self, ticket: SessionTicket) -> None:
        self.tickets.append(ticket)

    # --- connection --------------------------------------------------------------------

    def connect(self) -> H3Client:
        """The QUIC handshake; H3HandshakeFailed if it fails, H3Error without an answer."""
        try:
            self._quic.connect(self._peer, now=time.monotonic())
            self._flush()
            self._pump(lambda: self._handshake is not None, "the QUIC handshake")
        except BaseException:
            self._sock.close()
            raise
        return self

    @property
    def resumed(self) -> bool:
        """Whether the handshake resumed a session (a ticket), with no certificate sent."""
        return self._handshake is not None and bool(self._handshake.session_resumed)

    @property
    def cert(self) -> CertInfo:
        """The server's leaf certificate (of the first, full handshake of the session)."""
        # aioquic keeps the verified peer certificate on its TLS context only
        peer = self._quic.tls._peer_certificate
        if peer is None:
            raise H3Error("no peer certificate (a resumed session sends none)")
        return cert_info(peer.public_bytes(serialization.Encoding.DER))

    def get(self, path: str = "/") -> H3Response:
        """``GET path`` on this connection; its response."""
        stream_id = self._quic.get_next_available_stream_id()
        self._streams[stream_id] = stream = _Stream()
        self._http.send_headers(
            stream_id,
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", f"{self.host}:{self.port}".encode()),
                (b":path", path.encode()),
            ],
            end_stream=True,
        )
        self._flush()
        self._pump(lambda: stream.ended, f"the response to GET {path}")
        del self._streams[stream_id]
        headers = {k.decode(): v.decode() for k, v in stream.headers}
        status = headers.get(":status", "")
        if not status.isdigit():
            raise H3Error(f"a response without a status: {headers}")
        return H3Response(int(status), headers, bytes(stream.body))

    def wait_tickets(self, count: int = 1, timeout: float = 1.0) -> list[SessionTicket]:
        """Wait (bounded) until the server has sent ``count`` session tickets."""
        deadline = time.monotonic() + timeout
        while len(self.tickets) < count and time.monotonic() < deadline:
            self._step(deadline)
        return list(self.tickets)

    def close(self) -> None:
        """Close the connection (NO_ERROR) and the socket."""
        if self._sock.fileno() < 0:
            return
        try:
            self._quic.close()
            self._flush()
        except OSError:
            pass  # the peer is gone: nothing to tell it
        finally:
            self._sock.close()

    def __enter__(self) -> H3Client:
        return self.connect()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the I/O loop --------------------------------------------------------------------

    def _flush(self) -> None:
        for data, _ in self._quic.datagrams_to_send(now=time.monotonic()):
            self._sock.send(data)

    def _pump(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() >= deadline:
                raise H3Error(f"no answer from UDP {self._peer} for {what} in {self.timeout}s")
            self._step(deadline)

    def _step(self, deadline: float) -> None:
        """Receive one datagram or run the timer, then handle events and send."""
        now = time.monotonic()
        timer = self._quic.get_timer()
        wait = min(deadline, timer if timer is not None else deadline) - now
        self._sock.settimeout(max(wait, 0.001))
        try:
            data = self._sock.recv(65536)
        except TimeoutError:
            self._quic.handle_timer(time.monotonic())
        except ConnectionRefusedError as exc:
            raise H3Error(f"nothing listens on UDP {self._peer}") from exc
        else:
            self._quic.receive_datagram(data, self._peer, time.monotonic())
        try:
            self._events()
        finally:
            self._flush()  # a close of ours (a refused certificate) reaches the server too

    def _events(self) -> None:
        while (event := self._quic.next_event()) is not None:
            if isinstance(event, HandshakeCompleted):
                self._handshake = event
            elif isinstance(event, ConnectionTerminated):
                self._closed(event, by_client=False)
            for h3 in self._http.handle_event(event):
                self._h3_event(h3)
        # aioquic closes itself on a certificate it refuses, and emits the event only at
        # the end of its closing period: look at what it is closing with
        closing = self._quic._close_event
        if closing is not None:
            self._closed(closing, by_client=True)

    def _closed(self, event: ConnectionTerminated, by_client: bool) -> None:
        if self._handshake is None:
            raise H3HandshakeFailed(event.error_code, event.reason_phrase, by_client)
        if any(not s.ended for s in self._streams.values()):
            raise H3Error(f"connection closed: {event.reason_phrase or event.error_code}")

    def _h3_event(self, event: H3Event) -> None:
        if not isinstance(event, HeadersReceived | DataReceived):
            return
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        if isinstance(event, HeadersReceived):
            stream.headers += event.headers
        else:
            stream.body += event.data
        stream.ended = stream.ended or event.stream_ended


def h3_get(
    port: int,
    host: str,
    cafile: str | Path,
    *,
    address: str = LOOPBACK,
    timeout: float = 5.0,
    path: str = "/",
) -> tuple[CertInfo, H3Response]:
    """One verified QUIC connection for ``host`` and one ``GET``: its certificate and response."""
    with H3Client(port, host, cafile, address=address, timeout=timeout) as client:
        return client.cert, client.get(path)
