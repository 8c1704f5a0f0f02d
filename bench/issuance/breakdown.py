"""Where a first connection's time goes, from the agent's log and the client's clock.

The agent (``--log-level debug``) logs, per name: the order placed (``ACME order
<url> for <name>: pending``, right after newOrder), the certificate downloaded
(``ACME order <url>: certificate for <name>``), the record stored, and the name
served from a slot.  With the client's wall-clock start and end of each first
connection (same machine, same clock, log times in ms) that splits each first
connection into:

* ``to_order``: connect(), ClientHello, Lua, the agent's permission check, the
  name's lease and order slot, newOrder at the CA;
* ``order``: the rest of the ACME order (publishing the challenge through the
  store and waiting for the nodes' acks, validation, finalize, download);
* ``store``: validating the certificate like an upload, encrypting and storing it;
* ``load``: loading it into HAProxy;
* ``handshake``: the held connection goes on and the TLS handshake completes.

The bench's direct orders log the same two ACME lines (captured in-process), so
``order`` has a like-for-like counterpart: the CA's part with no agent around it.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from bench._load import percentile

SEGMENTS = ("to_order", "order", "store", "load", "handshake")

_STAMP = r"(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
_PENDING = re.compile(r"ACME order (?P<url>\S+) for (?P<name>\S+): pending")
_CERT = re.compile(r"ACME order (?P<url>\S+): certificate for (?P<name>\S+)")
_STORED = re.compile(_STAMP + r"INFO \S+: stored certificate \S+ for (?P<name>\S+) ")
_SERVING = re.compile(_STAMP + r"INFO \S+: serving (?P<name>\S+) from ")
_LINE = re.compile(_STAMP + r"DEBUG certagent\.acme\.issue: (?P<msg>.*)")


def _when(stamp: str) -> float:
    """A log line's local time as a Unix time (the agent logs with %(asctime)s)."""
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def order_spans(events: Iterable[tuple[float, str]]) -> dict[str, tuple[float, float]]:
    """name -> (pending, certificate) times from ``(time, message)`` ACME log events."""
    pending: dict[str, tuple[str, float]] = {}
    out: dict[str, tuple[float, float]] = {}
    for when, msg in events:
        if m := _PENDING.match(msg):
            pending[m["url"]] = (m["name"], when)
        elif (m := _CERT.match(msg)) and m["url"] in pending:
            name, started = pending.pop(m["url"])
            out[name] = (started, when)
    return out


def _agent_events(log: str) -> Iterator[tuple[float, str]]:
    for line in log.splitlines():
        if m := _LINE.match(line):
            yield _when(m["t"]), m["msg"]


def segments(log: str, clients: Mapping[str, tuple[float, float]]) -> dict[str, list[float]]:
    """Per segment, seconds for every name of ``clients`` (name -> client start, end)."""
    orders = order_spans(_agent_events(log))
    stored: dict[str, float] = {}
    served: dict[str, float] = {}
    for line in log.splitlines():
        if m := _STORED.match(line):
            stored.setdefault(m["name"], _when(m["t"]))
        elif m := _SERVING.match(line):
            served.setdefault(m["name"], _when(m["t"]))
    out: dict[str, list[float]] = {s: [] for s in SEGMENTS}
    for name, (start, end) in clients.items():
        if name not in orders or name not in stored or name not in served:
            continue
        pending, cert = orders[name]
        for segment, value in zip(
            SEGMENTS,
            (pending - start, cert - pending, stored[name] - cert,
             served[name] - stored[name], end - served[name]),
            strict=True,
        ):  # fmt: skip
            out[segment].append(value)
    return out


def p50_ms(values: Sequence[float]) -> float:
    return round(percentile([v * 1000 for v in values], 50), 1)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append((record.created, record.getMessage()))


@contextmanager
def captured_orders() -> Iterator[list[tuple[float, str]]]:
    """The ``certagent.acme.issue`` debug events of this process while inside."""
    logger = logging.getLogger("certagent.acme.issue")
    handler, level = _Capture(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def summary(parts: Mapping[str, Sequence[float]], direct_order: Sequence[float]) -> dict[str, Any]:
    """p50 per segment (ms), and the direct orders' counterpart of ``order``."""
    return {
        "count": len(parts.get("order", ())),
        **{f"{s}_p50_ms": p50_ms(parts.get(s, ())) for s in SEGMENTS},
        "direct_order_p50_ms": p50_ms(direct_order),
        "direct_order_count": len(direct_order),
    }
