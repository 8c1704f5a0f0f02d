"""The session: prompt mode, ``show info`` (which process), its build, the master's reload."""

from __future__ import annotations

from dataclasses import dataclass

from certagent.errors import (
    HAProxyError,
)
from certagent.runtime.protocol._framing import (
    Command,
)


def prompt() -> Command:
    """Switch the connection to prompt mode (its reply is the first, empty, prompt)."""
    return Command(("prompt",))


def show_info() -> Command:
    return Command(("show", "info"))


def show_build(dev: bool) -> Command:
    """``show dev`` (3.0+: ``haproxy -vv``'s lines) or ``show libs`` (the executable first).

    Their replies are parsed in :mod:`certagent.runtime.build`.
    """
    return Command(("show", "dev" if dev else "libs"))


def parse_show_info(reply: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            info[key] = value
    if "Pid" not in info:
        raise HAProxyError(f"unexpected 'show info' reply {reply[:200]!r}")
    return info


@dataclass(frozen=True)
class Identity:
    """Which HAProxy process a connection talks to; changes on reload and restart."""

    pid: int
    start_time: int
    version: str


def parse_identity(reply: str) -> Identity:
    """The :class:`Identity` in a ``show info`` reply."""
    info = parse_show_info(reply)
    try:
        return Identity(
            int(info["Pid"]), int(info.get("Start_time_sec", "0")), info.get("Version", "?")
        )
    except ValueError as exc:
        raise HAProxyError(f"unexpected 'show info' values: Pid={info.get('Pid')!r}") from exc


def master_reload() -> Command:
    """``reload`` on HAProxy's master CLI (``haproxy -S``), not the workers' runtime API.

    HAProxy 2.6's master re-executes itself; what it writes back before the
    connection closes is not an answer to check.
    """
    return Command(("reload",))
