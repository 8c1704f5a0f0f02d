"""``certagent cert manage NAME...``: opt imported certificates into the agent's ACME renewal.

For each name, the certificate the store serves for it is marked ACME-managed and
the name is put on the renewal schedule at the certificate's default renewal time
(two thirds of its lifetime, one half under 10 days, with the configured jitter;
at once if that has passed).  From then on the agents renew it like a certificate
they issued: each renewal orders the name alone, under the permission policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from certagent import config
from certagent.certs import hostname
from certagent.errors import AgentError, ConfigError
from certagent.service.permission import Permission, parse_suffixes
from certagent.service.renewer import renewer_settings
from certagent.service.renewtime import cert_rng
from certagent.store import open_configured
from certagent.store.base import Store

__all__ = ["add_manage_parser", "run_manage"]


def add_manage_parser(cert: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = cert.add_parser(
        "manage",
        help="have the agents renew the certificates of these names from the ACME CA",
        description="Mark the certificate stored for each NAME as ACME-managed and schedule its"
        " renewal (at two thirds of its lifetime, one half under 10 days; at once if that has"
        " passed). The agents then renew each name through acme_directory, under the"
        " permission policy, one certificate per name.",
    )
    p.add_argument("names", nargs="+", metavar="NAME", help="names whose certificate to renew")
    p.add_argument(
        "--config",
        type=Path,
        required=True,
        metavar="FILE",
        help="certagent.toml: its store and ACME settings",
    )


async def run_manage(args: argparse.Namespace) -> int:
    """Manage every name; 0 if all were scheduled, 1 if any was not (each error printed)."""
    settings = config.load(args.config)
    if not settings.acme_directory:
        raise ConfigError(
            f"{args.config} sets no acme_directory: the agents renew through an ACME CA;"
            " configure one ('certagent init --acme-directory URL') first"
        )
    store = open_configured(settings)
    try:
        issuance = store.issuance()
        if issuance is None:
            raise ConfigError(f"the store {store.describe()} cannot keep a renewal schedule")
        # the offline part of the policy; an ask endpoint is asked by the agents at renewal
        permission = (
            None
            if settings.acme_ask
            else Permission(
                suffixes=parse_suffixes(settings.acme_allow_suffixes),
                registry=issuance.domains if settings.acme_registered else None,
            )
        )
        failed = 0
        for raw in args.names:
            try:
                print(await _manage(store, settings, permission, raw))
            except AgentError as exc:
                print(f"certagent: error: {raw}: {exc}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    finally:
        await store.close()


async def _manage(
    store: Store, settings: config.Settings, permission: Permission | None, raw: str
) -> str:
    name = hostname.normalise(raw)
    issuance = store.issuance()
    assert issuance is not None
    if permission is not None:
        decision = await permission.decide(name)
        if not decision.allowed:
            raise ConfigError(
                "no permission policy allows it, so the agents would not renew it: register it"
                f" ('certagent domain add {name}') or add its domain to acme_allow_suffixes"
            )
    found = [s for s in await store.lookup_all(name) if name in s.bundle.names]
    if not found:
        raise ConfigError(
            "the store has no certificate for this exact name (import it first with"
            " 'certagent cert add' or 'cert import')"
        )
    best = found[0].bundle
    policy = renewer_settings(settings).policy
    renew_at = policy.default_at(
        best.not_before.timestamp(), best.not_after.timestamp(), cert_rng(f"{best.serial:X}")
    )
    renew_at = max(renew_at, time.time())
    await issuance.renewals.manage(name, renew_at)
    return (
        f"{name}: managed; renewal at {_iso(renew_at)}"
        f" (certificate {found[0].id} expires {best.not_after.isoformat(timespec='seconds')})"
    )


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
