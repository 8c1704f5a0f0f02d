"""The REST API application and its server: :func:`make_app`, :func:`start_api`.

Middlewares, outermost first: ``_audit`` writes the audit line of every request
to a route that needs a token (:mod:`certagent.api.audit`), ``_problems`` turns
every error into one RFC 9457 response (via :mod:`certagent.api.problems`),
``_guard`` admits the request's token for the route's scope
(:mod:`certagent.api.guard`) on every route except ``/healthz``, ``/readyz``,
``/metrics`` and ``/v1/openapi.json``.  Requests that never reach them
(unparseable HTTP) get their problem from
:class:`~certagent.api.server.ProblemRunner`, which serves the app; with
``api_tls_cert`` it is served over TLS by :class:`~certagent.api.tls.TlsListener`.
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

from .audit import ENTRY, AuditEntry, Auditor, note
from .auth import TokenFile
from .body import http_body_limit, upload_policy
from .domains import domain_routes
from .grants import Scope
from .guard import PRINCIPAL, Principal, RateLimiter, admit
from .loaded import LoadedSlot
from .problems import problem_for, problem_for_http
from .renewals import renewal_routes
from .server import ProblemRunner, log_problem
from .tls import ServerTls, TlsListener, peer_subject
from .views import CONTEXT, ApiContext, routes

__all__ = ["ApiServer", "make_app", "openapi_document", "start_api"]

log = logging.getLogger(__name__)

ROUTES = (*routes, *domain_routes, *renewal_routes)
#: (method, route name) -> the scope it needs; routes absent here need no token
SCOPES: dict[tuple[str, str], Scope] = {
    (method, name): scope for method, _, _, name, scope in ROUTES if scope is not None
}
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
    auditor: Auditor | None = None,
    limiter: RateLimiter | None = None,
) -> web.Application:
    """The aiohttp application (tests run it in a TestServer; :func:`start_api` serves it)."""
    body_limit = http_body_limit(policy.max_bytes)
    app = web.Application(client_max_size=body_limit, middlewares=[_audit, _problems, _guard])
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
        audit=auditor or Auditor(now),
        limiter=limiter or RateLimiter(),
    )
    for method, path, handler, name, _ in ROUTES:
        app.router.add_route(method, path, handler, name=name, expect_handler=_expect)
    return app


async def _no_metrics() -> bytes:
    return b""


class ApiServer:
    """The running REST API; :meth:`close` stops it (open requests get a short drain)."""

    def __init__(
        self,
        runner: web.AppRunner,
        url: str,
        tokens: TokenFile,
        auditor: Auditor,
        listener: TlsListener | None = None,
    ) -> None:
        self._runner = runner
        self.url = url
        self.tokens = tokens
        self.auditor = auditor
        self._listener = listener

    def reload_tokens(self) -> int:
        """Re-read the tokens file now (SIGHUP); how many tokens it holds."""
        self.tokens.refresh()
        return len(self.tokens.names)

    def metrics(self) -> bytes:
        """The API's own counters, for a ``/metrics`` served elsewhere (``metrics_bind``)."""
        return self.auditor.render()

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
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

    Over TLS with ``api_tls_cert`` and ``api_tls_key`` (mutual TLS with
    ``api_client_ca``).  Raises :class:`~certagent.errors.ConfigError` if the tokens
    file is missing or malformed, the certificate or key does not load, or the
    address cannot be bound.
    """
    if not settings.api_tokens_file:
        log.info("REST API off (api_tokens_file is not set)")
        return None
    tokens = TokenFile.load(settings.api_tokens_file)
    tls = (
        ServerTls(settings.api_tls_cert, settings.api_tls_key, settings.api_client_ca)
        if settings.api_tls_cert
        else None
    )
    auditor = Auditor(now, reads=settings.api_audit_reads)
    app = make_app(
        store,
        tokens=tokens,
        policy=upload_policy(settings),
        loaded=loaded,
        ready=ready,
        now=now,
        metrics=metrics,
        manage=manage,
        auditor=auditor,
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
    listener: TlsListener | None = None
    try:
        if tls is None:
            await web.TCPSite(runner, host, port).start()
            bound = runner.addresses[0]
        else:
            assert runner.server is not None  # set up above
            listener = TlsListener.bind(host, port, runner.server, tls, auditor)
            bound = listener.address
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(
            f"cannot serve the REST API on {settings.api_bind}: {exc.strerror}"
        ) from exc
    shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
    scheme = "http" if tls is None else "https"
    url = f"{scheme}://{shown}:{bound[1]}"
    log.info(
        "REST API listening on %s (%d tokens%s)",
        url,
        len(tokens.names),
        ""
        if tls is None
        else f", TLS, groups {tls.groups}"
        + (", client certificates required" if tls.mutual else ""),
    )
    return ApiServer(runner, url, tokens, auditor, listener)


# --- middlewares ------------------------------------------------------------------------


def _scope_of(request: web.Request) -> Scope | None:
    """The scope the request's route needs; None for a public route or no route at all."""
    match = request.match_info
    if match.http_exception is not None:
        return None
    return SCOPES.get((request.method, match.route.name or ""))


