"""``/v1/renewals/{name}``: opt an imported certificate into the agents' ACME renewal.

``PUT /v1/renewals/{name}`` does what ``certagent cert manage NAME`` does, on a
running agent (:func:`certagent.service.manage.manage_name`, injected by the
daemon as :attr:`~certagent.api.views.ApiContext.manage`): the certificate the
store serves for the name becomes ACME-managed and the name is scheduled for
renewal at that certificate's default time.  Idempotent: a second PUT schedules
the name again at the same time.  An agent without ``acme_directory`` renews
nothing and answers 409 ``renewal-off``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from aiohttp import web

from certagent.certs import hostname
from certagent.store.renewals import Managed

from .audit import note
from .grants import Scope
from .guard import check_names
from .problems import RenewalOff
from .views import CONTEXT, iso_utc, token_name

__all__ = ["managed_json", "renewal_routes"]

log = logging.getLogger(__name__)


def managed_json(managed: Managed) -> dict[str, object]:
    return {
        "name": managed.name,
        "renew_at": iso_utc(datetime.fromtimestamp(managed.renew_at, UTC)),
        "certificate": managed.certificate,
        "expires": iso_utc(managed.expires),
    }


async def manage(request: web.Request) -> web.Response:
    note(target=request.match_info["name"])
    name = hostname.normalise(request.match_info["name"])
    check_names((name,))  # a renewal orders this name alone (service/manage.py)
    opt_in = request.app[CONTEXT].manage
    if opt_in is None:
        raise RenewalOff(
            "this agent renews nothing: it has no acme_directory (see docs/acme.md, renewal)"
        )
    managed = await opt_in(name)
    log.info(
        "%s opted into renewal: certificate %s, renewal at %s (token %s)",
        name,
        managed.certificate,
        iso_utc(datetime.fromtimestamp(managed.renew_at, UTC)),
        token_name(),
    )
    return web.json_response(managed_json(managed))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: (method, path, handler, route name, scope), as :data:`certagent.api.views.routes`
renewal_routes: tuple[tuple[str, str, Handler, str, Scope | None], ...] = (
    ("PUT", "/v1/renewals/{name}", manage, "renewal", Scope.RENEWALS),
)
