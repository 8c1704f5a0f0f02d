"""The REST API's handlers: JSON in, JSON out; errors are raised and become problems."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web

from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.errors import AgentError, DuplicateCertificate, NotFound
from certagent.store.base import CertRecord, Store
from certagent.store.renewals import Managed

from .audit import Auditor, note
from .auth import TokenFile
from .body import read_ocsp, read_upload
from .grants import Scope
from .guard import PRINCIPAL, RateLimiter, check_names, current, visible
from .loaded import LoadedSlot
from .problems import AlreadyStored, NotReady, Problem
from .query import MAX_LIMIT, parse_list_query

__all__ = [
    "MAX_LIMIT",
    "ApiContext",
    "iso_utc",
    "ocsp_json",
    "record_json",
    "routes",
    "token_name",
]

log = logging.getLogger(__name__)

READY_TIMEOUT = 2.0
#: Prometheus' text exposition format, version 0.0.4
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class ApiContext:
    """Everything the handlers use, injected by :func:`certagent.api.app.make_app`."""

    store: Store
    tokens: TokenFile
    policy: UploadPolicy
    body_limit: int
    loaded: Callable[[], Awaitable[Sequence[LoadedSlot]]]
    ready: Callable[[], bool]
    now: Callable[[], datetime]
    openapi: bytes
    #: the Prometheus exposition text (service/metrics.py), rendered per scrape
    metrics: Callable[[], Awaitable[bytes]]
    #: opts a name into ACME renewal (service/manage.py); None without an ACME CA
    manage: Callable[[str], Awaitable[Managed]] | None = None
    #: the audit trail and the per-token counters (api/audit.py)
    audit: Auditor = field(default_factory=lambda: Auditor(lambda: datetime.now(UTC)))
    #: the per-token request rates (api/guard.py)
    limiter: RateLimiter = field(default_factory=RateLimiter)


CONTEXT = web.AppKey("certagent_api", ApiContext)


def token_name() -> str:
    """The name of the token the request being handled was admitted as (for log lines)."""
    principal = PRINCIPAL.get()
    return "?" if principal is None else principal.name


def iso_utc(moment: datetime) -> str:
    """``moment`` as the API writes times: ISO 8601 in UTC, whole seconds, ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def record_json(record: CertRecord) -> dict[str, object]:
    """A record's metadata as the API returns it (``CertificateMetadata``): never key material."""
    return {
        "id": record.id,
        "names": list(record.names),
        "not_before": iso_utc(record.not_before),
        "not_after": iso_utc(record.not_after),
        "fingerprint_sha256": record.fingerprint_sha256,
        "serial": record.serial,
        "key_type": record.key_type,
        "version": record.version,
        "updated_at": iso_utc(record.updated_at),
        "managed": record.managed,
    }


