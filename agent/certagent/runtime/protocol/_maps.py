"""Maps: the HTTP-01 challenge answers of ``fe_http`` (and the bench's measurements)."""

from __future__ import annotations

from certagent.runtime.protocol._framing import Command, _fail


def add_map(map_file: str, key: str, value: str) -> Command:
    """``add map <file> <key> <value>``: answered by :func:`check_empty`.

    ``key`` and ``value`` are plain tokens (:func:`encode` refuses anything else):
    an HTTP-01 token and its key authorization are base64url and one dot.
    """
    return Command(("add", "map", map_file, key, value))


def del_map(map_file: str, key: str) -> Command:
    """``del map <file> <key>``: answered by :func:`check_del_map`."""
    return Command(("del", "map", map_file, key))


def check_del_map(command: str, reply: str) -> bool:
    """True if the key was deleted, False if it was not there."""
    if reply == "":
        return True
    if reply == "Key not found.":
        return False
    raise _fail(command, reply)


def parse_show_map(reply: str) -> list[tuple[str, str]]:
    """``show map <map>``: ``0x55..: key value`` or ``0x55.. key value`` lines."""
    rows = []
    for line in reply.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[0].startswith("0x"):
            continue
        rows.append((parts[1], parts[2]))
    return rows
