"""The commands of a batch of loads, and the judgement of HAProxy's replies (sans I/O).

A load puts one certificate into one slot.  Within a batch each load is::

    [set table T key <old host> data.gpt0 0, clear table T key <old host>]*  (recycling)
    [new ssl cert S]                                      (a slot name HAProxy lacks)
    set ssl cert S <<PEM ; [set ssl cert S.ocsp <<BASE64] ; commit ssl cert S ; abort ssl cert S
    [add ssl crt-list L S]                                (a slot not yet listed)

The old hosts stop being "loaded" in the usage table (``gpt0`` 0) before the
slot's certificate changes; the trailing ``abort`` closes the transaction of a
failed commit, so no load can leak into the next one's transaction (the 2.6.12
merge); HAProxy refuses to list a certificate store that is still empty, so a
slot whose commit failed never becomes a crt-list line.  New hosts are marked
loaded (``gpt0`` = slot number) only in a later round trip, after their commit
succeeded: see :func:`map_command`.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from certagent.errors import AgentError, HAProxyError, WrongTransaction
from certagent.runtime import protocol
from certagent.runtime.client import Command
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import Slot, SlotState
from certagent.store.base import StoredCertificate

log = logging.getLogger(__name__)


@dataclass
class Load:
    """One certificate going into one slot within a batch."""

    cert: StoredCertificate
    slot: str
    state: SlotState
    victim: Slot | None  # the slot's current occupant, when recycling
    error: AgentError | None = None
    old_hosts: tuple[str, ...] = ()  # the victim's hosts when the load was planned

    def __post_init__(self) -> None:
        if self.victim is not None and not self.old_hosts:
            self.old_hosts = tuple(sorted(self.victim.hosts))


def map_command(names: HAProxyNames, host: str, number: int) -> Command:
    """Mark ``host`` loaded in slot ``number``: its connections skip the agent."""
    return Command(("set", "table", names.usage_table, "key", host, "data.gpt0", str(number)))


def unmap_commands(names: HAProxyNames, host: str) -> list[Command]:
    """Mark ``host`` not loaded, then drop its entry (refused while a connection tracks it)."""
    return [
        map_command(names, host, 0),
        Command(("clear", "table", names.usage_table, "key", host)),
    ]


def check_unmap(replies: Iterator[str]) -> None:
    """The replies of :func:`unmap_commands`; an entry in use is fine (already neutral)."""
    protocol.check_empty("set table", next(replies))
    protocol.check_clear_table("clear table", next(replies))


def ocsp_command(slot: str, der: bytes) -> Command:
    """Put an OCSP response into the open transaction of ``slot`` (stapled from the commit)."""
    return Command(("set", "ssl", "cert", f"{slot}.ocsp"), base64.b64encode(der) + b"\n")


def load_commands(names: HAProxyNames, loads: Sequence[Load]) -> list[Command]:
    """Every command of ``loads``, in order, for one pipelined write."""
    commands: list[Command] = []
    for ld in loads:
        for host in ld.old_hosts:
            commands += unmap_commands(names, host)
        if ld.state is SlotState.NEW:
            commands.append(Command(("new", "ssl", "cert", ld.slot)))
        commands.append(Command(("set", "ssl", "cert", ld.slot), ld.cert.bundle.pem))
        if ld.cert.ocsp is not None:
            commands.append(ocsp_command(ld.slot, ld.cert.ocsp))
        commands += [
            Command(("commit", "ssl", "cert", ld.slot)),
            Command(("abort", "ssl", "cert", ld.slot)),
        ]
        if ld.state is not SlotState.LISTED:
            commands.append(Command(("add", "ssl", "crt-list", names.crt_list, ld.slot)))
    return commands


@dataclass(frozen=True)
class Outcome:
    """What the replies of :func:`load_commands` say, beyond each load's ``error``."""

    created: tuple[str, ...]  # slot names HAProxy now knows (``new ssl cert`` worked)
    stale: tuple[str, ...]  # listed although the commit failed: holding an older certificate


def judge(names: HAProxyNames, loads: Sequence[Load], replies: Sequence[str]) -> Outcome:
    """Check every reply of :func:`load_commands`, setting ``error`` on each failed load.

    Raises WrongTransaction (another writer's transaction showed up: stop and
    reconnect) and HAProxyError for a reply that cannot belong to the command
    (an unmap refused, which means the usage table is not the one configured).
    """
    it = iter(replies)
    created: list[str] = []
    stale: list[str] = []
    for ld in loads:
        for _ in ld.old_hosts:
            check_unmap(it)
        # read all of this load's replies before judging them, to stay aligned
        new_reply = next(it) if ld.state is SlotState.NEW else None
        set_reply = next(it)
        ocsp_reply = next(it) if ld.cert.ocsp is not None else None
        commit_reply, _abort = next(it), next(it)
        list_reply = next(it) if ld.state is not SlotState.LISTED else None
        try:
            if new_reply is not None:
                protocol.check_new_cert(ld.slot, new_reply)
                created.append(ld.slot)
            protocol.check_set_cert(ld.slot, set_reply)
            if ocsp_reply is not None:
                protocol.check_set_cert(ld.slot, ocsp_reply)
            protocol.check_commit_cert(ld.slot, commit_reply)
            if list_reply is not None:
                protocol.check_add_crtlist(names.crt_list, ld.slot, list_reply)
        except WrongTransaction:
            raise
        except HAProxyError as exc:
            ld.error = exc
            log.error(
                "loading %s into %s failed: %s", " ".join(ld.cert.bundle.names), ld.slot, exc
            )
            if list_reply is not None and _listed(names.crt_list, ld.slot, list_reply):
                stale.append(ld.slot)
    return Outcome(tuple(created), tuple(stale))


def _listed(crt_list: str, slot: str, reply: str) -> bool:
    """Whether ``reply`` to ``add ssl crt-list`` says the line went in."""
    try:
        protocol.check_add_crtlist(crt_list, slot, reply)
    except HAProxyError:
        return False
    return True
