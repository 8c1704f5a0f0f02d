"""The REST API application and its server: :func:`make_app`, :func:`start_api`.

Middlewares, outermost first: ``_problems`` turns every error into one RFC 9457
response (via :mod:`certagent.api.problems`), ``_auth`` checks the bearer token of
every route except ``/healthz``, ``/readyz``, ``/metrics`` and ``/v1/openapi.json``.  Requests
that never reach them (unparseable HTTP) get their problem from
:class:`~certagent.api.server.ProblemRunner`, which serves the app.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib import resources

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.typedefs import Handler

from certagent.certs.validate import UploadPolicy
from certagent.config import Settings, parse_bind
from certagent.errors import AgentError, BundleTooLarge, ConfigError
from certagent.store.base import Store
from certagent.store.renewals import Managed

from .auth import TokenFile, bearer_token
from .body import http_body_limit, upload_policy
from .domains import domain_routes
from .loaded import LoadedSlot
from .problems import BadToken, MissingToken, problem_for, problem_for_http
from .renewals import renewal_routes
from .server import ProblemRunner, log_problem
from .views import CONTEXT, TOKEN_NAME, ApiContext, routes

__all__ = ["ApiServer", "make_app", "openapi_document", "start_api"]

log = logging.getLogger(__name__)

ROUTES = (*routes, *domain_routes, *renewal_routes)
PUBLIC_ROUTES = frozenset(name for _, _, _, name, auth in ROUTES if not auth)
#: How long aiohttp keeps reading (and discarding) the rest of a refused body, so the
#: client sees the error instead of a reset connection.
LINGER_SECONDS = 2.0
#: How long :meth:`ApiServer.close` lets open requests finish.
SHUTDOWN_SECONDS = 2.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


def openapi_document() -> bytes:
    """The OpenAPI 3.1 document packaged beside this module."""
    return resources.files("certagent.api").joinpath("openapi.json").read_bytes()


def make_app(
    store: Store,
    *,
    tokens: TokenFile,
    policy: UploadPolicy,
    loaded: Callable[[], Awaitable[Sequence[LoadedSlot]]],
    ready: Callable[[], bool],
    now: Callable[[], datetime] = _utcnow,
    metrics: Callable[[], Awaitable[bytes]] | None = None,
    manage: Callable[[str], Awaitable[Managed]] | None = None,
) -> web.Application:
    """The aiohttp application (tests run it in a TestServer; :func:`start_api` serves it)."""
    body_limit = http_body_limit(policy.max_bytes)
    app = web.Application(client_max_size=body_limit, middlewares=[_problems, _auth])
    app[CONTEXT] = ApiContext(
        store=store,
        tokens=tokens,
        policy=policy,
        body_limit=body_limit,
        loaded=loaded,
        ready=ready,
        now=now,
        openapi=openapi_document(),
        metrics=metrics or _no_metrics,
        manage=manage,
    )
    for method, path, handler, name, _ in ROUTES:
        app.router.add_route(method, path, handler, name=name, expect_handler=_expect)
    return app


async def _no_metrics() -> bytes:
    return b""


class ApiServer:
    """The running REST API; :meth:`close` stops it (open requests get a short drain)."""

    def __init__(self, runner: web.AppRunner, url: str, tokens: TokenFile) -> None:
        self._runner = runner
        self.url = url
        self.tokens = tokens

    def reload_tokens(self) -> int:
        """Re-read the tokens file now (SIGHUP); how many tokens it holds."""
        self.tokens.refresh()
        return len(self.tokens.names)

    async def close(self) -> None:
        await self._runner.cleanup()
        log.info("REST API on %s stopped", self.url)


async def start_api(
    settings: Settings,
    store: Store,
    *,
    loaded: Callable[[], Awaitable[Sequence[LoadedSlot]]],
    ready: Callable[[], bool],
    now: Callable[[], datetime] = _utcnow,
    metrics: Callable[[], Awaitable[bytes]] | None = None,
    manage: Callable[[str], Awaitable[Managed]] | None = None,
) -> ApiServer | None:
    """Serve the REST API on ``settings.api_bind``; None if ``api_tokens_file`` is not set.

    Raises :class:`~certagent.errors.ConfigError` if the tokens file is missing or
    malformed, or the address cannot be bound.
    """
    if not settings.api_tokens_file:
        log.info("REST API off (api_tokens_file is not set)")
        return None
    tokens = TokenFile.load(settings.api_tokens_file)
    app = make_app(
        store,
        tokens=tokens,
        policy=upload_policy(settings),
        loaded=loaded,
        ready=ready,
        now=now,
        metrics=metrics,
        manage=manage,
    )
    host, port = parse_bind(settings.api_bind)
    runner = ProblemRunner(
        app,
        access_log=None,
        handle_signals=False,
        lingering_time=LINGER_SECONDS,
        shutdown_timeout=SHUTDOWN_SECONDS,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot serve the REST API on {settings.api_bind}: {exc.strerror}"
        ) from exc
    bound = runner.addresses[0]
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    url = f"http://{shown}:{bound[1]}"
    log.info("REST API listening on %s (%d tokens)", url, len(tokens.names))
    return ApiServer(runner, url, tokens)


# --- middlewares ------------------------------------------------------------------------


@web.middleware
async def _problems(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        problem = problem_for_http(exc)
    except AgentError as exc:
        problem = problem_for(exc)
        if problem.status >= 500:
            log.warning("%s %s failed: %s", request.method, request.path[:200], exc)
    except Exception:
        log.exception("%s %s failed", request.method, request.path[:200])
        problem = problem_for(AgentError())
    if problem.status < 500:
        log_problem(request.method, request.path, problem)
    response = problem.response()
    if request.content.exception() is not None:
        response.force_close()  # the body broke off: nothing more can be read on this connection
    return response


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    match = request.match_info
    if match.http_exception is None and match.route.name not in PUBLIC_ROUTES:
        TOKEN_NAME.set(_authenticate(request))
    return await handler(request)


def _authenticate(request: web.Request) -> str:
    """The name of the request's token; MissingToken or BadToken if it has none or a wrong one."""
    token = bearer_token(request.headers.get("Authorization"))
    if token is None:
        raise MissingToken(
            "this endpoint needs a token: send Authorization: Bearer <token>"
            " (make one with `certagent token add NAME --file <api_tokens_file>`)"
        )
    name = request.app[CONTEXT].tokens.match(token)
    if name is None:
        raise BadToken("the bearer token is not accepted: it is unknown or was revoked")
    return name


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: refuse a bad token or too large a body before it is sent.

    Runs before the middlewares.  Any other expectation (or one sent over HTTP/1.0)
    is ignored and the request handled as if it had none, as RFC 9110 section 10.1.1
    allows, instead of aiohttp's text/plain 417.
    """
    if request.version != HttpVersion11 or request.headers.get("Expect", "").lower() != (
        "100-continue"
    ):
        return None
    if request.method in ("POST", "PUT"):
        size = request.content_length
        limit = request.app[CONTEXT].body_limit
        try:
            _authenticate(request)
            if size is not None and size > limit:
                raise BundleTooLarge(f"the request body is {size} bytes; the limit is {limit}")
        except AgentError as exc:
            problem = problem_for(exc)
            log_problem(request.method, request.path, problem)
            return problem.response()
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    return None
