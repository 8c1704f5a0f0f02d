"""RFC 9457 problem details: the one place that maps errors to HTTP statuses.

Every error response of the REST API is ``application/problem+json``::

    {"type": "urn:certagent:problem:key-mismatch", "title": "Key does not match",
     "status": 422, "detail": "the private key does not belong to ...", "code": "key-mismatch"}

``code`` is stable and machine-readable; for certificate errors it is the
``code`` of the :class:`~certagent.errors.CertificateError` subclass raised by
:func:`certagent.certs.validate.validate_upload`.  :func:`problem_for` maps the
:class:`~certagent.errors.AgentError` tree, :func:`problem_for_http` aiohttp's own
HTTP errors (no such route, wrong method, body over ``client_max_size``) and
:func:`problem_for_parse_error` the requests aiohttp's HTTP parser refuses before
routing (a request line or header over the limits, malformed HTTP).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)

from certagent.errors import (
    AgentError,
    BundleTooLarge,
    CertificateError,
    ConfigError,
    DuplicateCertificate,
    EncryptedKey,
    ForeignDataKey,
    HAProxyError,
    InvalidCursor,
    InvalidHostname,
    MultipleKeys,
    NotFound,
    NotPermitted,
    PemError,
    ReadOnlyRecord,
    StoreError,
    StoreUnavailable,
)

__all__ = [
    "PROBLEM_JSON",
    "TYPE_PREFIX",
    "AlreadyStored",
    "ApiError",
    "BadRequest",
    "BadToken",
    "ExpiredToken",
    "Forbidden",
    "ForbiddenName",
    "HeaderTooLarge",
    "MissingToken",
    "NotReady",
    "Problem",
    "RateLimited",
    "RenewalOff",
    "UnsupportedMediaType",
    "UriTooLong",
    "problem_for",
    "problem_for_http",
    "problem_for_parse_error",
]

PROBLEM_JSON = "application/problem+json"
#: ``type`` is this prefix followed by ``code``: stable, and never dereferenced.
TYPE_PREFIX = "urn:certagent:problem:"


class ApiError(AgentError):
    """An error of the HTTP exchange itself (not of the certificate or the store).

    ``extra`` becomes members of the problem (RFC 9457 section 3.2), ``headers``
    headers of the answer.
    """

    status = 400
    code = "bad-request"

    def __init__(
        self,
        message: str = "",
        *,
        extra: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra: Mapping[str, object] = extra or {}
        self.headers: Mapping[str, str] = headers or {}


class BadRequest(ApiError):
    """Malformed JSON, a missing field, a bad query parameter."""


class MissingToken(ApiError):
    status = 401
    code = "missing-token"


class BadToken(ApiError):
    status = 403
    code = "bad-token"


class ExpiredToken(ApiError):
    """The token is known, and past its ``expires``."""

    status = 401
    code = "expired-token"


class Forbidden(ApiError):
    """The token lacks the scope the operation needs (named in the ``scope`` member)."""

    status = 403
    code = "forbidden"


class ForbiddenName(ApiError):
    """A write names a host outside the token's name patterns."""

    status = 403
    code = "forbidden-name"


class RateLimited(ApiError):
    """The token is over its request rate; ``Retry-After`` says when to come back."""

    status = 429
    code = "rate-limited"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported-media-type"


class UriTooLong(ApiError):
    """The request line is over the server's limit."""

    status = 414
    code = "uri-too-long"


class HeaderTooLarge(ApiError):
    """A header field is over the server's limit, or there are too many."""

    status = 431
    code = "header-too-large"


class NotReady(ApiError):
    status = 503
    code = "not-ready"


class RenewalOff(ApiError):
    """A renewal asked of an agent that has no ACME CA configured."""

    status = 409
    code = "renewal-off"


class AlreadyStored(DuplicateCertificate):
    """The store already holds this certificate (409).

    The store raises plain :class:`DuplicateCertificate`, as validation does for a
    certificate repeated inside one upload (422); the REST layer re-raises the
    store's as this class so the two get different statuses and the same code.
    """


