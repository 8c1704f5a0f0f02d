"""A TLS client that resumes its session, round-robin over several HAProxy nodes.

Like a browser behind a layer-4 balancer: each connection offers the newest
session (ticket) it holds, lands on the next node, sends one request (so a TLS
1.3 ticket sent after the handshake is read) and keeps whatever new ticket the
node gave.  Loopback only, each connection bounded by ``timeout``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from certagent.testing.tlsclient import LOOPBACK, client_context

__all__ = ["ResumeReport", "ResumingClient"]


@dataclass
class ResumeReport:
    connections: int = 0
    resumed: int = 0
    #: (connection number, port) of each full handshake after the first
    full: list[tuple[int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """Resumed connections among all but the first (which has no session to offer)."""
        return self.resumed / max(1, self.connections - 1)


class ResumingClient:
    def __init__(
        self,
        ports: Sequence[int],
        host: str,
        cafile: str,
        version: ssl.TLSVersion,
        *,
        timeout: float = 5.0,
    ) -> None:
        self.ports = list(ports)
        self.host = host
        self.timeout = timeout
        self.context = client_context(cafile)
        self.context.minimum_version = version
        self.context.maximum_version = version
        self.session: ssl.SSLSession | None = None

    def connect(self, port: int) -> bool:
        """One verified connection and request; whether it resumed the session offered."""
        with socket.create_connection((LOOPBACK, port), timeout=self.timeout) as sock:
            # no Nagle: the request would wait for the ACK of the handshake's last flight
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.context.wrap_socket(
                sock, server_hostname=self.host, session=self.session
            ) as tls:
                request = f"GET / HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n"
                tls.sendall(request.encode())
                reply = b""
                while chunk := tls.recv(4096):
                    reply += chunk
                if not reply.startswith(b"HTTP/1.1 200"):
                    raise ssl.SSLError(f"unexpected reply {reply[:40]!r}")
                resumed = bool(tls.session_reused)
                self.session = tls.session  # the newest ticket this node gave
        return resumed

    def run(self, count: int, between: Callable[[int], None] | None = None) -> ResumeReport:
        """``count`` connections round-robin; ``between(i)`` runs before connection ``i``."""
        report = ResumeReport()
        for i in range(count):
            if between is not None:
                between(i)
            port = self.ports[i % len(self.ports)]
            try:
                resumed = self.connect(port)
            except (OSError, ssl.SSLError) as exc:
                report.errors.append(f"#{i} port {port}: {exc}")
                continue
            report.connections += 1
            if resumed:
                report.resumed += 1
            elif i > 0:
                report.full.append((i, port))
        return report
