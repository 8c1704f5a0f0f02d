"""An HTTPS proxy in front of pebble adding what pebble 2.4 lacks: renewalInfo, 429s, profiles.

::

    with AcmeProxy(pebble) as proxy:          # its own thread and event loop
        proxy.window = lambda ari_id: {"suggestedWindow": {"start": ..., "end": ...}}  # ARI
        proxy.rate_limit_orders = "5"         # newOrder answers 429, Retry-After 5
        ...                                   # certagent init --acme-directory proxy.directory_url

Everything else is forwarded to pebble unchanged (the Host header included, so
pebble's URLs point at the proxy).  It serves pebble's endpoint certificate, so a
client trusts it with the same ``--acme-ca-file``.  Counts newOrder requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from certagent.testing.pebble import Pebble
from certagent.testing.processes import free_port

#: ``window(ari_id)``: the renewalInfo document for a certificate (RFC 9773 §4.2), None: 404
Window = Callable[[str], dict[str, Any] | None]


class AcmeProxy:
    """See the module docstring.  ``window(ari_id)`` -> a renewalInfo document, or None (404)."""

    def __init__(self, ca: Pebble, *, retry_after: int = 21600) -> None:
        self.ca = ca
        self.port = free_port()
        self.window: Window | None = None
        self.retry_after = retry_after  # the renewalInfo answers' Retry-After
        self.rate_limit_orders: str | None = None  # a Retry-After: newOrder answers 429
        self.profiles: dict[str, str] = {}
        self.new_orders: list[dict[str, Any]] = []
        self.rate_limited = 0
        self.renewal_info_requests = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def directory_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    def orders(self) -> int:
        """newOrder requests seen, a retried one (badNonce, 429) counted again: for orders
        the CA created, ask the CA (:meth:`Pebble.orders`)."""
        with self._lock:
            return len(self.new_orders)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path.startswith("/renewal-info/"):
            with self._lock:
                self.renewal_info_requests += 1
            window = self.window(request.path.rsplit("/", 1)[1]) if self.window else None
            if window is None:
                malformed = {"type": "urn:ietf:params:acme:error:malformed"}
                return web.json_response(malformed, status=404)
            return web.json_response(window, headers={"Retry-After": str(self.retry_after)})
        if request.path == "/order-plz":
            with self._lock:
                self.new_orders.append(json.loads(_b64d(json.loads(body)["payload"])))
            limit = self.rate_limit_orders
            if limit is not None:
                with self._lock:
                    self.rate_limited += 1
                problem = {
                    "type": "urn:ietf:params:acme:error:rateLimited",
                    "detail": "too many new orders recently",
                    "status": 429,
                }
                return web.json_response(
                    problem,
                    status=429,
                    headers={"Retry-After": limit},
                    content_type="application/problem+json",
                )
        return await self._forward(request, body)

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        async with self._session.request(
            request.method,
            f"https://127.0.0.1:{self.ca.port}{request.path_qs}",
            data=body or None,
            headers=headers,  # Host stays ours: pebble builds its URLs from it
            allow_redirects=False,
        ) as upstream:
            data = await upstream.read()
            passed = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() in ("replay-nonce", "location", "link", "content-type", "retry-after")
            }
        if request.path == "/dir" and request.method == "GET":
            doc = json.loads(data)
            if self.profiles:
                doc["meta"]["profiles"] = self.profiles
            if self.window is not None:
                doc["renewalInfo"] = f"https://127.0.0.1:{self.port}/renewal-info"
            data = json.dumps(doc).encode()
        return web.Response(status=upstream.status, body=data, headers=passed)

    # --- running in a thread of its own -----------------------------------------------------

    _session: aiohttp.ClientSession | None = None

    async def _serve(self) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca.endpoint_cert, self.ca.endpoint_key)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=context).start()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ca.ssl_context()), auto_decompress=False
        )
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._session.close()
            await runner.cleanup()
            # let the TLS transports finish closing before the loop does (aiohttp's advice)
            await asyncio.sleep(0.25)

    def start(self) -> AcmeProxy:
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="acme-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the ACME proxy did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> AcmeProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
