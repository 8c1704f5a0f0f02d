"""TLS session-ticket keys: HAProxy's ring of a ``tls-ticket-keys`` file."""

from __future__ import annotations

import re

from certagent.errors import (
    CommandFailed,
    HAProxyError,
)
from certagent.runtime.protocol._framing import (
    Command,
)

_TLS_KEY_ROW = re.compile(r"(\d+)\.(\d+) (\S+)\Z")
NO_TLS_KEYS_FILE = "unable to locate referenced filename"


def show_tls_keys(keys_file: str) -> Command:
    return Command(("show", "tls-keys", keys_file))


def parse_show_tls_keys(reply: str) -> tuple[str, ...] | None:
    """``show tls-keys <file>``: the keys in HAProxy's order (previous, current, next).

    None if HAProxy has no ticket-key file of that name (no ``tls-ticket-keys``
    in haproxy.cfg); HAProxyError for any other reply without keys.
    """
    if NO_TLS_KEYS_FILE in reply:
        return None
    rows = []
    for line in reply.splitlines():
        match = _TLS_KEY_ROW.match(line)
        if match:
            rows.append((int(match.group(2)), match.group(3)))
    if not rows:
        raise HAProxyError(f"unexpected 'show tls-keys' reply {reply[:80]!r}")
    return tuple(key for _, key in sorted(rows))


def set_tls_key(keys_file: str, key: str) -> Command:
    """Shift HAProxy's ring of ``keys_file`` by one: ``key`` becomes the next key.

    The key is a secret: log the command with :func:`shown` only.
    """
    return Command(("set", "ssl", "tls-key", keys_file, key))


def check_set_tls_key(keys_file: str, reply: str) -> None:
    """``set ssl tls-key <file> <key>``; the command named without its key (a secret)."""
    if reply != "TLS ticket key updated!":
        raise CommandFailed(f"set ssl tls-key {keys_file} <key>", reply)