# Looked up along the exception's MRO: the most specific class listed wins.
_STATUS: dict[type[AgentError], int] = {
    AlreadyStored: 409,
    BundleTooLarge: 413,
    EncryptedKey: 422,
    MultipleKeys: 422,
    PemError: 400,
    CertificateError: 422,
    InvalidHostname: 400,
    NotPermitted: 403,
    InvalidCursor: 400,
    NotFound: 404,
    ReadOnlyRecord: 409,
    ForeignDataKey: 409,
    StoreUnavailable: 503,
    StoreError: 500,
    HAProxyError: 503,
    ConfigError: 500,
    AgentError: 500,
}
_CODE: dict[type[AgentError], str] = {
    InvalidHostname: "invalid-hostname",
    NotPermitted: "not-permitted",
    InvalidCursor: "invalid-cursor",
    NotFound: "not-found",
    ReadOnlyRecord: "read-only-record",
    ForeignDataKey: "foreign-data-key",
    StoreUnavailable: "store-unavailable",
    StoreError: "store-error",
    HAProxyError: "haproxy-unavailable",
    ConfigError: "config-error",
    AgentError: "internal-error",
}
#: Titles by code (the same for every occurrence of a code, as RFC 9457 asks).
TITLES: Mapping[str, str] = {
    "bad-request": "Bad request",
    "missing-token": "Bearer token required",
    "bad-token": "Token not accepted",
    "expired-token": "Token expired",
    "forbidden": "Scope missing",
    "forbidden-name": "Name outside the token's patterns",
    "rate-limited": "Too many requests",
    "unsupported-media-type": "Unsupported media type",
    "expectation-failed": "Expectation not supported",
    "uri-too-long": "Request line too long",
    "header-too-large": "Request header too large",
    "not-ready": "Not ready",
    "renewal-off": "No ACME CA configured",
    "not-permitted": "Not allowed by the permission policy",
    "not-found": "Not found",
    "method-not-allowed": "Method not allowed",
    "too-large": "Upload too large",
    "bad-pem": "Not a PEM certificate chain and key",
    "chain-too-long": "Too many certificates",
    "multiple-keys": "More than one private key",
    "missing-key": "Private key missing",
    "encrypted-key": "Private key has a passphrase",
    "unsupported-key": "Key type not accepted",
    "key-mismatch": "Key does not match the certificate",
    "no-names": "Certificate names no host",
    "ca-certificate": "A CA certificate is not a server certificate",
    "bad-ocsp": "OCSP response not usable for this certificate",
    "weak-key": "Key too weak",
    "not-yet-valid": "Certificate not yet valid",
    "expired": "Certificate expired",
    "duplicate-certificate": "Duplicate certificate",
    "chain-order": "Chain out of order",
    "unrelated-chain": "Unrelated certificate in the chain",
    "invalid-certificate": "Invalid certificate",
    "invalid-hostname": "Invalid hostname",
    "invalid-cursor": "Invalid cursor",
    "read-only-record": "Record managed outside the agent",
    "foreign-data-key": "Data key not held by the fleet's agents",
    "config-error": "Agent misconfigured",
    "store-unavailable": "Certificate store unavailable",
    "store-error": "Certificate store error",
    "haproxy-unavailable": "HAProxy unavailable",
    "internal-error": "Internal error",
}
_CHALLENGE = 'Bearer realm="certagent"'
_EXPIRED = 'Bearer realm="certagent", error="invalid_token", error_description="token expired"'
_HIDDEN_DETAIL = "internal error; the agent's log has the details"


@dataclass(frozen=True)
class Problem:
    status: int
    code: str
    detail: str
    #: Extension members (RFC 9457 section 3.2), e.g. ``checks`` of /readyz.
    extra: Mapping[str, object] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return TYPE_PREFIX + self.code

    @property
    def title(self) -> str:
        return TITLES.get(self.code) or HTTPStatus(self.status).phrase

    def to_json(self) -> dict[str, object]:
        return {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            text=json.dumps(self.to_json()),
            content_type=PROBLEM_JSON,
            headers=self.headers,
        )


