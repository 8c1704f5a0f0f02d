"""``/v1/domains``: names a platform registers for on-demand issuance (docs/acme.md).

A platform calls ``POST /v1/domains`` when a customer adds a domain and
``DELETE /v1/domains/{name}`` when it goes; with ``acme_registered = true`` the
agents then issue a certificate for a registered name on its first connection
(or at once, with ``"issue": true``), whatever the ask endpoint says.  The
registry lives in the store (:class:`~certagent.store.issuance.DomainRegistry`),
so every agent of the fleet sees a registration at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC

from aiohttp import web

from certagent.certs import hostname
from certagent.errors import ConfigError, InvalidHostname, NotFound
from certagent.store.issuance import DomainRegistry, Registration

from .audit import note
from .grants import Scope
from .guard import check_names, visible
from .problems import BadRequest, UnsupportedMediaType
from .query import MAX_LIMIT
from .views import CONTEXT, token_name

__all__ = ["domain_routes", "registered_name", "registration_json"]

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 100


def registered_name(raw: object) -> str:
    """A name as it may be registered: a valid hostname, not a wildcard (no DNS-01 here)."""
    if not isinstance(raw, str):
        raise BadRequest("name must be a string, e.g. \"shop.example.com\"")
    if raw.startswith("*."):
        raise InvalidHostname(
            f"{raw[:80]!r}: wildcard names need a DNS-01 challenge, which certagent does"
            " not answer; register each name"
        )
    return hostname.normalise(raw)


def registration_json(registration: Registration) -> dict[str, object]:
    added = registration.added_at.astimezone(UTC).isoformat(timespec="seconds")
    return {
        "name": registration.name,
        "added_at": added.replace("+00:00", "Z"),
        "issue": registration.issue,
    }


def _registry(request: web.Request) -> DomainRegistry:
    issuance = request.app[CONTEXT].store.issuance()
    if issuance is None:
        raise ConfigError("this store cannot keep domain registrations")
    return issuance.domains


async def list_domains(request: web.Request) -> web.Response:
    query = request.query
    unknown = set(query) - {"after", "limit"}
    if unknown:
        raise BadRequest(f"unknown query parameter {sorted(unknown)[0][:40]!r}; use after, limit")
    after = hostname.normalise(query["after"]) if query.get("after") else None
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    limit = int(raw_limit)
    items = await _registry(request).registrations(after=after, limit=limit)
    next_after = items[-1].name if len(items) == limit else None
    shown = [r for r in items if visible((r.name,))]  # a token's own names only
    return web.json_response(
        {"items": [registration_json(r) for r in shown], "next": next_after}
    )


async def add_domain(request: web.Request) -> web.Response:
    if request.content_type != "application/json":
        raise UnsupportedMediaType(
            'send the registration as application/json: {"name": "shop.example.com"}'
        )
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {str(exc)[:80]}") from exc
    if not isinstance(body, dict) or set(body) - {"name", "issue"} or "name" not in body:
        raise BadRequest('the body must be {"name": "<hostname>", "issue": false}')
    issue = body.get("issue", False)
    if not isinstance(issue, bool):
        raise BadRequest("issue must be true or false")
    name = registered_name(body["name"])
    note(target=name)
    check_names((name,))
    registry = _registry(request)
    existed = await registry.registration(name) is not None
    registration = await registry.register(name, issue=issue)
    log.info(
        "domain %s %s%s (token %s)",
        name,
        "registered again" if existed else "registered",
        ", to be issued at once" if issue else "",
        token_name(),
    )
    return web.json_response(
        registration_json(registration),
        status=200 if existed else 201,
        headers={"Location": f"/v1/domains/{name}"},
    )


async def get_domain(request: web.Request) -> web.Response:
    note(target=request.match_info["name"])
    name = hostname.normalise(request.match_info["name"])
    note(names=(name,))
    # a name outside the token's patterns is as unknown as one never registered
    registration = await _registry(request).registration(name) if visible((name,)) else None
    if registration is None:
        raise NotFound(f"{name} is not registered")
    return web.json_response(registration_json(registration))


async def delete_domain(request: web.Request) -> web.Response:
    note(target=request.match_info["name"])
    name = hostname.normalise(request.match_info["name"])
    check_names((name,))
    if not await _registry(request).unregister(name):
        raise NotFound(f"{name} is not registered")
    log.info("domain %s unregistered (token %s)", name, token_name())
    return web.Response(status=204)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: (method, path, handler, route name, scope), as :data:`certagent.api.views.routes`
domain_routes: tuple[tuple[str, str, Handler, str, Scope | None], ...] = (
    ("GET", "/v1/domains", list_domains, "domains", Scope.READ),
    ("POST", "/v1/domains", add_domain, "domains", Scope.DOMAINS),
    ("GET", "/v1/domains/{name}", get_domain, "domain", Scope.READ),
    ("DELETE", "/v1/domains/{name}", delete_domain, "domain", Scope.DOMAINS),
)
