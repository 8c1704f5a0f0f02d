"""Who a request is and what it may do: token, expiry, rate and scope, then names.

:func:`admit` runs once for each request to a route that needs a token (in the
middleware, or earlier for ``Expect: 100-continue``, before the body is sent):

1. who: the bearer token (``Authorization: Bearer``); without one, the client
   certificate's subject if the tokens file gives it to a token (mutual TLS).
   Neither: 401 ``missing-token``; a token the file lacks: 403 ``bad-token``;
2. when: a token past its ``expires``: 401 ``expired-token``;
3. how often: over its rate: 429 ``rate-limited``, with ``Retry-After``;
4. what: without the scope the operation needs: 403 ``forbidden``, whose
   ``scope`` member names it.

The handlers then hold every name to the token's patterns (:func:`visible`,
:func:`check_names`): a read sees only the certificates, registrations and slots
whose every name is inside, and gets 404 for any other exactly as for one that
does not exist; a write outside gets 403 ``forbidden-name``.

Cost per request: O(tokens) hash comparisons (:class:`~certagent.api.auth.TokenFile`),
O(1) for the rate bucket and the scope, O(patterns x names) for the names.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from .audit import note
from .auth import TokenFile, bearer_token
from .grants import EVERYTHING, Grant, Rate, Scope
from .problems import BadToken, ExpiredToken, Forbidden, ForbiddenName, MissingToken, RateLimited

__all__ = [
    "PRINCIPAL",
    "Principal",
    "RateLimiter",
    "admit",
    "check_names",
    "current",
    "visible",
]


@dataclass(frozen=True)
class Principal:
    """The token a request was admitted as (and its client certificate, if any)."""

    name: str
    grant: Grant = EVERYTHING
    #: the client certificate's subject (RFC 4514) under mutual TLS
    client: str | None = None


#: The principal of the request being handled (set by :func:`admit`'s caller; each
#: request runs in its own task, hence its own context).
PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "certagent_principal", default=None
)


@dataclass
class _Bucket:
    rate: Rate
    level: float
    stamp: float


class RateLimiter:
    """A token bucket per token name: ``rate`` on average, one second's worth at once.

    O(1) per request; memory: one bucket per token with a rate (bounded below).
    """

    MAX_BUCKETS = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def wait(self, name: str, rate: Rate) -> float:
        """0 if ``name`` may make a request now (it is counted), else seconds until it may."""
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None or bucket.rate != rate:  # new, or its rate changed in the file
            if len(self._buckets) >= self.MAX_BUCKETS:
                self._buckets.clear()
            bucket = self._buckets[name] = _Bucket(rate, rate.burst, now)
        bucket.level = min(rate.burst, bucket.level + (now - bucket.stamp) * rate.per_second)
        bucket.stamp = now
        if bucket.level >= 1.0:
            bucket.level -= 1.0
            return 0.0
        return (1.0 - bucket.level) / rate.per_second


def admit(
    tokens: TokenFile,
    limiter: RateLimiter,
    *,
    authorization: str | None,
    client: str | None,
    scope: Scope,
    now: datetime,
) -> Principal:
    """The principal of a request needing ``scope``; an ApiError (401/403/429) otherwise.

    ``client`` is the verified client certificate's subject (mutual TLS), or None.
    The audit entry of the request gets the token's name as soon as it is known.
    """
    token = bearer_token(authorization)
    if token is not None:
        entry = tokens.find(token)
        if entry is None:
            raise BadToken("the bearer token is not accepted: it is unknown or was revoked")
    else:
        entry = tokens.for_subject(client) if client is not None else None
        if entry is None:
            raise MissingToken(
                "this endpoint needs a token: send Authorization: Bearer <token>"
                " (make one with `certagent token add NAME --file <api_tokens_file>`)"
                + (
                    "; this client certificate's subject is given to no token"
                    " (`certagent token add NAME --client-subject SUBJECT`)"
                    if client is not None
                    else ""
                )
            )
    note(token=entry.name)
    grant = entry.grant
    if grant.expires is not None and grant.expired(now):
        raise ExpiredToken(
            f"token {entry.name!r} expired at {_iso(grant.expires)}: ask for a new one"
        )
    if grant.rate is not None:
        wait = limiter.wait(entry.name, grant.rate)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise RateLimited(
                f"token {entry.name!r} is over its rate of {grant.rate}: retry in {seconds} s",
                headers={"Retry-After": str(seconds)},
            )
    if not grant.allows(scope):
        have = ", ".join(s.value for s in Scope if s in grant.scopes)
        raise Forbidden(
            f"this operation needs the scope {scope.value!r}; token {entry.name!r} has {have}",
            extra={"scope": scope.value},
        )
    return Principal(entry.name, grant, client)


def current() -> Principal:
    """The request's principal; Forbidden if none was admitted (a handler wired wrongly)."""
    principal = PRINCIPAL.get()
    if principal is None:
        raise Forbidden("no token was checked for this request")
    return principal


def visible(names: Iterable[str]) -> bool:
    """Whether the request's token may see something with these names (all inside)."""
    return current().grant.allows_names(names)


def check_names(names: Iterable[str]) -> None:
    """ForbiddenName unless every one of ``names`` is inside the token's patterns (a write).

    The names go into the request's audit entry either way.
    """
    listed = tuple(names)
    note(names=listed)
    principal = current()
    if not principal.grant.allows_names(listed):
        patterns = ", ".join(str(p) for p in principal.grant.patterns)
        outside = [n for n in listed if not principal.grant.allows_name(n)]
        raise ForbiddenName(
            f"token {principal.name!r} may act only on names matching {patterns};"
            f" {len(outside)} of the names are outside",
        )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
