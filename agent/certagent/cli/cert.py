"""``certagent cert | keys``: manage the certificates in the store and their data keys.

Every ``cert`` command works either on the store directly (``--config FILE``:
the store, key file and upload policy of that configuration) or through a
running agent's REST API (``--api URL`` with ``--token`` or ``CERTAGENT_TOKEN``).
Uploads are validated by :func:`certagent.certs.validate.validate_upload` either way: here
before writing to the store, or by the API server.

``cli.py`` wires these in with :func:`add_cert_commands` and dispatches
``args.command in CERT_COMMANDS`` to :func:`run_cert_command`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from certagent import config
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.cli.backends import TOKEN_ENV, Backend, Record, StoreBackend, open_backend, read_file
from certagent.cli.importer import (
    DEFAULT_JOBS,
    DEFAULT_WORKERS,
    ImportResult,
    import_certificates,
)
from certagent.cli.lineage import deploy_lineage, is_lineage
from certagent.cli.listing import Listing, print_listing
from certagent.cli.manage import add_manage_parser, run_manage
from certagent.errors import (
    AgentError,
    ConfigError,
)
from certagent.store import open_configured

__all__ = [
    "CERT_COMMANDS",
    "ImportResult",
    "StoreBackend",
    "add_cert_commands",
    "import_certificates",
    "run_cert_command",
]

CERT_COMMANDS = ("cert", "keys")
_WITHIN = re.compile(r"(\d{1,5})([hdw])\Z")
_DAYS = re.compile(r"(\d{1,5})d\Z")


# --- argument parsing -------------------------------------------------------------------------


def add_cert_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cert`` and ``keys`` (with their subcommands) to ``certagent``'s parser."""
    target = argparse.ArgumentParser(add_help=False)
    where = target.add_argument_group("where the certificates are (one of)")
    where.add_argument(
        "--config", type=Path, metavar="FILE", help="certagent.toml: use its store directly"
    )
    where.add_argument(
        "--api",
        metavar="URL",
        help="a running agent's REST API, e.g. http://127.0.0.1:8089, or https://... when it"
        " is served over TLS (api_tls_cert)",
    )
    where.add_argument("--token", metavar="TOKEN", help=f"API bearer token (default: ${TOKEN_ENV})")
    where.add_argument(
        "--api-ca",
        type=Path,
        metavar="FILE",
        help="https --api: the CA certificates (PEM) to trust for the API's certificate"
        " (default: the system's)",
    )
    where.add_argument(
        "--api-client-cert",
        type=Path,
        metavar="FILE",
        help="https --api under mutual TLS (api_client_ca): the client certificate (PEM; with"
        " its key, or give --api-client-key)",
    )
    where.add_argument(
        "--api-client-key",
        type=Path,
        metavar="FILE",
        help="the client certificate's private key (PEM), if not in --api-client-cert",
    )
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    pc = subparsers.add_parser(
        "cert",
        help="add, list, show, rotate, remove and import certificates",
        description="Manage the certificates in the store, directly (--config) or through "
        "the REST API (--api). Uploads are validated the same way in both cases. A Redis store "
        "encrypts private keys with the current data key of the writer's key file (key_file, or "
        "CERTAGENT_KEY_FILE): an add, rotate or import is refused (exit 1, nothing stored) when a "
        "running agent does not hold that key, or, with none running, when the key file lacks a "
        "key the stored records use.",
    )
    cert = pc.add_subparsers(dest="cert_command", required=True, metavar="SUBCOMMAND")
    p = cert.add_parser(
        "add", parents=[target, as_json], help="validate and store a certificate and its key"
    )
    p.add_argument(
        "--cert",
        required=True,
        type=Path,
        metavar="FILE",
        help="PEM chain, leaf first (or a combined PEM with the key)",
    )
    p.add_argument(
        "--key", type=Path, metavar="FILE", help="PEM private key (leave out if --cert holds it)"
    )
    p = cert.add_parser(
        "rotate", parents=[target, as_json], help="replace an id's certificate and key"
    )
    p.add_argument("id", metavar="ID", help="the record to rotate (see 'cert ls')")
    p.add_argument(
        "--cert",
        required=True,
        type=Path,
        metavar="FILE",
        help="the new PEM chain, leaf first (or a combined PEM with the key)",
    )
    p.add_argument(
        "--key", type=Path, metavar="FILE", help="the new PEM private key (if not in --cert)"
    )
    p = cert.add_parser(
        "ls",
        parents=[target, as_json],
        help="list certificates, by id, printing each page as it is read",
        description="List the certificates by id, a page (500) at a time, each printed as"
        " it is read: memory holds one page (a directory store also lists its file names for"
        " each page), whatever the store's size. --json prints one JSON"
        " array (the REST API's records), written as it goes. --limit and --after are the"
        " REST API's limit and cursor: when --limit stops the listing before its end, the"
        " cursor to go on with is printed on stderr ('more: --after CURSOR').",
    )
    p.add_argument(
        "--limit",
        type=_positive,
        metavar="N",
        help="at most N certificates (default: all)",
    )
    p.add_argument(
        "--after",
        metavar="CURSOR",
        help="start after this cursor (printed by an earlier --limit; the API's next_cursor)",
    )
    p.add_argument("--name", metavar="HOST", help="only certificates for exactly this name")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--expiring",
        metavar="WITHIN",
        help="only certificates expiring within WITHIN from now (expired ones included):"
        " 30d, 12h or 2w",
    )
    when.add_argument(
        "--expiring-before",
        metavar="WHEN",
        help="only certificates expiring before WHEN: ISO 8601 (2030-01-31) or 30d",
    )
    p = cert.add_parser("show", parents=[target, as_json], help="one certificate's metadata")
    p.add_argument("id", metavar="ID", help="the record to show (see 'cert ls')")
    p = cert.add_parser(
        "ocsp",
        parents=[target, as_json],
        help="staple an OCSP response (DER) for a certificate",
        description="Check the DER OCSP response in FILE against the certificate (a current,"
        " successful response about it, signed by its issuer or a responder it delegated),"
        " keep it with the certificate, and have every agent staple it at once, no reload."
        " Fetch one with: openssl ocsp -issuer ISSUER.pem -cert CERT.pem -url URL"
        " -respout FILE -noverify",
    )
    p.add_argument("id", metavar="ID", help="the certificate (see 'cert ls')")
    p.add_argument("file", type=Path, metavar="FILE", help="the DER OCSP response")
    p = cert.add_parser("rm", parents=[target], help="delete a certificate")
    p.add_argument("id", metavar="ID", help="the record to delete (see 'cert ls')")
    add_manage_parser(cert)
    p = cert.add_parser(
        "import",
        parents=[target],
        help="add every certificate of a directory (NAME.pem files or certbot's live/), or"
        " add or rotate one certbot lineage (a deploy hook)",
        description="Add every combined PEM (PATH/*.pem) and every certbot lineage "
        "(PATH/live/NAME/fullchain.pem + privkey.pem, or PATH/NAME/... if PATH is live/). "
        "Bad files are reported and skipped; certificates already stored are skipped. "
        "If PATH is one lineage (it holds fullchain.pem, e.g. certbot's $RENEWED_LINEAGE), "
        "its certificate is added, or rotates the record of its previous version (same names "
        "or fewer, same key kind) so running agents swap it in live; already stored: nothing "
        "changes, exit 0. "
        "Progress goes to stderr: a bar on a terminal, otherwise a line at most every 5 s; "
        "the summary goes to stdout. Exits 1 if any file failed.",
    )
    p.add_argument(
        "path",
        type=Path,
        metavar="PATH",
        help="a directory of NAME.pem files (chain and key), certbot's live/ (or its parent),"
        " or one lineage (live/NAME)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"uploads in flight at once, through --api or into a directory"
        f" (default {DEFAULT_JOBS})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        metavar="N",
        help="processes validating files for a Redis store (default: one per CPU,"
        f" {DEFAULT_WORKERS} here; 0: none, validate in the importing process)",
    )

    pk = subparsers.add_parser(
        "keys",
        help="data keys that encrypt private keys in Redis",
        description="Make data keys for key_file, and re-encrypt stored keys with the current one.",
    )
    keys = pk.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    p = keys.add_parser(
        "generate",
        help="print a new kid:base64key line for the key file",
        description="Print a new data key line. Put it FIRST in every node's key file to make "
        "it the current key (keep the old lines so existing records still decrypt), restart the "
        "agents, then run 'certagent keys rotate'. Until every running agent holds the new key, "
        "writes with it are refused.",
    )
    p.add_argument(
        "kid",
        nargs="?",
        metavar="KID",
        help="key id (default: the key's fingerprint, k + 12 hex digits, the same on every node)",
    )
    p = keys.add_parser(
        "rotate",
        help="re-encrypt every stored key with the key file's current key",
        description="Re-encrypt every stored key with the key file's current key (records and "
        "the ticket-key ring of a Redis store, ACME account keys). Records a Redis store holds "
        "in its first layout (one hash each, written before layout 2) are rewritten in layout 2 "
        "at the same time: online, one record at a time, ids and indexes unchanged.",
    )
    p.add_argument(
        "--config",
        required=True,
        type=Path,
        metavar="FILE",
        help="certagent.toml: its store and key_file (current key first)",
    )