def _loaded_json(slot: LoadedSlot) -> dict[str, object]:
    return {
        "slot": slot.slot,
        "certificate_id": slot.certificate_id,
        "hosts": list(slot.hosts),
        "loaded_since": None if slot.loaded_since is None else iso_utc(slot.loaded_since),
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


async def metrics(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    body = await ctx.metrics() + ctx.audit.render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = METRICS_TYPE
    return response


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=_ctx(request).openapi, content_type="application/json")


async def list_certificates(request: web.Request) -> web.Response:
    """A page of the store's list; a token held to some names sees only certificates whose
    every name is inside (the page may then hold fewer items: only a null cursor ends it)."""
    query = parse_list_query(request.query)
    page = await _ctx(request).store.list(
        name=query.name,
        expiring_before=query.expiring_before,
        cursor=query.cursor,
        limit=query.limit,
    )
    shown = [r for r in page.records if visible(r.names)]
    return web.json_response(
        {"items": [record_json(r) for r in shown], "next_cursor": page.cursor}
    )


async def create_certificate(request: web.Request) -> web.Response:
    bundle = await _validated(request)
    check_names(bundle.names)
    try:
        record = await _ctx(request).store.add(bundle)
    except DuplicateCertificate as exc:
        raise AlreadyStored(str(exc)) from exc
    note(target=record.id)
    log.info(
        "certificate %s added for %s (token %s)",
        record.id,
        " ".join(record.names),
        token_name(),
    )
    return web.json_response(
        record_json(record), status=201, headers={"Location": _location(request, record.id)}
    )


async def _stored(request: web.Request, *, write: bool, hint: str = "") -> CertRecord:
    """The record the path names, if the token may see it (a read) or act on it (a write).

    A read of a record outside the token's names gets the same 404 as a missing one;
    a write gets 403 forbidden-name.
    """
    cert_id = request.match_info["id"]
    note(target=cert_id)
    record = await _ctx(request).store.get(cert_id)
    if record is not None:
        if write:
            check_names(record.names)
        elif visible(record.names):
            note(names=record.names)
        else:
            record = None
    if record is None:
        raise NotFound(f"no certificate with id {cert_id[:100]!r}{hint}")
    return record


async def get_certificate(request: web.Request) -> web.Response:
    return web.json_response(record_json(await _stored(request, write=False)))


async def replace_certificate(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    # 404 (or 403) before reading and validating the body
    old = await _stored(request, write=True, hint="; create it with POST")
    bundle = await _validated(request)
    check_names((*old.names, *(n for n in bundle.names if n not in old.names)))
    try:
        record = await ctx.store.replace(request.match_info["id"], bundle)
    except DuplicateCertificate as exc:
        raise AlreadyStored(str(exc)) from exc
    log.info(
        "certificate %s rotated to version %d for %s (token %s)",
        record.id,
        record.version,
        " ".join(record.names),
        token_name(),
    )
    return web.json_response(
        record_json(record), headers={"Location": _location(request, record.id)}
    )


async def put_ocsp(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    cert_id = request.match_info["id"]
    await _stored(request, write=True)  # 404 (or 403) before reading the body
    facts = await ctx.store.put_ocsp(cert_id, await read_ocsp(request), ctx.now())
    log.info(
        "OCSP response (%s, next update %s) stored for %s (token %s)",
        facts.status,
        facts.next_update.isoformat() if facts.next_update else "none",
        cert_id,
        token_name(),
    )
    return web.json_response(ocsp_json(cert_id, facts))


def ocsp_json(cert_id: str, facts: OcspFacts) -> dict[str, object]:
    return {
        "id": cert_id,
        "status": facts.status,
        "this_update": iso_utc(facts.this_update),
        "next_update": iso_utc(facts.next_update) if facts.next_update else None,
        "sha256": facts.sha256,
    }


async def delete_certificate(request: web.Request) -> web.Response:
    cert_id = request.match_info["id"]
    if current().grant.limited:  # its names first: 403 for a record outside them
        await _stored(request, write=True)
    note(target=cert_id)
    record = await _ctx(request).store.delete(cert_id)
    note(names=record.names)
    log.info(
        "certificate %s for %s deleted (token %s)",
        record.id,
        " ".join(record.names),
        token_name(),
    )
    return web.Response(status=204)


async def loaded(request: web.Request) -> web.Response:
    """What HAProxy holds; a token held to some names sees the slots whose hosts are inside."""
    slots = await _ctx(request).loaded()
    if current().grant.limited:
        slots = [s for s in slots if s.hosts and visible(s.hosts)]
    return web.json_response({"items": [_loaded_json(s) for s in slots]})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: A certificate's URL: ids may hold slashes (directory store), but not end in /ocsp
CERTIFICATE = r"/v1/certificates/{id:.+(?<!/ocsp)}"
Route = tuple[str, str, Handler, str, Scope | None]
#: (method, path, handler, route name, the scope it needs; None: no token needed)
routes: tuple[Route, ...] = (
    ("GET", "/healthz", healthz, "healthz", None),
    ("GET", "/readyz", readyz, "readyz", None),
    ("GET", "/v1/openapi.json", openapi, "openapi", None),
    ("GET", "/metrics", metrics, "metrics", None),
    ("GET", "/v1/certificates", list_certificates, "certificates", Scope.READ),
    ("POST", "/v1/certificates", create_certificate, "certificates", Scope.CERTIFICATES),
    ("PUT", "/v1/certificates/{id:.+}/ocsp", put_ocsp, "ocsp", Scope.CERTIFICATES),
    ("GET", CERTIFICATE, get_certificate, "certificate", Scope.READ),
    ("PUT", CERTIFICATE, replace_certificate, "certificate", Scope.CERTIFICATES),
    ("DELETE", CERTIFICATE, delete_certificate, "certificate", Scope.CERTIFICATES),
    ("GET", "/v1/loaded", loaded, "loaded", Scope.READ),
)
