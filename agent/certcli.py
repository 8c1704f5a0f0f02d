"""``certagent cert | keys | token``: manage the certificates in the store.

Every ``cert`` command works either on the store directly (``--config FILE``:
the store, key file and upload policy of that configuration) or through a
running agent's REST API (``--api URL`` with ``--token`` or ``CERTAGENT_TOKEN``).
Uploads are validated by :func:`agent.validate.validate_upload` either way: here
before writing to the store, or by the API server.

``cli.py`` wires these in with :func:`add_cert_commands` and dispatches
``args.command in CERT_COMMANDS`` to :func:`run_cert_command`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TextIO

from agent import config
from agent.api.auth import add_token
from agent.api.body import upload_policy
from agent.api.client import ApiBackend, ApiProblem, ApiUnreachable
from agent.api.problems import AlreadyStored
from agent.api.views import record_json
from agent.errors import (
    AgentError,
    CertificateError,
    ConfigError,
    DuplicateCertificate,
    NotFound,
    StoreUnavailable,
)
from agent.keycrypt import KeyRing, generate_key_line
from agent.pem import CertBundle
from agent.store import open_configured
from agent.store.base import Store
from agent.validate import UploadPolicy, validate_upload

__all__ = [
    "CERT_COMMANDS",
    "ImportResult",
    "StoreBackend",
    "add_cert_commands",
    "import_certificates",
    "run_cert_command",
]

CERT_COMMANDS = ("cert", "keys", "token")
TOKEN_ENV = "CERTAGENT_TOKEN"  # noqa: S105 (a variable name)
MAX_FILE = 1 << 20
DEFAULT_JOBS = 8
_DAYS = re.compile(r"(\d{1,5})d\Z")

Record = dict[str, Any]


# --- argument parsing -------------------------------------------------------------------------


def add_cert_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cert``, ``keys`` and ``token`` (with their subcommands) to ``certagent``'s parser."""
    target = argparse.ArgumentParser(add_help=False)
    where = target.add_argument_group("where the certificates are (one of)")
    where.add_argument(
        "--config", type=Path, metavar="FILE", help="certagent.toml: use its store directly"
    )
    where.add_argument(
        "--api", metavar="URL", help="a running agent's REST API, e.g. http://127.0.0.1:8089"
    )
    where.add_argument("--token", metavar="TOKEN", help=f"API bearer token (default: ${TOKEN_ENV})")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON")

    pc = subparsers.add_parser(
        "cert",
        help="add, list, show, rotate, remove and import certificates",
        description="Manage the certificates in the store, directly (--config) or through "
        "the REST API (--api). Uploads are validated the same way in both cases.",
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
    p.add_argument("id", metavar="ID")
    p.add_argument("--cert", required=True, type=Path, metavar="FILE")
    p.add_argument("--key", type=Path, metavar="FILE")
    p = cert.add_parser("ls", parents=[target, as_json], help="list certificates")
    p.add_argument("--name", metavar="HOST", help="only certificates for exactly this name")
    p.add_argument(
        "--expiring-before",
        metavar="WHEN",
        help="only certificates expiring before WHEN: ISO 8601 (2030-01-31) or 30d",
    )
    p = cert.add_parser("show", parents=[target, as_json], help="one certificate's metadata")
    p.add_argument("id", metavar="ID")
    p = cert.add_parser("rm", parents=[target], help="delete a certificate")
    p.add_argument("id", metavar="ID")
    p = cert.add_parser(
        "import",
        parents=[target],
        help="add every certificate of a directory (NAME.pem files or certbot's live/)",
        description="Add every combined PEM (PATH/*.pem) and every certbot lineage "
        "(PATH/live/NAME/fullchain.pem + privkey.pem, or PATH/NAME/... if PATH is live/). "
        "Bad files are reported and skipped; certificates already stored are skipped. "
        "Exits 1 if any file failed.",
    )
    p.add_argument("path", type=Path, metavar="PATH")
    p.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"uploads in flight at once (default {DEFAULT_JOBS})",
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
        description="Print a new data key line. Put it FIRST in the key file to make it the "
        "current key (keep the old lines so existing records still decrypt), then run "
        "'certagent keys rotate'.",
    )
    p.add_argument("kid", nargs="?", metavar="KID", help="key id (default: k + today's date)")
    p = keys.add_parser(
        "rotate", help="re-encrypt every stored key with the key file's current key"
    )
    p.add_argument("--config", required=True, type=Path, metavar="FILE")

    pt = subparsers.add_parser("token", help="REST API bearer tokens")
    token = pt.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    p = token.add_parser(
        "add",
        help="make a token: print it once, append its SHA-256 to the tokens file",
        description="Print a new random token once and append NAME:sha256(token) to FILE "
        "(the api_tokens_file setting; created with mode 0600). The agent picks it up "
        "without a restart. Revoke a token by deleting its line.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--file", required=True, type=Path, metavar="FILE")


