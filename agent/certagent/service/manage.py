"""Opting an imported certificate into the agents' ACME renewal.

What ``certagent cert manage`` and the REST API's ``PUT /v1/renewals/{name}`` do.

:func:`manage_name` marks the certificate the store serves for a name as
ACME-managed and puts the name on the renewal schedule at that certificate's
default renewal time (two thirds of its lifetime, one half under 10 days, with
the configured jitter; at once if that has passed).  The agents then renew it
like a certificate they issued: each renewal orders the name alone, under the
permission policy, which is why a name no policy allows is refused here already.
"""

from __future__ import annotations

import time

from certagent.certs import hostname
from certagent.errors import ConfigError, NotFound, NotPermitted
from certagent.service.permission import Permission
from certagent.service.renewtime import RenewPolicy, cert_rng
from certagent.store.base import Store
from certagent.store.renewals import Managed

__all__ = ["manage_name"]


async def manage_name(
    store: Store, permission: Permission | None, policy: RenewPolicy, raw: str
) -> Managed:
    """Schedule ``raw``'s renewal (``permission`` None: not checked here, the agents ask
    at renewal).  InvalidHostname, NotPermitted, NotFound (no certificate for this exact
    name) or ConfigError (a store without a renewal schedule); the messages do not repeat
    the name."""
    name = hostname.normalise(raw)
    issuance = store.issuance()
    if issuance is None:
        raise ConfigError(f"the store {store.describe()} cannot keep a renewal schedule")
    if permission is not None and not (await permission.decide(name)).allowed:
        raise NotPermitted(
            "no permission policy allows it, so the agents would not renew it:"
            f" register it ('certagent domain add {name}' or POST /v1/domains) or add its"
            " domain to acme_allow_suffixes"
        )
    found = [s for s in await store.lookup_all(name) if name in s.bundle.names]
    if not found:
        raise NotFound(
            "the store has no certificate for this exact name (import it first with"
            " 'certagent cert add' or 'cert import')"
        )
    best = found[0].bundle
    renew_at = policy.default_at(
        best.not_before.timestamp(), best.not_after.timestamp(), cert_rng(f"{best.serial:X}")
    )
    renew_at = max(renew_at, time.time())
    await issuance.renewals.manage(name, renew_at)
    return Managed(name, renew_at, found[0].id, best.not_after)
