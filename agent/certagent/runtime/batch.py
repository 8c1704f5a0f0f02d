"""The commands of a batch of loads, and the judgement of HAProxy's replies (sans I/O).

A load puts one certificate into one slot.  Within a batch each load is::

    [set table T key <old host> data.gpt0 0, clear table T key <old host>]*  (recycling)
    [new ssl cert S]                                      (a slot name HAProxy lacks)
    set ssl cert S <<PEM ; [set ssl cert S.ocsp <<BASE64] ; commit ssl cert S ; abort ssl cert S
    [add ssl crt-list L S]                                (a slot not yet listed)

The old hosts are unmarked in the usage table (``gpt0`` 0) before the slot's
certificate changes; the certificate goes in through one
:class:`~certagent.runtime.protocol.Transaction`, whose trailing ``abort``
closes the transaction of a failed commit, so no load can leak into the next
one's transaction (the 2.6.12 merge); HAProxy refuses to list a certificate
store that is still empty, so a slot whose commit failed never becomes a
crt-list line.  New hosts are marked loaded (``gpt0`` = slot number) after
their commit succeeded (:func:`~certagent.runtime.protocol.set_mark`, sent
later in the same write).  Every command is built by
:mod:`certagent.runtime.protocol`; this module only orders and judges them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from certagent.certs.stored import StoredCertificate
from certagent.errors import AgentError, HAProxyError, WrongTransaction
from certagent.runtime import protocol
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import Slot, SlotState

__all__ = ["BatchVerdict", "Load", "judge", "load_commands"]

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
    transaction: protocol.Transaction = field(init=False)

    def __post_init__(self) -> None:
        if self.victim is not None and not self.old_hosts:
            self.old_hosts = tuple(sorted(self.victim.hosts))
        self.transaction = protocol.Transaction(self.slot, self.cert.bundle.pem, self.cert.ocsp)


def load_commands(names: HAProxyNames, loads: Sequence[Load]) -> list[protocol.Command]:
    """Every command of ``loads``, in order, for one pipelined write."""
    commands: list[protocol.Command] = []
    for ld in loads:
        for host in ld.old_hosts:
            commands += protocol.unmark(names.usage_table, host)
        if ld.state is SlotState.NEW:
            commands.append(protocol.new_cert(ld.slot))
        commands += ld.transaction.commands()
        if ld.state is not SlotState.LISTED:
            commands.append(protocol.add_crtlist(names.crt_list, ld.slot))
    return commands


@dataclass(frozen=True)
class BatchVerdict:
    """What the replies of :func:`load_commands` say, beyond each load's ``error``."""

    created: tuple[str, ...]  # slot names HAProxy now knows (``new ssl cert`` worked)
    stale: tuple[str, ...]  # listed although the commit failed: holding an older certificate


def judge(names: HAProxyNames, loads: Sequence[Load], replies: Sequence[str]) -> BatchVerdict:
    """Check every reply of :func:`load_commands`, setting ``error`` on each failed load.

    Raises WrongTransaction (another writer's transaction showed up: stop and
    reconnect) and HAProxyError for a reply that cannot belong to the command
    (an unmark refused, which means the usage table is not the one configured).
    """
    it = iter(replies)
    created: list[str] = []
    stale: list[str] = []
    for ld in loads:
        for _ in ld.old_hosts:
            protocol.check_unmark(it)
        # read all of this load's replies before judging them, to stay aligned
        new_reply = next(it) if ld.state is SlotState.NEW else None
        transaction_replies = _take(it, ld.transaction.size)
        list_reply = next(it) if ld.state is not SlotState.LISTED else None
        try:
            if new_reply is not None:
                protocol.check_new_cert(ld.slot, new_reply)
                created.append(ld.slot)
            ld.transaction.check(transaction_replies)
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
    return BatchVerdict(tuple(created), tuple(stale))


def _take(replies: Iterator[str], count: int) -> list[str]:
    taken = [reply for _, reply in zip(range(count), replies, strict=False)]
    if len(taken) != count:
        raise HAProxyError(f"{count - len(taken)} replies missing from a load batch")
    return taken


def _listed(crt_list: str, slot: str, reply: str) -> bool:
    """Whether ``reply`` to ``add ssl crt-list`` says the line went in."""
    try:
        protocol.check_add_crtlist(crt_list, slot, reply)
    except HAProxyError:
        return False
    return True
