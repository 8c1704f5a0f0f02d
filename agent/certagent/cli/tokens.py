"""``certagent token add | ls | rm``: the REST API's tokens file (``api_tokens_file``).

The file keeps ``name:sha256hex`` lines and what each token may do (scopes,
name patterns, expiry, rate, client certificate subject: :mod:`certagent.api.auth`,
:mod:`certagent.api.grants`); nothing here prints a hash, and a token is printed
only when ``token add`` made it.  A running agent checks the file's mtime, size
and inode on every request, so a token added or removed here is accepted or
refused from the next request on.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from certagent.api.auth import TokenEntry, add_token, register_token, remove_token, token_entries
from certagent.api.grants import Grant, Scope, make_grant
from certagent.errors import ConfigError

__all__ = ["add_token_commands", "run_token_command"]

_MAX_SECRET = 4096
_LIVE = (
    "A running agent re-checks the file on every request: the change takes effect from its"
    " next request on, with no restart (SIGHUP re-reads it at once too)."
)


def add_token_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``token add | ls | rm`` to ``certagent``'s parser."""
    tokens_file = argparse.ArgumentParser(add_help=False)
    tokens_file.add_argument(
        "--file",
        required=True,
        type=Path,
        metavar="FILE",
        help="the tokens file (the api_tokens_file setting)",
    )
    pt = subparsers.add_parser(
        "token",
        help="REST API bearer tokens: add, list, remove",
        description="Manage the REST API's tokens file: one name:sha256(token) line per token."
        " " + _LIVE,
    )
    token = pt.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    p = token.add_parser(
        "add",
        parents=[tokens_file],
        help="make a token: print it once, add its SHA-256 (and what it may do) to the file",
        description="Print a new random token once and add NAME:sha256(token) to FILE"
        " (created with mode 0600 if missing), with what the token may do: without --scope"
        " it is an admin token (everything), without --names it acts on every name. With"
        " --from-file, register the token held in that file instead (a Docker or systemd"
        " secret) and print nothing; with --client-subject alone, no token at all: a client"
        " certificate with that subject (mutual TLS, api_client_ca) authenticates as NAME. "
        + _LIVE,
    )
    p.add_argument(
        "name", metavar="NAME", help="who the token is for: 1-64 letters, digits, _ . @ -"
    )
    p.add_argument(
        "--from-file",
        type=Path,
        metavar="SECRET",
        help="take the token from SECRET (one line of 16-512 printable characters, no spaces)"
        " instead of making one; it is never printed",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="if NAME is already in FILE, replace its line (the old token stops working)"
        " instead of failing",
    )
    what = p.add_argument_group("what the token may do")
    what.add_argument(
        "--scope",
        action="append",
        choices=[s.value for s in Scope],
        default=[],
        metavar="SCOPE",
        help="read (every GET), certificates (upload, rotate, delete, OCSP), domains (register"
        " and remove names), renewals (opt certificates into renewal) or admin (all; the"
        " default); repeat for several",
    )
    what.add_argument(
        "--names",
        action="append",
        default=[],
        metavar="PATTERN",
        help="hold every action and every read to names matching PATTERN: example.com,"
        " *.example.com (one label under it) or .example.com (it and every name under it);"
        " repeat for several. A certificate is allowed only if all its names match",
    )
    what.add_argument(
        "--expires",
        metavar="DURATION",
        help="refuse the token (401) after DURATION from now: 90s, 15m, 12h or 30d",
    )
    what.add_argument(
        "--rate",
        metavar="N/s",
        help="at most N requests a second on average (N/m, N/h also taken); more get 429"
        " with Retry-After. Counted by each agent on its own",
    )
    what.add_argument(
        "--client-subject",
        metavar="SUBJECT",
        help="a client certificate with this subject authenticates as NAME without a bearer"
        " token (mutual TLS): RFC 4514, as `openssl x509 -noout -subject -nameopt RFC2253`"
        " prints it, e.g. CN=deploy,O=Example. Alone, no token is made",
    )
    p = token.add_parser(
        "ls",
        parents=[tokens_file],
        help="list the tokens: name, scopes, names, expiry, rate, client subject",
        description="Print one line per token in FILE: its name, scopes, name patterns (* for"
        " every name), expiry (never, or when; 'expired' once past), rate and client"
        " certificate subject (- for none), separated by two spaces. --json prints one JSON"
        " object per line instead. Tokens are not stored, and their hashes are not printed.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per token and line")
    p = token.add_parser(
        "rm",
        parents=[tokens_file],
        help="remove a token: the API refuses it from its next request on",
        description="Remove NAME's line from FILE. The file is rewritten atomically (a new"
        " file renamed over it) with the same mode (0600) and owner; comments and the other"
        " tokens are kept. Exits 1 if FILE has no token NAME. " + _LIVE,
    )
    p.add_argument("name", metavar="NAME", help="the token to remove (see 'token ls')")


