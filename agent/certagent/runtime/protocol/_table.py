"""The usage table: marks of loaded hosts (fe_sni's stick table, ``gpt0`` = slot)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from certagent.runtime.protocol._framing import (
    Command,
    _fail,
    check_empty,
)


def set_mark(table: str, host: str, number: int) -> Command:
    """Mark ``host`` loaded in slot ``number`` (0: not loaded); its connections skip the agent."""
    return Command(("set", "table", table, "key", host, "data.gpt0", str(number)))


def check_set_mark(reply: str) -> None:
    check_empty("set table", reply)


def clear_entry(table: str, host: str) -> Command:
    """Drop ``host``'s entry (refused while a connection tracks it: :func:`check_clear_table`)."""
    return Command(("clear", "table", table, "key", host))


IN_USE = "Entry currently in use, cannot remove"


def check_clear_table(command: str, reply: str) -> bool:
    """``clear table <t> key <k>``: True if removed (or absent), False if a session holds it.

    HAProxy refuses to remove an entry a live connection tracks; that is not
    an error for the agent, which neutralises the entry first (``gpt0`` 0).
    """
    if reply == "":
        return True
    if reply == IN_USE:
        return False
    raise _fail(command, reply)


def unmark(table: str, host: str) -> list[Command]:
    """Mark ``host`` not loaded, then drop its entry (refused while a connection tracks it)."""
    return [set_mark(table, host, 0), clear_entry(table, host)]


def check_unmark(replies: Iterator[str]) -> None:
    """The two replies of :func:`unmark`; an entry in use is fine (already neutral)."""
    check_set_mark(next(replies))
    check_clear_table("clear table", next(replies))


def show_entry(table: str, host: str) -> Command:
    """``show table <t> key <host>``: one entry (O(log K))."""
    return Command(("show", "table", table, "key", host))


def show_marked(table: str) -> Command:
    """Every host marked loaded (``gpt0`` > 0): O(K), for adoption and ``status``."""
    return Command(("show", "table", table, "data.gpt0", "gt", "0"))


def is_table_dump(table: str, reply: str) -> bool:
    """Whether ``reply`` to ``show table <table> ...`` is that table's dump (it exists)."""
    return reply.startswith(f"# table: {table},")


@dataclass(frozen=True)
class TableEntry:
    key: str
    expire_ms: int | None
    conn_cnt: int | None
    gpt0: int | None = None


_TABLE_LINE = re.compile(r"0x[0-9a-f]+: key=(\S+) use=\d+ exp=(\d+)(.*)\Z")
_CONN_CNT = re.compile(r"\bconn_cnt=(\d+)")
_GPT0 = re.compile(r"\bgpt0=(\d+)")


def parse_show_table(reply: str) -> list[TableEntry]:
    """``show table <t>`` entries; lines that do not parse (hostile keys) are skipped."""
    entries = []
    for line in reply.splitlines():
        m = _TABLE_LINE.match(line)
        if m is None:
            continue
        conn = _CONN_CNT.search(m.group(3))
        gpt0 = _GPT0.search(m.group(3))
        entries.append(
            TableEntry(
                key=m.group(1),
                expire_ms=int(m.group(2)),
                conn_cnt=int(conn.group(1)) if conn else None,
                gpt0=int(gpt0.group(1)) if gpt0 else None,
            )
        )
    return entries
