"""TLS for the REST API: the server's context, kept current, and the listener that uses it.

``api_tls_cert`` / ``api_tls_key`` turn it on; ``api_client_ca`` also requires a
client certificate signed by that CA (mutual TLS), checked during the handshake.
The settings are the data plane's (:mod:`certagent.runtime.tlspolicy`, Mozilla's
"intermediate"): TLS 1.2 and 1.3, in TLS 1.2 only its ECDHE + AEAD suites, TLS
1.3's three suites (OpenSSL's default), the client's order, the key exchange
groups X25519, P-256 and P-384 (X25519MLKEM768 first where Python's OpenSSL is
3.5 or later, as HAProxy's ``.if openssl_version_atleast(3.5.0)``); no
renegotiation, no compression.  Python's ``ssl`` module can set one group only
(``set_ecdh_curve``), so :func:`_offer_groups` hands the list to OpenSSL's
``SSL_CTX_set1_groups_list`` itself; where it cannot (not CPython, OpenSSL not
reachable) the API offers P-256 alone (the start's log line names the groups).

:class:`ServerTls` hands out the context for each new connection: it ``stat``s
the certificate, key (and CA) files first (three calls: 3.9 µs of CPU, 1.5 % of
the server's 0.27 ms for the handshake itself, bench/results/2026-12-07-api-tls.md;
O(1) per connection, nothing on a timer) and builds a new context when one changed, so a
renewed certificate is served from the next connection on, without a restart.
A pair that does not load (the certificate written before its key, say) keeps
the previous context, with one warning per change, and is tried again at most
once a second while connections come.

:class:`TlsListener` accepts connections itself and does each handshake with
``loop.connect_accepted_socket``, so a refused handshake (no client
certificate, an untrusted one, plain HTTP sent to this port) is known, audited
and counted (:meth:`~certagent.api.audit.Auditor.handshake_refused`; one the
client dropped or let time out is only counted); aiohttp's own TLS listener
would drop it without a word.
"""

from __future__ import annotations

import _ssl
import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from certagent.errors import ConfigError
from certagent.runtime.tlspolicy import CURVES, INTERMEDIATE_CIPHERS, PQ_CURVES

from .audit import Auditor

__all__ = [
    "HANDSHAKE_SECONDS",
    "ServerTls",
    "TlsListener",
    "client_context",
    "peer_subject",
    "refusal_reason",
    "server_context",
]

log = logging.getLogger(__name__)

#: A handshake not done within this is dropped (a client that connects and says nothing).
HANDSHAKE_SECONDS = 10.0
_GROUP = "prime256v1"
Stamp = tuple[tuple[int, int, int, int] | None, ...]


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The API's server context: Mozilla intermediate, and ``client_ca`` for mutual TLS.

    ConfigError (naming the file) if the certificate, the key or the CA does not load.
    """
    return _server_context(cert, key, client_ca)[0]


def _server_context(cert: str, key: str, client_ca: str | None) -> tuple[ssl.SSLContext, str]:
    """:func:`server_context`, and the key exchange groups it offers."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(INTERMEDIATE_CIPHERS)  # TLS 1.2; TLS 1.3 keeps OpenSSL's three suites
    groups = _offer_groups(ctx)
    # Mozilla's server_preferred_order: false (HAProxy's prefer-client-ciphers)
    ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"cannot serve the REST API over TLS with api_tls_cert {cert} and api_tls_key"
            f" {key}: {_why(exc)} (a PEM chain, leaf first, and its unencrypted key)"
        ) from exc
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot read api_client_ca {client_ca}: {_why(exc)} (PEM CA certificates)"
            ) from exc
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx, groups


#: OpenSSL's ``SSL_CTRL_SET_GROUPS_LIST`` (``SSL_CTX_set1_groups_list`` is a macro over it)
_SET_GROUPS_LIST = 92


def _offer_groups(ctx: ssl.SSLContext) -> str:
    """Offer the data plane's key exchange groups; the list offered.

    ``SSL_CTX_set1_groups_list`` through ctypes, on the ``SSL_CTX`` that CPython's
    ``SSLContext`` object holds right after its object header (``object.__basicsize__``:
    the struct has begun ``PyObject_HEAD; SSL_CTX *ctx;`` in every version).  The
    pointer is checked first (``SSL_CTX_get_options`` must give ``ctx.options``).
    Without that: P-256 alone (``set_ecdh_curve``), a subset of the same list.
    """
    ctrl = _groups_setter(ctx)
    if ctrl is not None:
        for groups in (PQ_CURVES, CURVES):  # the hybrid only where OpenSSL knows it (3.5+)
            if ctrl(groups.encode("ascii")) == 1:
                return groups
    ctx.set_ecdh_curve(_GROUP)
    return _GROUP


def _groups_setter(ctx: ssl.SSLContext) -> Callable[[bytes], int] | None:
    """``SSL_CTX_ctrl(ctx, SET_GROUPS_LIST, 0, groups)`` for ``ctx``, or None if unreachable."""
    if sys.implementation.name != "cpython":
        return None
    try:
        lib = ctypes.CDLL(_ssl.__file__)  # its symbols include libssl's (a dependency)
        get_options, ctrl = lib.SSL_CTX_get_options, lib.SSL_CTX_ctrl
        clear_errors = lib.ERR_clear_error
    except (OSError, AttributeError):
        return None
    pointer = ctypes.c_void_p.from_address(id(ctx) + object.__basicsize__).value
    get_options.restype, get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
    if pointer is None or get_options(pointer) != ctx.options:
        return None
    ctrl.restype = ctypes.c_long
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_char_p]

    def set_groups(groups: bytes) -> int:
        done = int(ctrl(pointer, _SET_GROUPS_LIST, 0, groups))
        if done != 1:
            clear_errors()  # a name OpenSSL lacks leaves an error queued: not for later calls
        return done

    return set_groups