def run_token_command(args: argparse.Namespace) -> int:
    """Run ``token add | ls | rm``; its exit status.  Raises ConfigError (the caller prints it)."""
    action: str = args.token_command
    if action == "ls":
        now = datetime.now(UTC)
        for entry in token_entries(args.file):
            print(json.dumps(_entry_json(entry, now)) if args.json else _entry_line(entry, now))
        return 0
    if action == "rm":
        remove_token(args.file, args.name)
        print(
            f"token {args.name!r} removed from {args.file}; a running agent refuses it from its"
            " next request on",
            file=sys.stderr,
        )
        return 0
    grant = make_grant(
        scopes=args.scope,
        names=args.names,
        expires_in=args.expires,
        rate=args.rate,
        subject=args.client_subject,
        now=datetime.now(UTC),
    )
    if args.from_file is None and args.client_subject is not None:
        done = register_token(args.file, args.name, None, replace=args.replace, grant=grant)
        print(
            f"{args.name!r} {done} {'to' if done == 'added' else 'in'} {args.file}: a client"
            f" certificate with subject {grant.subject} authenticates as it ({_what(grant)})",
            file=sys.stderr,
        )
        return 0
    if args.from_file is None:
        if args.replace:
            raise ConfigError(
                "--replace goes with --from-file or --client-subject (a new random token never"
                " clashes: remove the old one with `token rm` first)"
            )
        print(add_token(args.file, args.name, grant))
        print(
            f"token {args.name!r} added to {args.file} ({_what(grant)}); it is shown only once",
            file=sys.stderr,
        )
        return 0
    secret = _read_secret(args.from_file)
    done = register_token(args.file, args.name, secret, replace=args.replace, grant=grant)
    where = f"{'to' if done == 'added' else 'in'} {args.file}"
    print(
        f"token {args.name!r} {done} {where} (from {args.from_file}; {_what(grant)})",
        file=sys.stderr,
    )
    return 0


def _what(grant: Grant) -> str:
    scopes = ",".join(s.value for s in Scope if s in grant.scopes)
    names = ",".join(str(p) for p in grant.patterns) or "every name"
    expiry = "" if grant.expires is None else f", until {_iso(grant.expires)}"
    rate = "" if grant.rate is None else f", at most {grant.rate}"
    return f"{scopes} on {names}{expiry}{rate}"


def _entry_json(entry: TokenEntry, now: datetime) -> dict[str, object]:
    return {
        "name": entry.name,
        "token": entry.sha256 is not None,
        **entry.grant.describe(),
        "expired": entry.grant.expired(now),
    }


def _entry_line(entry: TokenEntry, now: datetime) -> str:
    grant = entry.grant
    expiry = "never" if grant.expires is None else _iso(grant.expires)
    if grant.expired(now):
        expiry += " (expired)"
    fields = [
        entry.name,
        ",".join(s.value for s in Scope if s in grant.scopes),
        ",".join(str(p) for p in grant.patterns) or "*",
        expiry,
        str(grant.rate) if grant.rate is not None else "-",
        grant.subject or "-",
    ]
    return "  ".join(fields)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _read_secret(path: Path) -> str:
    """The one line of ``path``, its line ending removed; the message never shows it."""
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_SECRET + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the token file {path}: {exc.strerror}; it must be readable by this"
            " user (a Docker secret is mounted with the mode of the file it came from)"
        ) from exc
    if len(data) > _MAX_SECRET:
        raise ConfigError(f"the token file {path} is over {_MAX_SECRET} bytes; it holds one line")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the token file {path} is not ASCII text") from exc
    lines = text.splitlines()
    if len(lines) != 1:
        raise ConfigError(
            f"the token file {path} holds {len(lines)} lines; it must hold the token alone,"
            " on one line"
        )
    return lines[0]
