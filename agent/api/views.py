"""The REST API's handlers: JSON in, JSON out; errors are raised and become problems."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web

from agent import hostname
from agent.errors import AgentError, DuplicateCertificate, InvalidHostname, NotFound
from agent.pem import CertBundle
from agent.store.base import CertRecord, Store
from agent.validate import UploadPolicy, validate_upload

from .auth import TokenFile
from .body import read_upload
from .loaded import LoadedSlot
from .problems import AlreadyStored, BadRequest, NotReady, Problem

__all__ = ["MAX_LIMIT", "ApiContext", "record_json", "routes"]

log = logging.getLogger(__name__)

MAX_LIMIT = 500
DEFAULT_LIMIT = 100
READY_TIMEOUT = 2.0
_LIST_PARAMS = ("name", "expiring_before", "cursor", "limit")


@dataclass(frozen=True)
class ApiContext:
    """Everything the handlers use, injected by :func:`agent.api.app.make_app`."""

    store: Store
    tokens: TokenFile
    policy: UploadPolicy
    body_limit: int
    loaded: Callable[[], Awaitable[Sequence[LoadedSlot]]]
    ready: Callable[[], bool]
    now: Callable[[], datetime]
    openapi: bytes


CONTEXT = web.AppKey("certagent_api", ApiContext)
#: The name of the token that authenticated the request being handled (set by the auth
#: middleware; each request runs in its own task, hence its own context).
TOKEN_NAME: contextvars.ContextVar[str] = contextvars.ContextVar("certagent_token", default="?")


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def record_json(record: CertRecord) -> dict[str, object]:
    """A record's metadata as the API returns it (``CertificateMetadata``): never key material."""
    return {
        "id": record.id,
        "names": list(record.names),
        "not_before": _iso(record.not_before),
        "not_after": _iso(record.not_after),
        "fingerprint_sha256": record.fingerprint_sha256,
        "serial": record.serial,
        "key_type": record.key_type,
        "version": record.version,
        "updated_at": _iso(record.updated_at),
    }


def _loaded_json(slot: LoadedSlot) -> dict[str, object]:
    return {
        "slot": slot.slot,
        "certificate_id": slot.certificate_id,
        "hosts": list(slot.hosts),
        "loaded_since": None if slot.loaded_since is None else _iso(slot.loaded_since),
        "hits": slot.hits,
    }


def _ctx(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]


def _location(request: web.Request, cert_id: str) -> str:
    return str(request.app.router["certificate"].url_for(id=cert_id))


async def _validated(request: web.Request) -> CertBundle:
    ctx = _ctx(request)
    upload = await read_upload(request, ctx.body_limit)
    # Signature checks take milliseconds: keep them off the loop the lazy path runs on.
    return await asyncio.to_thread(
        validate_upload, upload.chain, upload.key, now=ctx.now(), policy=ctx.policy
    )


# --- handlers -----------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    checks: dict[str, str] = {}
    try:
        await asyncio.wait_for(ctx.store.ping(), READY_TIMEOUT)
        checks["store"] = "ok"
    except TimeoutError:
        checks["store"] = f"{ctx.store.describe()}: no answer within {READY_TIMEOUT:g} s"
    except AgentError as exc:
        checks["store"] = str(exc)
    checks["haproxy"] = "ok" if ctx.ready() else "not connected to HAProxy's runtime API"
    if all(value == "ok" for value in checks.values()):
        return web.json_response({"status": "ready", "checks": checks})
    failing = ", ".join(name for name, value in checks.items() if value != "ok")
    return Problem(
        NotReady.status, NotReady.code, f"not ready: {failing}", extra={"checks": checks}
    ).response()


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=_ctx(request).openapi, content_type="application/json")


