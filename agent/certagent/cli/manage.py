"""``certagent cert manage NAME...``: opt imported certificates into the agent's ACME renewal.

Each name goes through :func:`certagent.service.manage.manage_name` (the REST API's
``PUT /v1/renewals/{name}`` does the same on a running agent).  Without an ask
endpoint the permission policy is checked here; with one, the agents ask it at
renewal.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from certagent import config
from certagent.errors import AgentError, ConfigError
from certagent.service.manage import manage_name
from certagent.service.permission import Permission, parse_suffixes
from certagent.service.renewer import renewer_settings
from certagent.store import open_configured
from certagent.store.renewals import Managed

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
        policy = renewer_settings(settings).policy
        failed = 0
        for raw in args.names:
            try:
                print(_shown(await manage_name(store, permission, policy, raw)))
            except AgentError as exc:
                print(f"certagent: error: {raw}: {exc}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    finally:
        await store.close()


def _shown(managed: Managed) -> str:
    return (
        f"{managed.name}: managed; renewal at {_iso(managed.renew_at)} (certificate"
        f" {managed.certificate} expires {managed.expires.isoformat(timespec='seconds')})"
    )


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
