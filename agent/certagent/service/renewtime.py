"""When to renew an ACME certificate, when to ask the CA again, when to retry: pure arithmetic.

Times are Unix seconds; randomness comes from a :class:`random.Random` the caller
gives, seeded per certificate (:func:`cert_rng`), so every node of a fleet and
every re-computation for one certificate pick the same moment.

* :meth:`RenewPolicy.default_at`: two thirds into the lifetime (one half for
  lifetimes under 10 days), moved by up to ``jitter`` of the lifetime either way,
  so a day of sign-ups does not come back as one busy minute of renewals.
* :meth:`RenewPolicy.ari_at` / :meth:`RenewPolicy.ari_check_at`: RFC 9773 §4.2:
  a uniform moment inside the CA's suggestedWindow (now if it has passed), and
  when to fetch renewalInfo again (its ``Retry-After``, clamped).
* :meth:`RenewPolicy.retry_at`: after a failed renewal, exponential backoff,
  never later than expiry minus ``margin``, and on until expiry and past it.
* :meth:`RenewPolicy.scaled`: the retry floor, the backoff cap, the margin and the
  issuance lease of one renewal, scaled to the certificate's remaining lifetime, so a
  certificate living minutes (tests) is retried as a certificate living days is, in
  proportion; long lifetimes keep the settings as they are.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["SHORT_LIFETIME", "RenewPolicy", "Scaled", "cert_rng", "lifetime_fraction"]

#: Lifetimes under this (10 days) renew at one half instead of two thirds.
SHORT_LIFETIME = 10 * 86400.0
#: The largest jitter accepted: with it a renewal still falls within 35 % .. 82 % of the lifetime.
MAX_JITTER = 0.15
#: RFC 9773 §4.3.3: without a Retry-After, ask again after six hours.
ARI_DEFAULT_CHECK = 6 * 3600.0
#: Scaling (:meth:`RenewPolicy.scaled`), as shares of the remaining lifetime: the first
#: retry after at most 1/50 of it, backoff capped at 1/8, the margin at most 1/4, the
#: lease at most 1/6 of it (so a node that dies holding a lease blocks the name for a
#: small part of what is left) ...
RETRY_MIN_SHARE = 1 / 50
RETRY_MAX_SHARE = 1 / 8
MARGIN_SHARE = 1 / 4
LEASE_SHARE = 1 / 6
#: ... and never below these floors (s): a CA is not asked more often than every few
#: seconds for one name, and a lease outlives a few store round trips and its renewal.
RETRY_FLOOR = 5.0
LEASE_FLOOR = 20.0


@dataclass(frozen=True)
class Scaled:
    """The timings of one renewal attempt (:meth:`RenewPolicy.scaled`), in seconds."""

    retry_min: float  # the first retry after a failure
    retry_max: float  # backoff doubles up to this (also caps the issuer's backoff)
    margin: float  # retries are never planned later than expiry minus this
    lease: float  # the issuance lease's TTL (renewed every third of it while ordering)


def lifetime_fraction(lifetime: float) -> float:
    """How far into its lifetime a certificate renews: 2/3, or 1/2 under 10 days."""
    return 0.5 if lifetime < SHORT_LIFETIME else 2.0 / 3.0


def cert_rng(seed: str) -> random.Random:
    """The random source of one certificate (seed: its serial): the same draws on every node."""
    return random.Random(seed)  # noqa: S311 (timing jitter, not a secret)


@dataclass(frozen=True)
class RenewPolicy:
    """The renewal timing settings (``renew_*``); all methods are pure."""

    jitter: float = 0.05  # of the lifetime, either way of the default moment
    ari_min: float = 60.0  # renewalInfo is asked again after Retry-After, at least this
    ari_max: float = 86400.0  # ... and at most this
    retry_min: float = 60.0  # the first retry after a failed renewal
    retry_max: float = 6 * 3600.0  # backoff doubles up to this
    margin: float = 3600.0  # retries are never planned later than expiry minus this

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= MAX_JITTER:
            raise ValueError(f"the renewal jitter must be within 0 .. {MAX_JITTER}")
        if not 0.0 < self.ari_min <= self.ari_max:
            raise ValueError("ari_min must be positive and at most ari_max")
        if not 0.0 < self.retry_min <= self.retry_max:
            raise ValueError("retry_min must be positive and at most retry_max")
        if self.margin < 0:
            raise ValueError("the expiry margin must not be negative")

    def default_at(self, not_before: float, not_after: float, rng: random.Random) -> float:
        """When a certificate valid from ``not_before`` to ``not_after`` should renew.

        A certificate with no lifetime left to speak of (``not_after <= not_before``)
        renews at ``not_before``, i.e. as soon as it is looked at.
        """
        lifetime = not_after - not_before
        if lifetime <= 0:
            return not_before
        base = not_before + lifetime * lifetime_fraction(lifetime)
        return base + self.jitter * lifetime * (2.0 * rng.random() - 1.0)

    def ari_at(self, start: float, end: float, now: float, rng: random.Random) -> float:
        """A uniform moment in the suggested window [start, end); ``now`` if it is past.

        A window whose end has passed means "renew now" (RFC 9773 §4.2), as does a
        moment drawn before ``now``.
        """
        if end <= now or end <= start:
            return now
        return max(now, start + (end - start) * rng.random())

    def ari_check_at(self, now: float, retry_after: float | None) -> float:
        """When to fetch renewalInfo again: ``Retry-After`` (six hours without one), clamped."""
        wait = ARI_DEFAULT_CHECK if retry_after is None else retry_after
        return now + min(self.ari_max, max(self.ari_min, wait))

    def scaled(self, now: float, not_after: float, lease: float) -> Scaled:
        """The retry floor, backoff cap, margin and lease TTL for a certificate now.

        Each is the setting (``lease``: the issuer's lease for an order), or its
        share of the remaining lifetime ``not_after - now`` (``*_SHARE``) where
        that is smaller, but not below its floor.  A certificate with days left
        keeps the settings; one with 150 s left (a 300 s certificate at half its
        life) retries after 5 s, backs off up to 19 s, keeps a 38 s margin and
        takes a 25 s lease.  ``not_after`` 0 (unknown) or past: the settings as
        they are (an expired certificate is retried every ``retry_min``, as
        :meth:`retry_at` says).
        """
        left = not_after - now
        if not_after <= 0 or left <= 0:
            return Scaled(self.retry_min, self.retry_max, self.margin, lease)
        retry_min = min(self.retry_min, max(RETRY_FLOOR, left * RETRY_MIN_SHARE))
        return Scaled(
            retry_min=retry_min,
            retry_max=min(self.retry_max, max(retry_min, left * RETRY_MAX_SHARE)),
            margin=min(self.margin, left * MARGIN_SHARE),
            lease=min(lease, max(LEASE_FLOOR, left * LEASE_SHARE)),
        )

    def retry_at(self, now: float, failures: int, not_after: float, rand: float) -> float:
        """The next attempt after ``failures`` failed renewals in a row (``rand`` in [0, 1)).

        Doubling from the retry floor to the backoff cap (plus up to 10 % jitter),
        both scaled to the remaining lifetime (:meth:`scaled`), but never planned
        past ``not_after`` minus the margin: the last attempts before expiry come at
        least every retry floor, and the ones after it every ``retry_min`` (an
        expired certificate is still served; renewing it is still the cure).
        ``not_after`` 0 means unknown: plain backoff.
        """
        s = self.scaled(now, not_after, 0.0)
        delay = min(s.retry_max, s.retry_min * 2.0 ** max(0, failures - 1))
        at = now + delay * (1.0 + 0.1 * rand)
        latest = not_after - s.margin
        if not_after > 0 and at > latest:  # 0: expiry unknown, no cap
            at = max(now + s.retry_min, latest)
        return at