def run_cert_command(args: argparse.Namespace) -> int:
    """Run a ``cert``/``keys``/``token`` command; its exit status (errors go to stderr)."""
    try:
        if args.command == "token":
            print(add_token(args.file, args.name))
            print(
                f"token {args.name!r} added to {args.file}; it is shown only once", file=sys.stderr
            )
            return 0
        if args.command == "keys" and args.keys_command == "generate":
            kid = args.kid or "k" + datetime.now(UTC).strftime("%Y%m%d")
            print(generate_key_line(kid))
            return 0
        if args.command == "keys":
            return asyncio.run(_rotate_keys(config.load(args.config)))
        return asyncio.run(_cert(args))
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1


# --- backends: the store directly, or the REST API ---------------------------------------------


class Backend(Protocol):
    async def add(self, chain: bytes, key: bytes | None) -> Record: ...
    async def replace(self, cert_id: str, chain: bytes, key: bytes | None) -> Record: ...
    async def get(self, cert_id: str) -> Record: ...
    async def page(
        self, name: str | None, expiring_before: datetime | None, cursor: str | None
    ) -> tuple[list[Record], str | None]: ...
    async def delete(self, cert_id: str) -> None: ...
    async def close(self) -> None: ...


@dataclass
class StoreBackend:
    store: Store
    policy: UploadPolicy
    now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def _validate(self, chain: bytes, key: bytes | None) -> CertBundle:
        return validate_upload(chain, key, now=self.now(), policy=self.policy)

    async def add(self, chain: bytes, key: bytes | None) -> Record:
        bundle = self._validate(chain, key)
        try:
            return record_json(await self.store.add(bundle))
        except DuplicateCertificate as exc:
            raise AlreadyStored(str(exc)) from exc

    async def replace(self, cert_id: str, chain: bytes, key: bytes | None) -> Record:
        await self.get(cert_id)
        bundle = self._validate(chain, key)
        try:
            return record_json(await self.store.replace(cert_id, bundle))
        except DuplicateCertificate as exc:
            raise AlreadyStored(str(exc)) from exc

    async def get(self, cert_id: str) -> Record:
        record = await self.store.get(cert_id)
        if record is None:
            raise NotFound(f"no certificate with id {cert_id!r} in {self.store.describe()}")
        return record_json(record)

    async def page(
        self, name: str | None, expiring_before: datetime | None, cursor: str | None
    ) -> tuple[list[Record], str | None]:
        found = await self.store.list(
            name=name, expiring_before=expiring_before, cursor=cursor, limit=500
        )
        return [record_json(r) for r in found.records], found.cursor

    async def delete(self, cert_id: str) -> None:
        await self.store.delete(cert_id)

    async def close(self) -> None:
        await self.store.close()


def _backend(args: argparse.Namespace) -> Backend:
    if (args.config is None) == (args.api is None):
        raise ConfigError("give either --config FILE (the store directly) or --api URL")
    if args.api is not None:
        token = args.token or os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ConfigError(f"--api needs a token: --token TOKEN or ${TOKEN_ENV}")
        return ApiBackend(args.api, token)
    settings = config.load(args.config)
    return StoreBackend(open_configured(settings), upload_policy(settings))


# --- commands ---------------------------------------------------------------------------------


async def _cert(args: argparse.Namespace) -> int:
    backend = _backend(args)
    try:
        return await _run_cert(args, backend)
    finally:
        await backend.close()


async def _run_cert(args: argparse.Namespace, backend: Backend) -> int:
    command = args.cert_command
    if command in ("add", "rotate"):
        chain = _read_file(args.cert)
        key = _read_file(args.key) if args.key else None
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
    if command == "rm":
        await backend.delete(args.id)
        print(f"deleted {args.id}")
        return 0
    if command == "ls":
        expiring = parse_when(args.expiring_before) if args.expiring_before else None
        records = []
        cursor: str | None = None
        while True:
            items, cursor = await backend.page(args.name, expiring, cursor)
            records += items
            if cursor is None:
                break
        if args.json:
            _print_json(records)
        else:
            _print_table(records)
        return 0
    if command == "import":
        result = await import_certificates(backend, args.path, jobs=args.jobs, progress=sys.stderr)
        print(result.summary())
        return 0 if result.failed == 0 and not result.stopped else 1
    raise AssertionError(command)  # pragma: no cover


async def _rotate_keys(settings: config.Settings) -> int:
    if not settings.key_file:
        raise ConfigError("keys rotate needs key_file in the configuration (the data keys)")
    store = open_configured(settings)
    try:
        rotate: Callable[[], Awaitable[object]] | None = getattr(store, "rotate_keys", None)
        if rotate is None:
            raise ConfigError(
                f"the store {store.describe()} does not encrypt keys; nothing to rotate"
            )
        result = await rotate()
    finally:
        await store.close()
    print(
        f"re-encrypted stored keys with data key {KeyRing.from_file(settings.key_file).current}"
        f": {result}"
    )
    return 0


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


def _read_file(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_FILE:
        raise CertificateError(f"{path} is over {MAX_FILE} bytes; it is not a certificate")
    return data


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
    ]
    for label, value in rows:
        print(f"{label:<12} {value}")


