"""Before the clock starts: every on-demand name issued once (its first connection).

A first connection waits for the order (``acme_wait``) and may get the fallback past
it; the warm-up retries each name until a verified handshake, so the measured run sees
only stored names.  Each name's first certificate (notBefore, lifetime) is the basis
of the renewals-due estimate.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cryptography import x509

from bench.soak.clients import HANDSHAKE_TIMEOUT, Trust
from certagent.testing import Stack, tlsclient

WORKERS = 8


@dataclass(frozen=True)
class FirstCert:
    host: str
    not_before: float
    not_after: float
    attempts: int


def issue_all(
    stacks: Sequence[Stack], hosts: Sequence[str], trust: Trust, deadline: float
) -> tuple[list[FirstCert], list[str]]:
    """Connect to each host (on node ``i % nodes``) until served; (issued, never served)."""

    def one(i: int, host: str) -> FirstCert | str:
        stack = stacks[i % len(stacks)]
        attempts = 0
        last = ""
        while time.monotonic() < deadline:
            attempts += 1
            try:
                info = tlsclient.handshake(
                    stack.port,
                    host,
                    context=trust.context(imported=False),
                    timeout=HANDSHAKE_TIMEOUT,
                    address=stack.address,
                )
            except (OSError, TimeoutError) as exc:  # the fallback, or the order still running
                last = f"{type(exc).__name__}: {exc}"
                time.sleep(1.0)
                continue
            cert = x509.load_der_x509_certificate(info.der)
            return FirstCert(
                host,
                cert.not_valid_before_utc.timestamp(),
                cert.not_valid_after_utc.timestamp(),
                attempts,
            )
        return f"{host}: {last}"

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="soak-warmup") as pool:
        results = list(pool.map(one, range(len(hosts)), hosts))
    issued = [r for r in results if isinstance(r, FirstCert)]
    missing = [r for r in results if isinstance(r, str)]
    return issued, missing
