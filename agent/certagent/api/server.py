"""The HTTP server under the app: requests aiohttp cannot parse get problems too.

aiohttp reads the request line and the headers in its protocol object
(:class:`aiohttp.web.RequestHandler`) before routing and before any middleware.
A request it cannot parse -- a request line or a header over the limits, a
malformed header, TLS sent to this plain-HTTP port -- never reaches the app:
``RequestHandler.handle_error`` answers it with a text/plain 400 and logs a
traceback at ERROR, one per request, so any client can fill the log.  aiohttp has
no public hook for that answer (aio-libs/aiohttp#3287), so :class:`ProblemRunner`
serves the app through a ``RequestHandler`` subclass that overrides the two
methods involved:

* ``handle_error`` answers with the problem :func:`problem_for_parse_error`
  maps (414, 431, 415 or 400) and logs one DEBUG line; a 5xx keeps its ERROR
  line with the traceback;
* ``log_exception`` logs a body the client broke off or garbled (seen while
  aiohttp drains the rest of a refused body) as one DEBUG line.

The runner also wraps the app's request handler: an ``HTTPException`` that
escapes it (aiohttp's own ``Expect`` handler of an unknown route answers an
unknown expectation with a 417 before the middlewares run) becomes a problem.
Cost: a few attribute lookups per connection and per request, nothing per byte.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from .problems import Problem, problem_for_http, problem_for_parse_error

__all__ = ["MAX_HEADER_FIELD", "MAX_REQUEST_LINE", "ProblemRunner", "log_problem"]

log = logging.getLogger(__name__)

_Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

#: aiohttp's ``max_line_size``: the longest request target (path and query) taken,
#: 8 KiB.  Over it: 414.
MAX_REQUEST_LINE = 8192
#: aiohttp's ``max_field_size``: the longest header name or value taken (its default).
#: Over it: 431.  The two limits differ on purpose: aiohttp reports either overflow
#: as one exception class that carries the limit it hit, which tells them apart.
MAX_HEADER_FIELD = 8190
_PATH_SHOWN = 200  # characters of a path written to the log


def log_problem(method: str, path: str, problem: Problem) -> None:
    """The one log line of a client error: method, path, status and problem type.

    A refused token is INFO (someone may be probing); every other 4xx is DEBUG.
    Never the body, the detail or a header: they may hold what the client sent.
    """
    level = logging.INFO if problem.code == "bad-token" else logging.DEBUG
    log.log(level, "%s %s: %d %s", method, path[:_PATH_SHOWN], problem.status, problem.type)


class ProblemRunner(web.AppRunner):
    """An :class:`~aiohttp.web.AppRunner` whose connections answer every error with a problem."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(
            app, max_line_size=MAX_REQUEST_LINE, max_field_size=MAX_HEADER_FIELD, **kwargs
        )

    async def _make_server(self) -> web.Server:
        # AppRunner's server runs the startup signals and freezes the app; keep its
        # request handler and factory, and make the connections with ours.
        made = await super()._make_server()
        return _ProblemServer(
            _problem_guard(made.request_handler),
            request_factory=made.request_factory,
            **self._kwargs,
        )


class _ProblemServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _ProblemProtocol(self, loop=self._loop, **self._kwargs)


class _ProblemProtocol(web.RequestHandler):
    """aiohttp's HTTP/1.1 connection, answering unparseable requests with problems."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: too late for another response
            raise ConnectionError("the response is sent already; closing the connection")
        problem = problem_for_parse_error(exc, status, max_request_line=MAX_REQUEST_LINE)
        if problem.status >= 500:
            log.error("%s %s failed", request.method, request.path[:_PATH_SHOWN], exc_info=exc)
        else:
            # The request line was not read (or not believed): there is no method or path.
            log.debug(
                "unparseable request from %s: %d %s", request.remote, problem.status, problem.type
            )
        response = problem.response()
        response.force_close()  # the parser's state is lost: this connection is done
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, RequestPayloadError | HttpProcessingError | ConnectionError):
            # The rest of a refused body, drained after the answer, was cut off or garbled.
            log.debug("request body from a client dropped: %s", type(exc).__name__)
            return
        super().log_exception(*args, **kwargs)


def _problem_guard(handler: _Handler) -> _Handler:
    async def guarded(request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            problem = problem_for_http(exc)
            log_problem(request.method, request.path, problem)
            return problem.response()

    return guarded
