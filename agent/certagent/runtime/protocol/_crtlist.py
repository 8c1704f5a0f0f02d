"""crt-lists: listing them and their lines, adding a line."""

from __future__ import annotations

import re

from certagent.runtime.protocol._framing import (
    Command,
    _fail,
)


def show_crtlists() -> Command:
    """``show ssl crt-list``: the crt-lists of HAProxy's configuration."""
    return Command(("show", "ssl", "crt-list"))


def parse_show_crtlists(reply: str) -> tuple[str, ...]:
    return tuple(line for line in reply.splitlines() if line and not line.startswith("#"))


def show_crtlist(crtlist: str) -> Command:
    """``show ssl crt-list <list>``: its lines (O(K) reply)."""
    return Command(("show", "ssl", "crt-list", crtlist))


def parse_show_crtlist(reply: str) -> tuple[str, ...]:
    """``show ssl crt-list <list>``: the certificate of each line (options ignored)."""
    entries = []
    for line in reply.splitlines():
        if not line or line.startswith("#"):
            continue
        entries.append(line.split(" ", 1)[0])
    return tuple(entries)


def add_crtlist(crtlist: str, name: str) -> Command:
    """A crt-list line for certificate ``name`` (refused while its store is empty)."""
    return Command(("add", "ssl", "crt-list", crtlist, name))


def add_crtlist_line(crtlist: str, name: str, options: str) -> Command:
    """A crt-list line for ``name`` with SSL options, e.g. ``[alpn acme-tls/1]``.

    Sent as a payload (the options hold spaces and brackets); answered like
    :func:`add_crtlist` (:func:`check_add_crtlist`).  ``options`` must be one
    bracketed list of plain words.
    """
    if not re.fullmatch(r"\[[a-z0-9-]+(?: [A-Za-z0-9._/:,-]+)*\]", options):
        raise ValueError(f"unsafe crt-list options {options[:80]!r}")
    return Command(("add", "ssl", "crt-list", crtlist), f"{name} {options}\n".encode())


def check_add_crtlist(crtlist: str, cert: str, reply: str) -> None:
    # One '.' per bind using the crt-list follows: "... in crt-list '<l>'.."
    expected = f"Inserting certificate '{cert}' in crt-list '{crtlist}'"
    lines = reply.splitlines()
    if len(lines) != 2 or lines[0].rstrip(".") != expected or lines[1] != "Success!":
        raise _fail(f"add ssl crt-list {crtlist} {cert}", reply)