async def list_certificates(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    query = request.query
    unknown = sorted(set(query) - set(_LIST_PARAMS))
    if unknown:
        raise BadRequest(
            f"unknown query parameter {', '.join(repr(k[:40]) for k in unknown[:5])};"
            f" known: {', '.join(_LIST_PARAMS)}"
        )
    name = query.get("name")
    if name is not None:
        try:
            name = hostname.normalise_pattern(name.strip().lower())
        except InvalidHostname as exc:
            raise InvalidHostname(f"name: {exc}") from exc
    expiring_before = _parse_time(query["expiring_before"]) if "expiring_before" in query else None
    limit = _parse_limit(query.get("limit"))
    page = await ctx.store.list(
        name=name,
        expiring_before=expiring_before,
        cursor=query.get("cursor") or None,
        limit=limit,
    )
    return web.json_response(
        {"items": [record_json(r) for r in page.records], "next_cursor": page.cursor}
    )


def _parse_time(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise BadRequest(
            f"expiring_before {value[:40]!r} is not an ISO 8601 time,"
            " e.g. 2030-01-31T00:00:00Z or 2030-01-31"
        ) from exc
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _parse_limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {value[:20]!r}")
    return int(value)


async def create_certificate(request: web.Request) -> web.Response:
    bundle = await _validated(request)
    try:
        record = await _ctx(request).store.add(bundle)
    except DuplicateCertificate as exc:
        raise AlreadyStored(str(exc)) from exc
    log.info(
        "certificate %s added for %s (token %s)",
        record.id,
        " ".join(record.names),
        TOKEN_NAME.get(),
    )
    return web.json_response(
        record_json(record), status=201, headers={"Location": _location(request, record.id)}
    )


async def get_certificate(request: web.Request) -> web.Response:
    cert_id = request.match_info["id"]
    record = await _ctx(request).store.get(cert_id)
    if record is None:
        raise NotFound(f"no certificate with id {cert_id[:100]!r}")
    return web.json_response(record_json(record))


async def replace_certificate(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    cert_id = request.match_info["id"]
    if await ctx.store.get(cert_id) is None:  # 404 before reading and validating the body
        raise NotFound(f"no certificate with id {cert_id[:100]!r}; create it with POST")
    bundle = await _validated(request)
    try:
        record = await ctx.store.replace(cert_id, bundle)
    except DuplicateCertificate as exc:
        raise AlreadyStored(str(exc)) from exc
    log.info(
        "certificate %s rotated to version %d for %s (token %s)",
        record.id,
        record.version,
        " ".join(record.names),
        TOKEN_NAME.get(),
    )
    return web.json_response(
        record_json(record), headers={"Location": _location(request, record.id)}
    )


async def delete_certificate(request: web.Request) -> web.Response:
    cert_id = request.match_info["id"]
    record = await _ctx(request).store.delete(cert_id)
    log.info(
        "certificate %s for %s deleted (token %s)",
        record.id,
        " ".join(record.names),
        TOKEN_NAME.get(),
    )
    return web.Response(status=204)


async def loaded(request: web.Request) -> web.Response:
    slots = await _ctx(request).loaded()
    return web.json_response({"items": [_loaded_json(s) for s in slots]})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: (method, path, handler, route name, needs a token)
routes: tuple[tuple[str, str, Handler, str, bool], ...] = (
    ("GET", "/healthz", healthz, "healthz", False),
    ("GET", "/readyz", readyz, "readyz", False),
    ("GET", "/v1/openapi.json", openapi, "openapi", False),
    ("GET", "/v1/certificates", list_certificates, "certificates", True),
    ("POST", "/v1/certificates", create_certificate, "certificates", True),
    ("GET", "/v1/certificates/{id:.+}", get_certificate, "certificate", True),
    ("PUT", "/v1/certificates/{id:.+}", replace_certificate, "certificate", True),
    ("DELETE", "/v1/certificates/{id:.+}", delete_certificate, "certificate", True),
    ("GET", "/v1/loaded", loaded, "loaded", True),
)
