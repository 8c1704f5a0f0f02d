"""A failed order: its short label (metrics' ``reason``) and how long its name backs off."""

from __future__ import annotations

from certagent.acme import (
    AccountDoesNotExist,
    AcmeDeadline,
    AcmeProblem,
    CaUnavailable,
    ChallengeFailed,
    RateLimited,
)
from certagent.errors import CertificateError, LeaseLost

__all__ = ["backoff_delay", "failure_reason"]


def failure_reason(exc: BaseException) -> str:
    """A short label for a failed order (metrics' ``reason``)."""
    if isinstance(exc, RateLimited):
        return "rate-limited"
    if isinstance(exc, CaUnavailable):
        return "ca-unavailable"
    if isinstance(exc, ChallengeFailed):
        return "challenge"
    if isinstance(exc, AcmeDeadline | TimeoutError):
        return "timeout"
    if isinstance(exc, AccountDoesNotExist):
        return "account"
    if isinstance(exc, AcmeProblem):
        return "ca-refused"
    if isinstance(exc, LeaseLost):
        return "lease-lost"
    if isinstance(exc, CertificateError):
        return "bad-certificate"
    return "error"


def backoff_delay(failures: int, low: float, high: float, rand: float) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling from ``low`` to ``high``.

    ``rand`` in [0, 1) adds up to 10 % jitter, so a fleet does not retry in step.
    """
    base = min(high, low * 2.0 ** max(0, failures - 1))
    return float(base * (1.0 + 0.1 * rand))