def _print_table(records: list[Record]) -> None:
    print(f"{'ID':<32}  {'NOT AFTER':<20}  {'VER':>3}  {'KEY':<10}  NAMES")
    for r in records:
        print(
            f"{r['id']:<32}  {r['not_after']:<20}  {r['version']:>3}  {r['key_type']:<10}"
            f"  {' '.join(r['names'])}"
        )
    print(f"{len(records)} certificate{'s' if len(records) != 1 else ''}", file=sys.stderr)


# --- import ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportItem:
    label: str  # what the reports call it: the path, relative to the import root
    chain: Path
    key: Path | None  # None: combined PEM


@dataclass
class ImportResult:
    total: int = 0
    added: int = 0
    existing: int = 0
    failed: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the import stopped early (store or API unavailable)

    @property
    def done(self) -> int:
        return self.added + self.existing + self.failed

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        text = (
            f"imported {self.done} of {self.total} files in {self.seconds:.1f} s"
            f" ({self.rate:.0f}/s): {self.added} added, {self.existing} already stored,"
            f" {self.failed} failed"
        )
        return text + (f"; stopped: {self.stopped}" if self.stopped else "")


def find_import_items(root: Path) -> list[ImportItem]:
    """``root/*.pem`` (combined) and certbot lineages in ``root/live/*/`` or ``root/*/``."""
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory")
    items = [
        ImportItem(p.name, p, None)
        for p in sorted(root.iterdir())
        if p.suffix == ".pem" and not p.name.startswith(".") and p.is_file()
    ]
    for base in (root / "live", root):
        if not base.is_dir():
            continue
        for lineage in sorted(base.iterdir()):
            fullchain = lineage / "fullchain.pem"
            if lineage.is_dir() and fullchain.is_file():
                items.append(
                    ImportItem(str(fullchain.relative_to(root)), fullchain, lineage / "privkey.pem")
                )
    return items


class _Progress:
    def __init__(self, out: TextIO | None, result: ImportResult, start: float) -> None:
        self.out = out
        self.result = result
        self.start = start
        self.tty = bool(out is not None and out.isatty())
        self.shown = 0.0
        self.step = max(1000, result.total // 10)

    def line(self) -> str:
        r = self.result
        elapsed = time.monotonic() - self.start
        rate = r.done / elapsed if elapsed > 0 else 0.0
        return (
            f"import: {r.done}/{r.total} files, {r.added} added, {r.existing} already"
            f" stored, {r.failed} failed, {rate:.0f}/s"
        )

    def update(self) -> None:
        if self.out is None:
            return
        if self.tty:
            now = time.monotonic()
            if now - self.shown >= 0.2:
                self.shown = now
                self.out.write("\r" + self.line() + "\033[K")
                self.out.flush()
        elif self.result.done % self.step == 0:
            self.out.write(self.line() + "\n")

    def report(self, item: ImportItem, exc: AgentError) -> None:
        if self.out is None:
            return
        code = getattr(exc, "code", type(exc).__name__)
        self.out.write(("\r\033[K" if self.tty else "") + f"skipped {item.label}: {code}: {exc}\n")

    def finish(self) -> None:
        if self.out is not None and self.tty:
            self.out.write("\r" + self.line() + "\033[K\n")


async def import_certificates(
    backend: Backend,
    root: Path,
    *,
    jobs: int = DEFAULT_JOBS,
    progress: TextIO | None = None,
) -> ImportResult:
    """Add every certificate :func:`find_import_items` finds under ``root``, ``jobs`` at a time.

    A file that cannot be read or is refused is reported on ``progress`` and
    skipped; one already stored is counted and skipped.  The import stops early
    only when the store or the API is unavailable (or refuses the token).
    """
    items = find_import_items(root)
    result = ImportResult(total=len(items))
    start = time.monotonic()
    shown = _Progress(progress, result, start)
    slots = asyncio.Semaphore(max(1, jobs))
    pending: set[asyncio.Task[None]] = set()

    async def one(item: ImportItem) -> None:
        try:
            chain = await asyncio.to_thread(_read_file, item.chain)
            key = await asyncio.to_thread(_read_key, item.key) if item.key else None
            await backend.add(chain, key)
            result.added += 1
        except AgentError as exc:
            if _fatal(exc):
                result.stopped = result.stopped or str(exc)
            elif _already(exc):
                result.existing += 1
            else:
                result.failed += 1
                shown.report(item, exc)
        finally:
            slots.release()
            shown.update()

    for item in items:
        await slots.acquire()
        if result.stopped:
            slots.release()
            break
        task = asyncio.create_task(one(item))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    result.seconds = time.monotonic() - start
    shown.finish()
    return result


def _read_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return _read_file(path)
    except ConfigError:
        if not path.exists():
            return None  # certbot without privkey.pem: maybe the key is in fullchain.pem
        raise


def _already(exc: AgentError) -> bool:
    if isinstance(exc, ApiProblem):
        return exc.status == 409
    return isinstance(exc, AlreadyStored)


def _fatal(exc: AgentError) -> bool:
    if isinstance(exc, ApiProblem):
        return exc.status in (401, 403) or exc.status >= 500
    return isinstance(exc, StoreUnavailable | ApiUnreachable)