def run_cert_command(args: argparse.Namespace) -> int:
    """Run a ``cert``/``keys`` command; its exit status (errors go to stderr)."""
    try:
        if args.command == "keys" and args.keys_command == "generate":
            print(generate_key_line(args.kid))
            return 0
        if args.command == "keys":
            return asyncio.run(_rotate_keys(config.load(args.config)))
        if args.cert_command == "manage":
            return asyncio.run(run_manage(args))
        return asyncio.run(_cert(args))
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1


# --- commands ---------------------------------------------------------------------------------


async def _cert(args: argparse.Namespace) -> int:
    backend = open_backend(args)
    try:
        return await _run_cert(args, backend)
    finally:
        await backend.close()


async def _run_cert(args: argparse.Namespace, backend: Backend) -> int:
    command = args.cert_command
    if command in ("add", "rotate"):
        chain = read_file(args.cert)
        key = read_file(args.key) if args.key else None
        if command == "add":
            record = await backend.add(chain, key)
            verb = "added"
        else:
            record = await backend.replace(args.id, chain, key)
            verb = f"rotated to version {record['version']}"
        if args.json:
            _print_json(record)
        else:
            print(
                f"{verb} {record['id']} for {' '.join(record['names'])}"
                f" (valid until {record['not_after']})"
            )
        return 0
    if command == "show":
        record = await backend.get(args.id)
        if args.json:
            _print_json(record)
        else:
            _print_record(record)
        return 0
    if command == "ocsp":
        stapled = await backend.put_ocsp(args.id, read_file(args.file))
        if args.json:
            _print_json(stapled)
        else:
            print(
                f"stapling for {stapled['id']}: {stapled['status']},"
                f" next update {stapled['next_update'] or 'not given'}"
            )
        return 0
    if command == "rm":
        await backend.delete(args.id)
        print(f"deleted {args.id}")
        return 0
    if command == "ls":
        expiring = parse_when(args.expiring_before) if args.expiring_before else None
        if args.expiring:
            expiring = datetime.now(UTC) + parse_within(args.expiring)
        listing = Listing(args.name, expiring, args.after, args.limit)
        await print_listing(backend, listing, args.json)
        return 0
    if command == "import" and is_lineage(args.path):
        deployed = await deploy_lineage(backend, args.path)
        print(deployed.summary())
        for note in deployed.notes():
            print(note, file=sys.stderr)
        return 0
    if command == "import":
        result = await import_certificates(
            backend, args.path, jobs=args.jobs, workers=args.workers, progress=sys.stderr
        )
        print(result.summary())
        return 0 if result.failed == 0 and not result.stopped else 1
    raise AssertionError(command)  # pragma: no cover


