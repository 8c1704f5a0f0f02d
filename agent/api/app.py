"""The REST API application and its server: :func:`make_app`, :func:`start_api`.

Middlewares, outermost first: ``_problems`` turns every error into one RFC 9457
response (via :mod:`agent.api.problems`), ``_auth`` checks the bearer token of
every route except ``/healthz``, ``/readyz`` and ``/v1/openapi.json``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib import resources

from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.typedefs import Handler

from agent.config import Settings, parse_bind
from agent.errors import AgentError, BundleTooLarge, ConfigError
from agent.store.base import Store
from agent.validate import UploadPolicy

from .auth import TokenFile, bearer_token
from .body import http_body_limit, upload_policy
from .loaded import LoadedSlot
from .problems import BadToken, MissingToken, problem_for, problem_for_http
from .views import CONTEXT, TOKEN_NAME, ApiContext, routes

__all__ = ["ApiServer", "make_app", "openapi_document", "start_api"]

log = logging.getLogger(__name__)

PUBLIC_ROUTES = frozenset(name for _, _, _, name, auth in routes if not auth)
#: How long aiohttp keeps reading (and discarding) the rest of a refused body, so the
#: client sees the error instead of a reset connection.
LINGER_SECONDS = 2.0
#: How long :meth:`ApiServer.close` lets open requests finish.
SHUTDOWN_SECONDS = 2.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


def openapi_document() -> bytes:
    """The OpenAPI 3.1 document packaged beside this module."""
    return resources.files("agent.api").joinpath("openapi.json").read_bytes()


def make_app(
    store: Store,
    *,
    tokens: TokenFile,
    policy: UploadPolicy,
    loaded: Callable[[], Awaitable[Sequence[LoadedSlot]]],
    ready: Callable[[], bool],
    now: Callable[[], datetime] = _utcnow,
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
    )
    for method, path, handler, name, _ in routes:
        if method in ("POST", "PUT"):
            app.router.add_route(method, path, handler, name=name, expect_handler=_expect)
        else:
            app.router.add_route(method, path, handler, name=name)
    return app


class ApiServer:
    """The running REST API; :meth:`close` stops it (open requests get a short drain)."""

    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self._runner = runner
        self.url = url

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
) -> ApiServer | None:
    """Serve the REST API on ``settings.api_bind``; None if ``api_tokens_file`` is not set.

    Raises :class:`~agent.errors.ConfigError` if the tokens file is missing or
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
    )
    host, port = parse_bind(settings.api_bind)
    runner = web.AppRunner(
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
    return ApiServer(runner, url)


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
            log.warning("%s %s failed: %s", request.method, request.path, exc)
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        problem = problem_for(AgentError())
    if problem.status < 500:
        level = logging.INFO if problem.code == BadToken.code else logging.DEBUG
        log.log(level, "%s %s: %d %s", request.method, request.path, problem.status, problem.code)
    return problem.response()


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
    """``Expect: 100-continue``: refuse a bad token or too large a body before it is sent."""
    size = request.content_length
    limit = request.app[CONTEXT].body_limit
    try:
        _authenticate(request)
        if size is not None and size > limit:
            raise BundleTooLarge(f"the request body is {size} bytes; the limit is {limit}")
    except AgentError as exc:
        return problem_for(exc).response()
    if request.version != HttpVersion11 or request.headers.get("Expect", "").lower() != (
        "100-continue"
    ):
        raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect'][:40]}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    return None
