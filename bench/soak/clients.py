"""Client threads doing verified TLS handshakes against every node, and their tally.

Each handshake is verified by OpenSSL with hostname checking against the right root
only (pebble's roots for on-demand names, the test CA for imported ones), and its leaf's
validity is checked again at that moment (notBefore <= now < notAfter).  Outcomes:

* ``ok``;
* ``expired``: OpenSSL said the certificate has expired (or it was outside its validity
  when checked);
* ``wrong``: another verification error (a default certificate, a foreign name, an
  unknown root); ``default`` counts the part of those that were the node's fallback
  certificate (one unverified ClientHello after the failure);
* ``failed``: no handshake (refused, reset, timeout, a closed connection).
"""

from __future__ import annotations

import datetime as dt
import ssl
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from bench.soak.disruptions import KINDS, Disruptions
from certagent.testing import Stack, tlsclient

OUTCOMES = ("ok", "expired", "wrong", "failed")
X509_V_ERR_CERT_HAS_EXPIRED = 10
HANDSHAKE_TIMEOUT = 15.0  # above the Lua hold of a first connection
BAD_KEPT = 10  # examples of bad handshakes kept for the report, per outcome x disruption


class Trust:
    """Client contexts per kind of name; pebble's roots accumulate (a new root per CA start)."""

    def __init__(self, imported_root_pem: bytes, pebble_root_pem: bytes) -> None:
        self._lock = threading.Lock()
        # cadata given: Python loads no system roots, only these
        self.imported = ssl.create_default_context(cadata=imported_root_pem.decode())
        self._pebble_roots = [pebble_root_pem.decode()]
        self.ondemand = ssl.create_default_context(cadata=self._pebble_roots[0])

    def add_pebble_root(self, pem: bytes) -> None:
        """Trust one more pebble root (kept with the earlier ones: their leaves still live)."""
        with self._lock:
            if pem.decode() in self._pebble_roots:
                return
            self._pebble_roots.append(pem.decode())
            context = ssl.create_default_context(cadata="".join(self._pebble_roots))
            self.ondemand = context  # one reference swap; threads pick it up per handshake

    def context(self, imported: bool) -> ssl.SSLContext:
        return self.imported if imported else self.ondemand


@dataclass(frozen=True)
class Result:
    outcome: str
    detail: str = ""
    default: bool = False


def verify_once(stack: Stack, host: str, context: ssl.SSLContext) -> Result:
    """One verified handshake with ``host`` on ``stack``, classified (module docstring)."""
    try:
        info = tlsclient.handshake(
            stack.port, host, context=context, timeout=HANDSHAKE_TIMEOUT, address=stack.address
        )
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == X509_V_ERR_CERT_HAS_EXPIRED:
            return Result("expired", exc.verify_message)
        return Result("wrong", exc.verify_message, default=_is_default(stack, host))
    except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
        return Result("failed", f"{type(exc).__name__}: {exc}")
    cert = x509.load_der_x509_certificate(info.der)
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return Result("expired", f"valid {cert.not_valid_before_utc} .. {cert.not_valid_after_utc}")
    return Result("ok")


def _is_default(stack: Stack, host: str) -> bool:
    """Whether the node now sends its fallback certificate for ``host`` (unverified hello)."""
    try:
        der = tlsclient.raw_hello(stack.port, host.encode(), timeout=5.0, address=stack.address)
    except (OSError, TimeoutError, ValueError):
        return False  # cannot tell: counted as wrong, not as default
    return der == stack.default_der


@dataclass
class Tally:
    """Handshakes by outcome x disruption (and per node), with examples of bad ones."""

    t0: float
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    per_node: Counter[tuple[int, str]] = field(default_factory=Counter)
    defaults: Counter[str] = field(default_factory=Counter)  # wrong that were default, by kind
    bad: list[dict[str, Any]] = field(default_factory=list)
    kept: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad_total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, node: int, host: str, start: float, result: Result, during: str) -> None:
        with self.lock:
            self.counts[result.outcome, during] += 1
            self.per_node[node, result.outcome] += 1
            if result.default:
                self.defaults[during] += 1
            if result.outcome != "ok":
                self.bad_total += 1
                if self.kept[result.outcome, during] < BAD_KEPT:
                    self.kept[result.outcome, during] += 1
                    self.bad.append(
                        {
                            "t_s": round(start - self.t0, 2),
                            "node": node,
                            "host": host,
                            "outcome": result.outcome,
                            "default": result.default,
                            "during": during,
                            "detail": result.detail[:200],
                        }
                    )

    def total(self) -> int:
        return sum(self.counts.values())

    def table(self) -> dict[str, dict[str, int]]:
        """{outcome: {disruption: count}} with every outcome and disruption listed."""
        with self.lock:
            return {o: {k: self.counts[o, k] for k in KINDS} for o in OUTCOMES}

    def as_dict(self, nodes: int) -> dict[str, Any]:
        table = self.table()
        return {
            "total": self.total(),
            "by_outcome": {o: sum(table[o].values()) for o in OUTCOMES},
            "by_outcome_and_disruption": table,
            "wrong_that_were_default_by_disruption": {k: self.defaults[k] for k in KINDS},
            "per_node": [{o: self.per_node[n, o] for o in OUTCOMES} for n in range(nodes)],
            "bad_examples": self.bad,
            "bad_total": self.bad_total,
        }


class Clients:
    """``count`` threads; each goes round-robin over the names (from its own offset) and,
    for each name, does one verified handshake on every node."""

    def __init__(
        self,
        stacks: Sequence[Stack],
        names: Sequence[tuple[str, bool]],  # (host, imported)
        trust: Trust,
        disruptions: Disruptions,
        tally: Tally,
        count: int,
        pause: float = 0.0,
    ) -> None:
        self.stacks, self.names, self.trust = list(stacks), list(names), trust
        self.disruptions, self.tally, self.pause = disruptions, tally, pause
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._run, args=(i, count), name=f"soak-client-{i}", daemon=True
            )
            for i in range(count)
        ]

    def _run(self, index: int, count: int) -> None:
        position = index * len(self.names) // count
        while not self._stop.is_set():
            host, imported = self.names[position % len(self.names)]
            position += 1
            for node, stack in enumerate(self.stacks):
                if self._stop.is_set():
                    return
                start = time.time()
                result = verify_once(stack, host, self.trust.context(imported))
                during = self.disruptions.during(node, start, time.time())
                self.tally.add(node, host, start, result, during)
                if self.pause:
                    self._stop.wait(self.pause)

    def start(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = HANDSHAKE_TIMEOUT + 10.0) -> list[str]:
        """Stop and join every thread (each ends after its handshake); names those that did not."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]