def problem_for(exc: AgentError) -> Problem:
    """The problem a certagent error becomes: status and code by class, ``str(exc)`` as detail.

    Messages of the tree never hold key material; a 500's message is replaced,
    since it may describe internals rather than the request.
    """
    if isinstance(exc, ApiError):
        headers = dict(exc.headers)
        if isinstance(exc, MissingToken):
            headers["WWW-Authenticate"] = _CHALLENGE
        elif isinstance(exc, ExpiredToken):
            headers["WWW-Authenticate"] = _EXPIRED
        return Problem(exc.status, exc.code, str(exc), extra=exc.extra, headers=headers)
    status = next(_STATUS[cls] for cls in type(exc).__mro__ if cls in _STATUS)
    if isinstance(exc, CertificateError):
        code = exc.code
    else:
        code = next(_CODE[cls] for cls in type(exc).__mro__ if cls in _CODE)
    detail = _HIDDEN_DETAIL if code == "internal-error" else str(exc)
    return Problem(status, code, detail or TITLES.get(code, code))


_HTTP_CODES = {
    400: "bad-request",
    404: "not-found",
    405: "method-not-allowed",
    413: "too-large",
    414: "uri-too-long",
    415: "unsupported-media-type",
    417: "expectation-failed",
    431: "header-too-large",
}


def problem_for_http(exc: web.HTTPException) -> Problem:
    """The problem for an error aiohttp raised itself (routing, body size, parsing)."""
    status = exc.status
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else {}
    code = _HTTP_CODES.get(status, "bad-request" if status < 500 else "internal-error")
    if status == 404:
        detail = "no such resource; the API's routes are listed at /v1/openapi.json"
    elif status == 405:
        allowed = exc.headers.get("Allow", "")
        detail = f"method not allowed here; allowed: {allowed}" if allowed else "method not allowed"
    elif status == 413:
        detail = "the request body is over the size limit (max_upload_bytes)"
    elif status == 417:
        detail = "the only expectation this API knows is Expect: 100-continue"
    else:
        detail = exc.text or HTTPStatus(status).phrase
        if detail.startswith(f"{status}: "):
            detail = detail[len(f"{status}: ") :]
    return Problem(status, code, detail, headers=headers)


# Fixed details by parser exception (most specific first): aiohttp's messages quote
# the request's bytes, which may hold a token, so they are never sent back as they are.
_PARSE_DETAILS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (
        BadHttpMethod,
        "the request does not start with an HTTP method: is this TLS, or another protocol,"
        " sent to the API's plain-HTTP port?",
    ),
    (BadStatusLine, "the request line is not METHOD TARGET HTTP/1.1"),
    (InvalidURLError, "the request target is not a valid path and query"),
    (InvalidHeader, "a header is malformed: every header must be Name: value"),
)


def problem_for_parse_error(
    exc: BaseException | None, status: int, *, max_request_line: int
) -> Problem:
    """The problem for a request aiohttp's HTTP parser refused (``status`` is aiohttp's).

    :class:`~aiohttp.http_exceptions.LineTooLong` carries the limit it hit:
    ``max_request_line`` means the request line (414), anything else a header
    field (431).  An unknown ``Content-Encoding`` is a 415.  A ``status`` of 500
    or more is aiohttp's own failure, not the request's.
    """
    if status >= 500 or not isinstance(exc, HttpProcessingError):
        if status < 500:
            return Problem(400, "bad-request", "the request is not valid HTTP/1.1")
        return Problem(500, "internal-error", _HIDDEN_DETAIL)
    if isinstance(exc, LineTooLong):
        limit = str(exc.args[1]) if len(exc.args) > 1 else ""
        if limit == str(max_request_line):
            return problem_for(
                UriTooLong(f"the request line is over {limit} bytes: use a shorter path and query")
            )
        return problem_for(HeaderTooLarge(f"a header is over {limit} bytes: send shorter headers"))
    if exc.message.startswith("Too many headers"):
        return problem_for(HeaderTooLarge("the request has too many headers"))
    if isinstance(exc, ContentEncodingError):
        return problem_for(
            UnsupportedMediaType(
                "the request's Content-Encoding is not supported: send the body as it is,"
                " or gzip or deflate it"
            )
        )
    for cls, detail in _PARSE_DETAILS:
        if isinstance(exc, cls):
            return problem_for(BadRequest(detail))
    return problem_for(BadRequest(f"the request is not valid HTTP/1.1: {_reason(exc.message)}"))


def _reason(message: str) -> str:
    """The first line of an aiohttp parser message, unless it quotes the request's bytes."""
    first = message.split("\n", 1)[0].strip().rstrip(":").strip()
    if not first or any(quote in first for quote in ("b'", 'b"', "bytearray(")):
        return "malformed request"
    return first[:120]
