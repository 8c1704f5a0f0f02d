"""Every HAProxy runtime-API command the benches send, each with the check of its reply.

This is the one place in ``bench/`` where a command line is spelled out.  Encoding,
framing and reply parsing are the agent's own (:mod:`certagent.runtime.protocol`,
:mod:`certagent.runtime.client`); what is here only says which arguments each
command takes and which reply means success::

    steps = [*load(slot, pem), add_map(map_file, host, slot)]
    replies = await client.pipeline([s.command for s in steps])
    for step, reply in zip(steps, replies): step.check(reply)   # HAProxyError if wrong

Commands sent on a fresh connection through ``Stack.admin`` (a text line) use
:func:`line`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from certagent.errors import CommandFailed
from certagent.runtime import protocol
from certagent.runtime.client import Command

#: ``abort ssl cert`` after a successful commit: the transaction is already closed.
NO_TRANSACTION = "No ongoing transaction!"


@dataclass(frozen=True)
class Step:
    """One command and the check of its reply (raises :class:`HAProxyError` if wrong)."""

    command: Command
    check: Callable[[str], None]

    @property
    def text(self) -> str:
        return " ".join(self.command.args)


def _step(*args: str, check: Callable[[str, str], None], payload: bytes | None = None) -> Step:
    command = Command(args, payload)
    text = " ".join(args)
    return Step(command, lambda reply: check(text, reply))


def _nothing(command: str, reply: str) -> None:
    protocol.check_empty(command, reply)


def _something(command: str, reply: str) -> None:
    if not reply:
        raise CommandFailed(command, "(empty reply)")


def line(step: Step) -> str:
    """The command as one line for ``Stack.admin`` (encoded, so checked, by the agent's code)."""
    return protocol.encode(*step.command.args).decode().rstrip("\n")


# --- certificates ---------------------------------------------------------------------------


def new_cert(slot: str) -> Step:
    return _step("new", "ssl", "cert", slot, check=lambda _, r: protocol.check_new_cert(slot, r))


def set_cert(slot: str, pem: bytes) -> Step:
    return _step(
        "set", "ssl", "cert", slot, payload=pem, check=lambda _, r: protocol.check_set_cert(slot, r)
    )


def commit_cert(slot: str) -> Step:
    return _step(
        "commit", "ssl", "cert", slot, check=lambda _, r: protocol.check_commit_cert(slot, r)
    )


def abort_open(slot: str) -> Step:
    """``abort ssl cert`` of a transaction left open by a ``set``."""
    return _step(
        "abort", "ssl", "cert", slot, check=lambda _, r: protocol.check_abort_cert(slot, r)
    )


def abort_closed(slot: str) -> Step:
    """``abort ssl cert`` after a commit (the agent's trailing abort): nothing to abort."""

    def check(command: str, reply: str) -> None:
        if reply != NO_TRANSACTION:
            raise CommandFailed(command, reply)

    return _step("abort", "ssl", "cert", slot, check=check)


def load(slot: str, pem: bytes) -> list[Step]:
    """One load into an existing slot, as the agent sends it: set, commit, abort."""
    return [set_cert(slot, pem), commit_cert(slot), abort_closed(slot)]


def add_to_crtlist(crtlist: str, slot: str) -> Step:
    return _step(
        "add", "ssl", "crt-list", crtlist, slot,
        check=lambda _, r: protocol.check_add_crtlist(crtlist, slot, r),
    )  # fmt: skip


# --- maps and the stick table ---------------------------------------------------------------


def add_map(map_file: str, key: str, value: str) -> Step:
    return _step("add", "map", map_file, key, value, check=_nothing)


def set_map(map_file: str, key: str, value: str) -> Step:
    return _step("set", "map", map_file, key, value, check=_nothing)


def del_map(map_file: str, key: str) -> Step:
    """Delete a key that is there (a missing key is a failure here)."""
    return _step("del", "map", map_file, key, check=_nothing)


def set_gpt0(table: str, key: str, value: int) -> Step:
    return _step("set", "table", table, "key", key, "data.gpt0", str(value), check=_nothing)


def show_table_key(table: str, key: str) -> Step:
    """``show table <t> key <k>`` of a key that is there: exactly that entry."""

    def check(command: str, reply: str) -> None:
        if [e.key for e in protocol.parse_show_table(reply)] != [key]:
            raise CommandFailed(command, reply)

    return _step("show", "table", table, "key", key, check=check)


def clear_table_key(table: str, key: str) -> Step:
    return _step("clear", "table", table, "key", key, check=_nothing)


def show_table(table: str) -> Step:
    """Every entry of ``table``, after a header that counts them (``used:N``)."""
    return _step("show", "table", table, check=_something)


def show_loaded(table: str) -> Step:
    """The entries of the agent's usage table marked loaded (``gpt0`` > 0)."""
    return _step("show", "table", table, "data.gpt0", "gt", "0", check=_something)


def table_used(reply: str) -> int:
    """Entries in a table, from the header of a ``show table`` reply (-1 if not found)."""
    used = reply.partition("\n")[0].rpartition("used:")[2].strip()
    return int(used) if used.isdigit() else -1


def show_version() -> Step:
    """The cheapest command: the CLI's own floor."""
    return _step("show", "version", check=_something)
