"""The in-memory store's issuance roles under a settable clock (the memory-store tests')."""

from __future__ import annotations

from certagent.certs.pem import CertBundle, parse_bundle
from certagent.testing.certs import CA, issue, shared_key

NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def bundle(ca: CA, *names: str) -> CertBundle:
    chain, key = issue(ca, *names, key=shared_key())
    return parse_bundle(chain, key)