def client_context(
    ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    """What ``certagent cert --api https://...`` connects with: ``ca`` trusted (else the
    system's roots), ``cert``/``key`` presented for mutual TLS.  ConfigError if one fails."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot use --api-ca {ca}: {_why(exc)} (PEM CA certificates)") from exc
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot use --api-client-cert {cert}"
                + (f" with --api-client-key {key}" if key is not None else "")
                + f": {_why(exc)}"
            ) from exc
    return ctx


def _why(exc: ssl.SSLError | OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc).lower().replace("_", " ")
    return exc.strerror or str(exc)


class ServerTls:
    """The current server context of ``cert``, ``key`` (and ``client_ca``) files."""

    #: a pair that did not load is tried again at most this often (seconds), for a change
    #: its files' stamps missed (two writes within the file system's time granularity)
    RETRY_SECONDS = 1.0

    def __init__(
        self,
        cert: str,
        key: str,
        client_ca: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca or None
        self._clock = clock
        self._stamp = self._files_stamp()
        # ConfigError: no start
        self._context, self.groups = _server_context(cert, key, self.client_ca)
        self._bad: Stamp | None = None
        self._bad_at = 0.0

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first if a file changed (O(1))."""
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return self._context
        if stamp == self._bad and self._clock() - self._bad_at < self.RETRY_SECONDS:
            return self._context
        try:
            fresh, self.groups = _server_context(self.cert, self.key, self.client_ca)
        except ConfigError as exc:
            if stamp != self._bad:
                log.warning("%s; serving the certificate read before", exc)
            self._bad, self._bad_at = stamp, self._clock()
        else:
            self._context, self._stamp, self._bad = fresh, stamp, None
            log.info("REST API TLS certificate %s re-read", self.cert)
        return self._context

    def _files_stamp(self) -> Stamp:
        return tuple(_stamp(path) for path in (self.cert, self.key, self.client_ca) if path)


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)  # follows a symbolic link (certbot's live/): its target's stamp
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def peer_subject(transport: asyncio.BaseTransport | None) -> str | None:
    """The RFC 4514 subject of the connection's verified client certificate, if any."""
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    try:
        return str(x509.load_der_x509_certificate(der).subject.rfc4514_string())
    except ValueError as exc:  # OpenSSL took it, cryptography cannot read it: no subject
        log.debug("REST API: a client certificate's subject cannot be read: %s", exc)
        return None


#: OpenSSL's reason for a failed handshake -> the audit's ``code`` (and the metric's label)
_REASONS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "no-client-certificate",
    "CERTIFICATE_VERIFY_FAILED": "untrusted-client-certificate",
    "HTTP_REQUEST": "plain-http",
    "WRONG_VERSION_NUMBER": "not-tls",
    "UNSUPPORTED_PROTOCOL": "protocol-version",
    "TLSV1_ALERT_PROTOCOL_VERSION": "protocol-version",
    "NO_SHARED_CIPHER": "no-shared-cipher",
    "NO_SUITABLE_KEY_SHARE": "no-shared-group",
}


def refusal_reason(exc: BaseException) -> str:
    """Why a handshake failed, in a word the audit line and the metric can carry."""
    if isinstance(exc, ssl.SSLError):
        return _REASONS.get(str(exc.reason), "handshake-failed")
    if isinstance(exc, TimeoutError) or (
        isinstance(exc, ConnectionAbortedError) and "taking longer" in str(exc)
    ):  # asyncio and uvloop abort a slow handshake with ConnectionAbortedError
        return "timeout"
    return "connection-lost"


class TlsListener:
    """Accepts on ``sock`` and gives each connection, once its handshake succeeded, to
    ``factory`` (aiohttp's server: one request handler per connection)."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        tls: ServerTls,
        auditor: Auditor,
    ) -> None:
        self.sock = sock
        self._factory = factory
        self._tls = tls
        self._auditor = auditor
        self._handshakes: set[asyncio.Task[None]] = set()
        self._acceptor: asyncio.Task[None] | None = None

    @classmethod
    def bind(
        cls,
        host: str,
        port: int,
        factory: Callable[[], asyncio.Protocol],
        tls: ServerTls,
        auditor: Auditor,
    ) -> TlsListener:
        """Listen on ``host:port`` (OSError if it cannot) and start accepting."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=128)
        sock.setblocking(False)
        listener = cls(sock, factory, tls, auditor)
        listener._acceptor = asyncio.get_running_loop().create_task(
            listener._accept(), name="api-tls-accept"
        )
        return listener

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as exc:  # out of file descriptors, say: wait, then go on
                log.warning("REST API: cannot accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._handshake(conn, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, peer: object) -> None:
        """O(1) but the handshake itself: the files' stamps, then OpenSSL's work."""
        loop = asyncio.get_running_loop()
        remote = peer[0] if isinstance(peer, tuple) else None
        try:
            await loop.connect_accepted_socket(
                self._factory,
                conn,
                ssl=self._tls.context(),
                ssl_handshake_timeout=HANDSHAKE_SECONDS,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            conn.close()
            reason = refusal_reason(exc)
            log.debug("REST API: TLS handshake from %s refused: %s", remote, reason)
            # TLS said no (an audit line); a client that went away or timed out is counted
            self._auditor.handshake_refused(
                remote, reason, written=isinstance(exc, ssl.SSLError)
            )

    async def close(self) -> None:
        """Stop accepting and drop handshakes under way (open connections are aiohttp's)."""
        tasks = [t for t in (self._acceptor, *self._handshakes) if t is not None]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self.sock.close()
