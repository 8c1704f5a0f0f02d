"""``certagent domain add|ls|rm``: the names a platform registers for on-demand issuance.

Writes the store's registry directly (``--config``), so every agent of the fleet
sees a change at once through the change feed; the REST API's ``/v1/domains`` does
the same over HTTP (docs/acme.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from certagent import config
from certagent.api.domains import registered_name, registration_json
from certagent.certs import hostname
from certagent.errors import AgentError, ConfigError
from certagent.store import open_configured
from certagent.store.issuance import DomainRegistry

__all__ = ["DOMAIN_COMMAND", "add_domain_commands", "run_domain_command"]

DOMAIN_COMMAND = "domain"
PAGE = 500


def add_domain_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``domain`` (add, ls, rm) to ``certagent``'s parser."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="certagent.toml: its store"
    )
    pd = subparsers.add_parser(
        DOMAIN_COMMAND,
        help="register names for on-demand issuance (add, ls, rm)",
        description="Names a platform allows: with acme_registered = true in certagent.toml,"
        " the agents issue a certificate for a registered name on its first connection (or at"
        " once with --issue), whatever the ask endpoint says. docs/acme.md",
    )
    domain = pd.add_subparsers(dest="domain_command", required=True, metavar="SUBCOMMAND")
    p = domain.add_parser("add", parents=[where], help="register a name")
    p.add_argument("name", help="a hostname, e.g. shop.example.com (no wildcard)")
    p.add_argument(
        "--issue", action="store_true", help="issue its certificate now, not on first connection"
    )
    p = domain.add_parser("ls", parents=[where], help="list registered names, in name order")
    p.add_argument("--after", metavar="NAME", help="start after this name")
    p.add_argument("--limit", type=int, metavar="N", help="print at most N names")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p = domain.add_parser("rm", parents=[where], help="unregister a name (no more issuance)")
    p.add_argument("name", help="a registered hostname")


def run_domain_command(args: argparse.Namespace) -> int:
    """Run a ``domain`` command; its exit status (errors go to stderr)."""
    try:
        return asyncio.run(_run(args))
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace) -> int:
    store = open_configured(config.load(args.config))
    try:
        issuance = store.issuance()
        if issuance is None:
            raise ConfigError(f"the store {store.describe()} cannot keep domain registrations")
        registry = issuance.domains
        if args.domain_command == "add":
            name = registered_name(args.name)
            existed = await registry.registration(name) is not None
            await registry.register(name, issue=args.issue)
            state = "already registered" if existed else "registered"
            print(f"{name}: {state}{'; to be issued now' if args.issue else ''}")
            return 0
        if args.domain_command == "rm":
            name = hostname.normalise(args.name)
            if not await registry.unregister(name):
                print(f"certagent: error: {name} is not registered", file=sys.stderr)
                return 1
            print(f"{name}: unregistered")
            return 0
        return await _list(registry, args)
    finally:
        await store.close()


async def _list(registry: DomainRegistry, args: argparse.Namespace) -> int:
    """Page through the registry, printing as it goes (constant memory)."""
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    after = hostname.normalise(args.after) if args.after else None
    left = args.limit
    while left is None or left > 0:
        wanted = PAGE if left is None else min(PAGE, left)
        page = await registry.registrations(after=after, limit=wanted)
        for registration in page:
            if args.json:
                print(json.dumps(registration_json(registration), sort_keys=True))
            else:
                flag = "  (issue now)" if registration.issue else ""
                print(f"{registration.name}{flag}")
        if left is not None:
            left -= len(page)
        if len(page) < wanted:
            break
        after = page[-1].name
    return 0
