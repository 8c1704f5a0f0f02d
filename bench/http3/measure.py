"""The loads and their CPU, both sides interleaved: one operation on each in turn.

The machine is shared and its load drifts within seconds, so the two sides are not
measured one after the other: every window alternates one operation on certagent with
one on the preloading HAProxy (which goes first alternates too), and both processes'
CPU is read at the same two instants.  A ratio is taken within one window.

aioquic (the HTTP/3 client) is pure Python and far slower than HAProxy, so what is
measured is the CPU each HAProxy worker (every thread, ``/proc/<pid>/task/*/schedstat``)
spent in the window, divided by its operations; the client's own CPU never counts.
For certagent, the agent's and Redis' CPU in the window is counted too (they have
nothing to do on these paths once the hosts are loaded: a check that it stays so).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

from bench._proc import schedstat_ns
from certagent.testing import StackError
from certagent.testing.h3client import H3Client, H3Error

TIMEOUT = 5.0


@dataclass(frozen=True)
class Target:
    """One side of the comparison: where it listens and the processes whose CPU counts."""

    label: str
    port: int
    haproxy_pid: int
    other_pids: tuple[int, ...] = ()  # the agent and Redis (certagent's side)

    def sample(self) -> tuple[int, int]:
        """(HAProxy worker ns, other processes' ns) on CPU so far."""
        return schedstat_ns(self.haproxy_pid), sum(schedstat_ns(p) for p in self.other_pids)


Operation = Callable[[], None]  # one request or one connection; raises on any failure


def interleaved(
    targets: Sequence[Target], operations: Sequence[Operation], count: int
) -> list[dict[str, float]]:
    """``count`` operations on each target, alternating; CPU per operation (µs) for each."""
    before = [t.sample() for t in targets]
    started = time.perf_counter()
    for i in range(count):
        order = range(len(targets)) if i % 2 == 0 else reversed(range(len(targets)))
        for side in order:
            operations[side]()
    seconds = time.perf_counter() - started
    time.sleep(0.05)  # the last closes
    after = [t.sample() for t in targets]
    return [
        {
            "ops": count,
            "haproxy_us": round((a[0] - b[0]) / count / 1e3, 2),
            "others_us": round((a[1] - b[1]) / count / 1e3, 2),
            "window_s": round(seconds, 3),
        }
        for b, a in zip(before, after, strict=True)
    ]


# --- HTTP/3 ------------------------------------------------------------------------------


def _h3_ok(client: H3Client, target: Target) -> None:
    response = client.get("/")
    if response.status != 200:
        raise StackError(f"{target.label}: HTTP/3 GET answered {response.status}")


class H3KeepAlive:
    """Open QUIC connections to one target (hosts in turn); each call is one GET on the next."""

    def __init__(self, target: Target, hosts: Sequence[str], cafile: Path, connections: int):
        self.target = target
        self.clients = [
            H3Client(target.port, hosts[i % len(hosts)], cafile).connect()
            for i in range(connections)
        ]
        for client in self.clients:
            _h3_ok(client, target)  # every connection set up and used once before measuring
        self._next = cycle(self.clients)

    def __call__(self) -> None:
        _h3_ok(next(self._next), self.target)

    def close(self) -> None:
        for client in self.clients:
            client.close()


def h3_handshake(target: Target, hosts: Sequence[str], cafile: Path) -> Operation:
    """Each call: a new QUIC connection (full handshake, no ticket), one GET, close."""
    names = cycle(hosts)

    def once() -> None:
        host = next(names)
        try:
            with H3Client(target.port, host, cafile) as client:
                if client.cert.san != (host,):
                    raise StackError(f"{target.label}: HTTP/3 for {host} got {client.cert.san}")
                _h3_ok(client, target)
        except H3Error as exc:
            raise StackError(f"{target.label}: HTTP/3 to {host}: {exc}") from exc

    return once


# --- TCP (HTTP/1.1 over TLS) -------------------------------------------------------------


def _tcp_get(tls: ssl.SSLSocket, host: str, close: bool) -> None:
    connection = "close" if close else "keep-alive"
    tls.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: {connection}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        if not chunk:
            raise StackError(f"connection closed before the reply: {data[:60]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise StackError(f"unexpected reply {head[:40]!r}")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = tls.recv(65536)
        if not chunk:
            raise StackError("connection closed in the body")
        body += chunk


def _tcp_open(port: int, host: str, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    return ctx.wrap_socket(sock, server_hostname=host)


class TcpKeepAlive:
    """Open TLS connections to one target; each call is one HTTP/1.1 GET on the next."""

    def __init__(self, target: Target, hosts: Sequence[str], ctx: ssl.SSLContext, connections: int):
        self.conns = [
            (hosts[i % len(hosts)], _tcp_open(target.port, hosts[i % len(hosts)], ctx))
            for i in range(connections)
        ]
        for name, tls in self.conns:
            _tcp_get(tls, name, close=False)
        self._next = cycle(self.conns)

    def __call__(self) -> None:
        name, tls = next(self._next)
        _tcp_get(tls, name, close=False)

    def close(self) -> None:
        for _, tls in self.conns:
            tls.close()


def tcp_handshake(target: Target, hosts: Sequence[str], ctx: ssl.SSLContext) -> Operation:
    """Each call: a new TLS connection (full handshake), one GET, close."""
    names = cycle(hosts)

    def once() -> None:
        host = next(names)
        with _tcp_open(target.port, host, ctx) as tls:
            _tcp_get(tls, host, close=True)

    return once
