"""The audit trail: one JSON line per request to a route that needs a token.

Every request to such a route, accepted or refused, write or read, and every TLS
handshake the API refuses (not one the client dropped, or let time out), is one
line on the agent's log (logger
``certagent.audit``, INFO, written whatever ``log_level`` says)::

    {"audit": true, "time": "2026-01-31T10:00:00.123Z", "event": "request",
     "token": "panel", "client": null, "remote": "192.0.2.7", "method": "POST",
     "route": "/v1/domains", "target": null, "names": ["a.customer.test"],
     "outcome": "accepted", "status": 201, "code": null}

``token`` is the token's name (null when none was accepted), ``client`` the client
certificate's subject under mutual TLS, ``route`` the route's template (never the
raw path), ``target`` the id or name in the path, ``names`` the hosts involved
(a certificate's names, a registered name), ``outcome`` ``accepted`` (below 400),
``refused`` (4xx) or ``failed`` (5xx), ``code`` the problem's code.  Never a token,
a hash, a header or a body: nothing the client sent but the path's id or name
(cut to 200 characters, JSON-escaped) and the names of what it touched.
With ``api_audit_reads = false`` accepted reads (GET) are counted but not written.

:class:`Auditor` also counts requests by token and outcome, and refused handshakes
by reason, for ``GET /metrics`` (:meth:`Auditor.render`).  O(1) per request (a line:
≈19 µs of CPU, bench/results/2026-12-07-api-tls.md); the counters grow with the
number of token names, not with requests.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["AUDIT_LOGGER", "ENTRY", "NO_TOKEN_LABEL", "AuditEntry", "Auditor", "note", "outcome"]

AUDIT_LOGGER = "certagent.audit"
#: the ``token`` label of requests no token was accepted for (token names have no parentheses)
NO_TOKEN_LABEL = "(none)"  # noqa: S105 (a label, not a secret)
_SHOWN = 200  # characters of a path's id or name written down

log = logging.getLogger(AUDIT_LOGGER)


@dataclass
class AuditEntry:
    """What is known of one request so far; written once, when its answer is ready."""

    method: str
    route: str
    remote: str | None
    client: str | None = None
    token: str | None = None
    target: str | None = None
    names: tuple[str, ...] = ()
    code: str | None = None
    written: bool = field(default=False, repr=False)
    #: the request this entry is about (whose task's context holds it)
    owner: object = field(default=None, repr=False, compare=False)


#: The audit entry of the request being handled (each request runs in its own task).
ENTRY: contextvars.ContextVar[AuditEntry | None] = contextvars.ContextVar(
    "certagent_audit", default=None
)


def note(
    *,
    token: str | None = None,
    names: Iterable[str] | None = None,
    target: str | None = None,
    code: str | None = None,
) -> None:
    """Add what a handler learnt to the request's audit entry (nothing outside a request)."""
    entry = ENTRY.get()
    if entry is None:
        return
    if token is not None:
        entry.token = token
    if code is not None:
        entry.code = code
    if names is not None:
        entry.names = tuple(names)
    if target is not None:
        entry.target = target[:_SHOWN]


def outcome(status: int) -> str:
    if status < 400:
        return "accepted"
    return "refused" if status < 500 else "failed"


class Auditor:
    """Writes the audit lines and keeps the counters ``/metrics`` shows."""

    def __init__(self, now: Callable[[], datetime], *, reads: bool = True) -> None:
        self._now = now
        self._reads = reads
        self.requests: Counter[tuple[str, str]] = Counter()  # (token, outcome)
        self.refused_handshakes: Counter[str] = Counter()  # reason

    def request(self, entry: AuditEntry, status: int) -> None:
        """The line of one answered request (once per entry, however often it is called)."""
        if entry.written:
            return
        entry.written = True
        result = outcome(status)
        self.requests[(entry.token or NO_TOKEN_LABEL, result)] += 1
        if entry.method == "GET" and result == "accepted" and not self._reads:
            return
        self._write(
            {
                "event": "request",
                "token": entry.token,
                "client": entry.client,
                "remote": entry.remote,
                "method": entry.method,
                "route": entry.route,
                "target": entry.target,
                "names": list(entry.names),
                "outcome": result,
                "status": status,
                "code": entry.code if status >= 400 else None,
            }
        )

    def handshake_refused(self, remote: str | None, reason: str, *, written: bool = True) -> None:
        """The line of a TLS handshake the API refused (no HTTP request was read).

        ``written`` False: counted only (a client that went away or said nothing in
        time: a TCP health check, a port scan; no line for each of those).
        """
        self.refused_handshakes[reason] += 1
        if not written:
            return
        self._write(
            {
                "event": "tls-handshake",
                "token": None,
                "client": None,
                "remote": remote,
                "method": None,
                "route": None,
                "target": None,
                "names": [],
                "outcome": "refused",
                "status": None,
                "code": reason,
            }
        )

    def _write(self, fields: dict[str, object]) -> None:
        moment = self._now().astimezone(UTC).isoformat(timespec="milliseconds")
        line = {"audit": True, "time": moment.replace("+00:00", "Z"), **fields}
        text = json.dumps(line)
        log.info("%s", text, extra={"audit_line": text})

    def render(self) -> bytes:
        """The counters in Prometheus' text format (appended to the agent's ``/metrics``)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Counters(self))
        return generate_latest(registry)


class _Counters(Collector):
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "certagent_api_requests",
            "REST API requests to routes that need a token, by token name ((none): no token"
            " accepted) and outcome (accepted, refused: 4xx, failed: 5xx)",
            labels=["token", "outcome"],
        )
        for (token, result), count in sorted(self.auditor.requests.items()):
            requests.add_metric([token, result], count)
        yield requests
        refused = CounterMetricFamily(
            "certagent_api_tls_refused",
            "TLS handshakes the REST API refused, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(self.auditor.refused_handshakes.items()):
            refused.add_metric([reason], count)
        yield refused