async def _rotate_keys(settings: config.Settings) -> int:
    if not settings.key_file:
        raise ConfigError("keys rotate needs key_file in the configuration (the data keys)")
    store = open_configured(settings)
    try:
        keys = store.data_keys()
        if keys is None:
            raise ConfigError(
                f"the store {store.describe()} does not encrypt keys; nothing to rotate"
            )
        result = await keys.rotate_keys()
    finally:
        await store.close()
    print(
        f"re-encrypted stored keys with data key {KeyRing.from_file(settings.key_file).current}"
        f": {result}"
    )
    return 0


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"give a whole number of at least 1, not {value!r}")
    return int(value)


def parse_within(value: str) -> timedelta:
    """``30d``, ``12h``, ``2w`` -> that long; ConfigError otherwise."""
    match = _WITHIN.match(value.strip())
    if match is None:
        raise ConfigError(
            f"--expiring {value!r}: give a number and a unit: 30d (days), 12h (hours), 2w (weeks)"
        )
    number, unit = int(match.group(1)), match.group(2)
    return {
        "h": timedelta(hours=number),
        "d": timedelta(days=number),
        "w": timedelta(weeks=number),
    }[unit]


def parse_when(value: str) -> datetime:
    """``2030-01-31``, ``2030-01-31T12:00:00Z`` (UTC if no offset) or ``30d`` (from now)."""
    days = _DAYS.match(value.strip())
    if days:
        return datetime.now(UTC) + timedelta(days=int(days.group(1)))
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise ConfigError(
            f"--expiring-before {value!r}: give an ISO 8601 date or time (2030-01-31)"
            " or a number of days (30d)"
        ) from exc
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def _print_record(record: Record) -> None:
    rows = [
        ("id", record["id"]),
        ("names", " ".join(record["names"])),
        ("not before", record["not_before"]),
        ("not after", record["not_after"]),
        ("key type", record["key_type"]),
        ("serial", record["serial"]),
        ("sha256", record["fingerprint_sha256"]),
        ("version", record["version"]),
        ("updated at", record["updated_at"]),
        ("managed", record.get("managed") or "-"),
    ]
    for label, value in rows:
        print(f"{label:<12} {value}")
