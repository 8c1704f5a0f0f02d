"""A scripted ACME CA in memory: a :class:`~certagent.acme.transport.Transport` for unit tests.

Routes map ``(method, url)`` to a handler or a queue of canned responses; every
request is recorded with its decoded JWS (protected header and payload), and
every answer carries a fresh ``Replay-Nonce`` unless the handler says otherwise.
:class:`FakeClock` makes sleeping advance time, so polling tests take no time.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from certagent.acme.timing import Clock
from certagent.acme.transport import HttpResponse

BASE = "https://ca.test"
DIRECTORY_URL = f"{BASE}/dir"


def b64d(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Sent:
    method: str
    url: str
    body: bytes | None
    headers: Mapping[str, str]
    timeout: float

    @property
    def jws(self) -> dict[str, str]:
        assert self.body is not None
        value: dict[str, str] = json.loads(self.body)
        return value

    @property
    def protected(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(b64d(self.jws["protected"]))
        return value

    @property
    def payload(self) -> Any:
        raw = self.jws["payload"]
        return None if raw == "" else json.loads(b64d(raw))


Handler = Callable[[Sent], HttpResponse]


def directory(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "newNonce": f"{BASE}/nonce",
        "newAccount": f"{BASE}/acct",
        "newOrder": f"{BASE}/order",
        "revokeCert": f"{BASE}/revoke",
        "keyChange": f"{BASE}/key-change",
        "meta": {"termsOfService": "https://ca.test/tos"},
    }
    doc.update(extra)
    return doc


def json_response(
    doc: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> HttpResponse:
    return HttpResponse(status, dict(headers or {}), json.dumps(doc).encode())


def problem(
    code: str, detail: str = "", status: int = 400, headers: Mapping[str, str] | None = None
) -> HttpResponse:
    doc = {"type": f"urn:ietf:params:acme:error:{code}", "detail": detail, "status": status}
    return HttpResponse(
        status,
        {"content-type": "application/problem+json", **(headers or {})},
        json.dumps(doc).encode(),
    )


@dataclass
class FakeCa:
    routes: dict[tuple[str, str], Handler | list[HttpResponse]] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    closed: bool = False
    _nonces: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    issued_nonces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.route("GET", DIRECTORY_URL, json_response(directory()))
        self.route("HEAD", f"{BASE}/nonce", HttpResponse(200))

    def route(self, method: str, url: str, *answers: HttpResponse | Handler) -> None:
        """Answer ``method url`` with a handler, or with these responses in turn (last repeats)."""
        if len(answers) == 1 and callable(answers[0]):
            self.routes[(method, url)] = answers[0]
        else:
            self.routes[(method, url)] = [a for a in answers if isinstance(a, HttpResponse)]

    def requests(self, method: str | None = None, url: str | None = None) -> list[Sent]:
        return [
            s
            for s in self.sent
            if (method is None or s.method == method) and (url is None or s.url == url)
        ]

    def nonce(self) -> str:
        value = f"nonce{next(self._nonces)}"
        self.issued_nonces.append(value)
        return value

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
    ) -> HttpResponse:
        sent = Sent(method, url, body, dict(headers or {}), timeout)
        self.sent.append(sent)
        route = self.routes.get((method, url))
        if route is None:
            response = problem("malformed", f"no route for {method} {url}", 404)
        elif callable(route):
            response = route(sent)
        else:
            response = route.pop(0) if len(route) > 1 else route[0]
        if method != "GET" and "replay-nonce" not in response.headers:
            response = HttpResponse(
                response.status, {**response.headers, "replay-nonce": self.nonce()}, response.body
            )
        return response

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeClock:
    """Monotonic and wall time that only move when the client sleeps."""

    now: float = 1_800_000_000.0
    sleeps: list[float] = field(default_factory=list)

    async def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> Clock:
        return Clock(time=lambda: self.now, monotonic=lambda: self.now, sleep=self._sleep)
