"""A permission endpoint for tests: ``GET /ask?domain=NAME`` answers 200 for allowed names.

::

    with AskEndpoint(allowed={"shop.example.test"}) as ask:
        ...  # certagent init ... --ask ask.url
        assert ask.asked("shop.example.test") == 1

Runs in a thread of the test process on a free loopback port; counts every
request per name, so a test can show that answers are cached.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class AskEndpoint:
    """Caddy's ``ask`` contract: any 2xx allows, 403 denies (see the module docstring)."""

    def __init__(
        self,
        allowed: Iterable[str] = (),
        *,
        allow: Callable[[str], bool] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.allowed = set(allowed)
        self.allow = allow
        self.delay = delay
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/ask"

    def asked(self, name: str | None = None) -> int:
        with self._lock:
            return sum(self.requests.values()) if name is None else self.requests[name]

    def _decide(self, name: str) -> bool:
        return name in self.allowed or (self.allow is not None and self.allow(name))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                name = (query.get("domain") or [""])[0]
                with endpoint._lock:
                    endpoint.requests[name] += 1
                if endpoint.delay:
                    threading.Event().wait(endpoint.delay)
                status = 200 if name and endpoint._decide(name) else 403
                body = b"ok\n" if status == 200 else b"denied\n"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # quiet: the counts are the record

        return Handler

    def __enter__(self) -> AskEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
