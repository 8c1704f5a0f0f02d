"""``certagent token add | ls | rm``: the REST API's tokens file (``api_tokens_file``).

The file keeps ``name:sha256hex`` lines (:mod:`certagent.api.auth`); nothing
here prints a hash, and a token is printed only when ``token add`` made it.
A running agent checks the file's mtime, size and inode on every request, so a
token added or removed here is accepted or refused from the next request on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from certagent.api.auth import add_token, register_token, remove_token, token_names
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
        help="make a token: print it once, add its SHA-256 to the tokens file",
        description="Print a new random token once and add NAME:sha256(token) to FILE"
        " (created with mode 0600 if missing). With --from-file, register the token held in"
        " that file instead (a Docker or systemd secret) and print nothing. " + _LIVE,
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
        help="if NAME is already in FILE, replace its hash (the old token stops working)"
        " instead of failing",
    )
    token.add_parser(
        "ls",
        parents=[tokens_file],
        help="list the token names in the tokens file, one per line",
        description="Print the name of every token in FILE, one per line. Tokens are not"
        " stored, and their hashes are not printed.",
    )
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
        for name in token_names(args.file):
            print(name)
        return 0
    if action == "rm":
        remove_token(args.file, args.name)
        print(
            f"token {args.name!r} removed from {args.file}; a running agent refuses it from its"
            " next request on",
            file=sys.stderr,
        )
        return 0
    if args.from_file is None:
        if args.replace:
            raise ConfigError("--replace goes with --from-file (a new random token never clashes)")
        print(add_token(args.file, args.name))
        print(f"token {args.name!r} added to {args.file}; it is shown only once", file=sys.stderr)
        return 0
    done = register_token(args.file, args.name, _read_secret(args.from_file), replace=args.replace)
    where = f"{'to' if done == 'added' else 'in'} {args.file}"
    print(f"token {args.name!r} {done} {where} (from {args.from_file})", file=sys.stderr)
    return 0


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
