"""How the ACME client talks: directory cache, nonce pool, signed POSTs, error mapping.

:class:`AcmeConnection` is the base of :class:`~certagent.acme.client.AcmeClient`
(which says *what* to ask).  It caches the directory for an hour, keeps up to
:data:`NONCE_POOL` nonces from the ``Replay-Nonce`` of every response (a request
then costs one round trip, not two), retries ``badNonce`` with the nonce that
came with the error (at most :data:`BAD_NONCE_RETRIES` times), and turns every
other refusal into one exception of :mod:`certagent.acme.errors`.  It never
sleeps on a 429 or 503: :class:`~certagent.acme.errors.RateLimited` and
:class:`~certagent.acme.errors.CaUnavailable` carry the CA's ``Retry-After`` for
the caller's (fleet-wide) backoff.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from certagent.acme._doc import check_url
from certagent.acme.errors import (
    AccountDoesNotExist,
    AcmeError,
    AcmeProblem,
    AcmeProtocolError,
    CaUnavailable,
    ExternalAccountRequired,
    RateLimited,
    UserActionRequired,
)
from certagent.acme.jws import AccountKey, sign_request
from certagent.acme.messages import parse_directory, parse_problem
from certagent.acme.resources import Directory
from certagent.acme.timing import Clock, parse_retry_after
from certagent.acme.transport import AiohttpTransport, HttpResponse, Transport
from certagent.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
JOSE = "application/jose+json"
#: badNonce answers retried per request (pebble rejects 5 % of good nonces on purpose).
BAD_NONCE_RETRIES = 5
NONCE_POOL = 32
DIRECTORY_TTL = 3600.0
REQUEST_TIMEOUT = 10.0
#: RFC 8555 §6.5.1: a nonce is base64url.
_NONCE = re.compile(r"[A-Za-z0-9_-]{1,256}\Z")


class AcmeConnection:
    """One CA directory, one account key; requests, nonces and errors (module docstring).

    ``account_url`` is the account's URL (the JWS ``kid``) when it is already known;
    ``ca_file`` trusts a private or test CA instead of the system store;
    ``request_timeout`` bounds every request; ``transport`` and ``clock`` are seams
    for tests.
    """

    def __init__(
        self,
        directory_url: str,
        account_key: AccountKey,
        *,
        account_url: str | None = None,
        ca_file: str | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        transport: Transport | None = None,
        clock: Clock | None = None,
    ) -> None:
        try:
            check_url(directory_url, https_only=False)
        except ValueError as exc:
            raise ConfigError(f"ACME directory {directory_url!r} is {exc}") from exc
        self.directory_url = directory_url
        self.account_key = account_key
        self.account_url = account_url
        self._https_only = directory_url.startswith("https:")
        self._timeout = request_timeout
        self._transport: Transport = transport or AiohttpTransport(ca_file=ca_file)
        self._clock = clock or Clock()
        self._nonces: deque[str] = deque(maxlen=NONCE_POOL)
        self._directory: Directory | None = None
        self._directory_until = 0.0
        self._directory_lock = asyncio.Lock()

    async def close(self) -> None:
        await self._transport.close()

    def deadline(self, seconds: float) -> float:
        """The deadline ``seconds`` from now, on this client's monotonic clock."""
        return self._clock.monotonic() + seconds

    async def directory(self, *, refresh: bool = False) -> Directory:
        """The CA's directory, fetched at most once an hour (now, with ``refresh``)."""
        async with self._directory_lock:
            now = self._clock.monotonic()
            if self._directory is not None and not refresh and now < self._directory_until:
                return self._directory
            response = await self._send("GET", self.directory_url)
            if response.status != 200:
                raise self._error(response, self.directory_url)
            self._directory = parse_directory(
                response.body, self.directory_url, https_only=self._https_only
            )
            self._directory_until = now + DIRECTORY_TTL
            return self._directory

    async def _send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        deadline: float | None = None,
    ) -> HttpResponse:
        """One request, its nonce kept; the timeout shrinks to what is left of ``deadline``."""
        timeout = self._timeout
        if deadline is not None:
            timeout = max(0.05, min(timeout, deadline - self._clock.monotonic()))
        response = await self._transport.request(
            method, url, body=body, headers=headers, timeout=timeout
        )
        nonce = response.header("Replay-Nonce")
        if nonce is not None and _NONCE.match(nonce):
            self._nonces.append(nonce)
        return response

    def _error(self, response: HttpResponse, url: str) -> AcmeError:
        """The exception for an answer with status >= 300."""
        if response.status < 400:
            return AcmeProtocolError(
                f"the ACME CA answered {url} with a redirect ({response.status})"
            )
        problem = parse_problem(response.body, response.status)
        retry_after = parse_retry_after(response.header("Retry-After"), self._clock.time())
        code = problem.code
        if response.status == 429 or code == "rateLimited":
            return RateLimited(problem, url, retry_after=retry_after)
        if response.status >= 500:
            wait = f" (it asks to retry after {retry_after:.0f} s)" if retry_after else ""
            return CaUnavailable(
                f"the ACME CA answered {url} with {response.status}: {problem.describe()}{wait};"
                " it is retried later",
                retry_after=retry_after,
                problem=problem,
            )
        if code == "accountDoesNotExist":
            return AccountDoesNotExist(problem, url)
        if code == "externalAccountRequired":
            return ExternalAccountRequired(problem, url)
        if code == "userActionRequired":
            return UserActionRequired(problem, url)
        return AcmeProblem(problem, url)

    async def _nonce(self) -> str:
        if self._nonces:
            return self._nonces.pop()
        url = (await self.directory()).new_nonce
        response = await self._send("HEAD", url)
        if response.status >= 300:
            raise self._error(response, url)
        if not self._nonces:
            raise AcmeProtocolError(f"the ACME CA's newNonce ({url}) gave no valid Replay-Nonce")
        return self._nonces.pop()

    async def _post(
        self,
        url: str,
        payload: dict[str, Any] | None,
        *,
        jwk: bool = False,
        accept: str | None = None,
        deadline: float | None = None,
    ) -> HttpResponse:
        """A signed POST (``payload=None``: POST-as-GET), badNonce retried with the new nonce.

        ``jwk=True`` signs with the public key in the header (newAccount), otherwise
        with the account URL as ``kid``.
        """
        kid = None if jwk else self._require_account()
        headers = {"Content-Type": JOSE}
        if accept is not None:
            headers["Accept"] = accept
        for attempt in range(BAD_NONCE_RETRIES + 1):
            nonce = await self._nonce()
            body = sign_request(self.account_key, payload, url=url, nonce=nonce, kid=kid)
            response = await self._send("POST", url, body=body, headers=headers, deadline=deadline)
            if response.status < 300:
                return response
            error = self._error(response, url)
            if not (isinstance(error, AcmeProblem) and error.problem.code == "badNonce"):
                raise error
            if attempt == BAD_NONCE_RETRIES:
                raise error
            log.debug("ACME badNonce from %s, retrying (%d)", url, attempt + 1)
        raise AssertionError("unreachable")  # pragma: no cover

    def _require_account(self) -> str:
        if self.account_url is None:
            raise AcmeError("no ACME account yet: register() or find_account() first")
        return self.account_url

    def _location(self, response: HttpResponse, what: str) -> str:
        value = response.header("Location")
        try:
            return check_url(value or "", https_only=self._https_only)
        except ValueError as exc:
            raise AcmeProtocolError(
                f"the ACME CA's {what} answer has no valid Location header ({exc})"
            ) from exc

    async def _fetch(
        self, url: str, parse: Callable[..., T], *, deadline: float | None = None
    ) -> tuple[T, HttpResponse]:
        """POST-as-GET ``url`` and parse the answer with ``parse(body, url, https_only=)``."""
        response = await self._post(url, None, deadline=deadline)
        return parse(response.body, url, https_only=self._https_only), response
