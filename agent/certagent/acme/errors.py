"""The ACME branch of certagent's exception tree, rooted at :class:`AgentError`.

::

    AgentError
     └─ AcmeError                     anything about talking to an ACME CA
         ├─ CaUnavailable             network error, timeout, 5xx: try again later
         ├─ AcmeProtocolError         the CA answered something that is not ACME
         ├─ AcmeProblem               the CA answered with a problem document
         │   ├─ RateLimited           429 / rateLimited, with ``retry_after``
         │   ├─ AccountDoesNotExist   the CA does not know the account (any more)
         │   ├─ ExternalAccountRequired   the CA wants EAB credentials
         │   └─ UserActionRequired    e.g. new terms of service to agree to
         ├─ OrderFailed               the order became ``invalid``
         │   └─ ChallengeFailed       an authorization became ``invalid``
         ├─ AcmeDeadline              the deadline passed while the CA was still working
         └─ ProfileNotOffered         a profile the CA's directory does not list

aiohttp, socket and SSL exceptions are translated into :class:`CaUnavailable` at
the transport (``raise ... from exc``); nothing else from below escapes.  Every
message says which CA answered what, and what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

from certagent.acme.resources import Identifier, Problem
from certagent.errors import AgentError


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


class AcmeError(AgentError):
    """Talking to the ACME CA failed."""


class CaUnavailable(AcmeError):
    """The CA cannot be reached, timed out or answered 5xx: the same request may work later.

    ``retry_after`` is the CA's ``Retry-After`` (seconds from when it answered) if it
    sent one; ``problem`` its problem document, if any.
    """

    def __init__(
        self, message: str, *, retry_after: float | None = None, problem: Problem | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.problem = problem


class AcmeProtocolError(AcmeError):
    """The CA's answer is not valid ACME (bad JSON, missing or malformed field, too large)."""


class AcmeProblem(AcmeError):
    """The CA refused a request with a problem document (RFC 8555 §6.7).

    ``problem`` holds type, detail, status and subproblems; ``url`` the request.
    """

    def __init__(self, problem: Problem, url: str, *, advice: str = "") -> None:
        status = f"{problem.status} " if problem.status else ""
        message = f"the ACME CA refused {url}: {status}{problem.describe()}"
        if advice:
            message = f"{message}; {advice}"
        super().__init__(message)
        self.problem = problem
        self.url = url

    @property
    def type(self) -> str:
        return self.problem.type

    @property
    def detail(self) -> str:
        return self.problem.detail

    @property
    def status(self) -> int | None:
        return self.problem.status

    @property
    def subproblems(self) -> tuple[Problem, ...]:
        return self.problem.subproblems


class RateLimited(AcmeProblem):
    """429 or ``rateLimited``: wait ``retry_after`` seconds (None: the CA did not say)."""

    def __init__(self, problem: Problem, url: str, *, retry_after: float | None) -> None:
        advice = (
            f"retry after {_seconds(retry_after)}"
            if retry_after is not None
            else "the CA sent no Retry-After; back off before trying again"
        )
        super().__init__(problem, url, advice=advice)
        self.retry_after = retry_after


class AccountDoesNotExist(AcmeProblem):
    """The CA does not know this account key / account URL: register again."""

    def __init__(self, problem: Problem, url: str) -> None:
        super().__init__(problem, url, advice="register the account again (newAccount)")


class ExternalAccountRequired(AcmeProblem):
    """The CA only registers accounts with external account binding (RFC 8555 §7.3.4)."""

    def __init__(self, problem: Problem, url: str) -> None:
        super().__init__(
            problem,
            url,
            advice="this CA requires external account binding: configure the EAB key id and"
            " HMAC key the CA gave you",
        )


class UserActionRequired(AcmeProblem):
    """The CA wants a human to act first (typically: agree to new terms of service)."""

    def __init__(self, problem: Problem, url: str, *, instance: str | None = None) -> None:
        where = f" at {instance}" if instance else ""
        super().__init__(problem, url, advice=f"an operator has to act{where} first")
        self.instance = instance


class OrderFailed(AcmeError):
    """The order became ``invalid``; ``problem`` is what the CA said, if it said anything."""

    def __init__(self, message: str, *, url: str, problem: Problem | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.problem = problem


class ChallengeFailed(OrderFailed):
    """An authorization became ``invalid``: the CA could not validate ``identifier``."""

    def __init__(
        self,
        identifier: Identifier,
        challenge_type: str | None,
        *,
        url: str,
        status: str,
        problem: Problem | None = None,
    ) -> None:
        said = problem.describe() if problem is not None else "no error given"
        how = f" by {challenge_type}" if challenge_type else ""
        super().__init__(
            f"the ACME CA could not validate {identifier}{how} (authorization {status}): {said}",
            url=url,
            problem=problem,
        )
        self.identifier = identifier
        self.challenge_type = challenge_type
        self.status = status


class AcmeDeadline(AcmeError):
    """The deadline passed while ``url`` was still ``status`` at the CA; it may finish later."""

    def __init__(self, what: str, url: str, status: str, waited: float) -> None:
        super().__init__(
            f"gave up waiting for the ACME CA after {_seconds(waited)}: {what} {url} is still"
            f" {status}; it may still complete, a later attempt can pick it up"
        )
        self.url = url
        self.status = status


class ProfileNotOffered(AcmeError):
    """The configured profile is not one the CA's directory lists in ``meta.profiles``."""

    def __init__(self, profile: str, offered: Sequence[str], directory: str) -> None:
        choice = ", ".join(offered) if offered else "none (no meta.profiles in its directory)"
        super().__init__(
            f"the ACME CA at {directory} does not offer the profile {profile!r}; it offers:"
            f" {choice}"
        )
        self.profile = profile
        self.offered = tuple(offered)