def _entry(request: web.Request) -> AuditEntry:
    """The request's audit entry: made once (by ``_expect`` or ``_audit``), then shared.

    Making it also forgets any principal the context holds: aiohttp runs each request
    in a task of its own (a fresh context), but whatever it does, a principal is only
    ever used for the request it was admitted for.
    """
    entry = ENTRY.get()
    if entry is None or entry.owner is not request:
        resource = request.match_info.route.resource
        entry = AuditEntry(
            method=request.method,
            route=resource.canonical if resource is not None else request.path[:200],
            remote=request.remote,
            client=peer_subject(request.transport),
            owner=request,
        )
        ENTRY.set(entry)
        PRINCIPAL.set(None)
    return entry


@web.middleware
async def _audit(request: web.Request, handler: Handler) -> web.StreamResponse:
    if _scope_of(request) is None:
        return await handler(request)
    entry = _entry(request)
    response = await handler(request)  # errors are answers by now (_problems)
    request.app[CONTEXT].audit.request(entry, response.status)
    return response


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
    note(code=problem.code)
    response = problem.response()
    if request.content.exception() is not None:
        response.force_close()  # the body broke off: nothing more can be read on this connection
    return response


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    scope = _scope_of(request)
    if scope is not None:
        _entry(request)  # this request's (``_audit`` made it; ``_expect`` may have admitted it)
        if PRINCIPAL.get() is None:
            PRINCIPAL.set(_admit(request, scope))
    return await handler(request)


def _admit(request: web.Request, scope: Scope) -> Principal:
    """The request's principal (:func:`certagent.api.guard.admit`); an ApiError otherwise."""
    ctx = request.app[CONTEXT]
    return admit(
        ctx.tokens,
        ctx.limiter,
        authorization=request.headers.get("Authorization"),
        client=_entry(request).client,
        scope=scope,
        now=ctx.now(),
    )


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: refuse a bad token or too large a body before it is sent.

    Runs before the middlewares (a refusal is audited here).  Any other expectation
    (or one sent over HTTP/1.0) is ignored and the request handled as if it had
    none, as RFC 9110 section 10.1.1 allows, instead of aiohttp's text/plain 417.
    """
    if request.version != HttpVersion11 or request.headers.get("Expect", "").lower() != (
        "100-continue"
    ):
        return None
    scope = _scope_of(request)
    if request.method in ("POST", "PUT") and scope is not None:
        size = request.content_length
        ctx = request.app[CONTEXT]
        limit = ctx.body_limit
        try:
            PRINCIPAL.set(_admit(request, scope))
            if size is not None and size > limit:
                raise BundleTooLarge(f"the request body is {size} bytes; the limit is {limit}")
        except AgentError as exc:
            problem = problem_for(exc)
            log_problem(request.method, request.path, problem)
            entry = _entry(request)
            entry.code = problem.code
            ctx.audit.request(entry, problem.status)
            return problem.response()
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0
    return None
