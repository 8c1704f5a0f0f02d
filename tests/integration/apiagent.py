"""Talking to a real agent's REST API in integration tests: requests, audit lines, secrets.

Plain urllib (the tests are synchronous, like :class:`~certagent.testing.Stack`);
every answer is kept, errors included.  :class:`Audited` remembers, for each
request to a route that needs a token, the audit line the agent must have
written, so a test compares the agent's log with that list, line for line.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

from certagent.testing import Stack

__all__ = ["Answer", "Audited", "audit_lines", "secrets_of_pem", "unsafe_lines"]


@dataclass
class Answer:
    status: int
    headers: Message
    body: Any

    @property
    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None


def call(
    url: str,
    method: str,
    *,
    token: str | None = None,
    json_body: object = None,
    data: bytes | None = None,
    content_type: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> Answer:
    """One request; any status is an :class:`Answer` (a refused connection raises OSError)."""
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if json_body is not None:
        data = json.dumps(json_body).encode()
        content_type = "application/json"
    if content_type is not None:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=15, context=tls) as reply:  # loopback
            raw, status, got = reply.read(), reply.status, reply.headers
    except urllib.error.HTTPError as err:
        raw, status, got = err.read(), err.code, err.headers
    text = raw.decode()
    ctype = got.get("Content-Type", "")
    return Answer(status, got, json.loads(text) if text and "json" in ctype else text)


@dataclass
class Audited:
    """A REST API at ``base`` and the audit lines its requests must leave, in order."""

    base: str
    tls: ssl.SSLContext | None = None
    expected: list[tuple[str | None, str, str, int]] = field(default_factory=list)

    def call(
        self, token: tuple[str, str] | None, method: str, path: str, route: str, **kwargs: Any
    ) -> Answer:
        """``token`` is (name, secret): the name the audit line must carry; None: no token."""
        answer = call(
            self.base + path,
            method,
            token=None if token is None else token[1],
            tls=self.tls,
            **kwargs,
        )
        name = None if token is None or answer.code in ("bad-token", "missing-token") else token[0]
        self.expected.append((name, method, route, answer.status))
        return answer

    def check(self, stack: Stack, since: int = 0) -> list[dict[str, Any]]:
        """The agent's audit lines after the first ``since`` ones: exactly the expected ones."""
        lines = audit_lines(stack)[since:]
        requests = [line for line in lines if line["event"] == "request"]
        got = [(a["token"], a["method"], a["route"], a["status"]) for a in requests]
        assert got == self.expected, _first_difference(got, self.expected)
        for line in requests:
            status = line["status"]
            assert line["outcome"] == (
                "accepted" if status < 400 else "refused" if status < 500 else "failed"
            ), line
            assert line["time"].endswith("Z") and line["remote"] == "127.0.0.1", line
        return lines


def _first_difference(got: list[Any], want: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"line {i}: logged {a}, expected {b} ({len(got)} logged, {len(want)} expected)"
    return (
        f"{len(got)} logged, {len(want)} expected: {got[len(want) :][:3]} / {want[len(got) :][:3]}"
    )


def audit_lines(stack: Stack) -> list[dict[str, Any]]:
    """Every audit line of the agent's log, parsed (each is one JSON object, alone on its line)."""
    found = []
    for line in stack.agent_log().splitlines():
        if line.startswith('{"audit": true'):
            found.append(json.loads(line))
    return found


def secrets_of_pem(pem: bytes) -> list[str]:
    """The base64 lines of a PEM private key: any of them in a log is key material leaked."""
    return [
        line
        for line in pem.decode().splitlines()
        if line and not line.startswith("-----") and len(line) >= 16
    ]


def unsafe_lines(log: str, secrets: list[str]) -> list[str]:
    """The log lines holding any of ``secrets`` (also looked for as base64 of their bytes)."""
    needles = set(secrets) | {base64.b64encode(s.encode()).decode()[:24] for s in secrets}
    return [line[:200] for line in log.splitlines() if any(n in line for n in needles)]


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
