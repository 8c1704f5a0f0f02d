"""The renewal schedule and the issuance budget a fleet shares (issue 20).

Every ACME-managed certificate has one entry in a schedule ordered by the time it
should be renewed.  A node's renewal tick reads only the entries that are due
(:meth:`Renewals.due`: O(due + log M), never a scan of the store), takes the
name's issuance lease (:class:`~certagent.store.issuance.IssueLocks`, the same
lease on-demand issuance takes, so a name is never ordered twice at once), renews
it and stores the result with :meth:`~certagent.store.issuance.IssueLocks.add_issued`
and a new ``renew_at``.  A node that dies mid-renewal leaves the entry in place:
once its lease lapses, the next tick on any node takes it.

The budget (:meth:`Renewals.spend`) counts issuance in fixed windows kept in the
store, so ten nodes together respect one limit.

Entries are per name (a name's ECDSA and RSA records share one).  A name is
scheduled only while a record holds it: :meth:`Renewals.schedule` of a name no
record holds does nothing, and deleting the last record that holds a name (the
store's normal delete) drops its entry.  :meth:`Renewals.manage` opts an
imported certificate into renewal.

Times are Unix seconds (``time.time()``); every method raises
:class:`~certagent.errors.StoreUnavailable` when the store cannot be reached,
:class:`~certagent.errors.InvalidHostname` for a name that is not a hostname (or a
``*.`` pattern) and ValueError for a time that is not finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

__all__ = ["BudgetWindow", "DueRenewal", "Managed", "Renewals"]


@dataclass(frozen=True)
class DueRenewal:
    """One schedule entry: ``name`` should be renewed at ``renew_at``.

    ``not_after`` is the expiry of the certificate stored for ``name`` when the
    entry was written (0 when unknown), so a tick can tell "due" from "overdue"
    without reading the record.
    """

    name: str
    renew_at: float
    not_after: float


@dataclass(frozen=True)
class Managed:
    """A name opted into renewal: when, and which stored certificate it renews."""

    name: str
    renew_at: float
    certificate: str  # the record's id
    expires: datetime


@dataclass(frozen=True)
class BudgetWindow:
    """At most ``limit`` spends under ``key`` per fixed window of ``seconds``."""

    key: str
    limit: int
    seconds: float


class Renewals(Protocol):
    """The renewal schedule of one store; O(1) or O(log M) per call unless said."""

    async def schedule(self, name: str, renew_at: float, not_after: float) -> None:
        """Set (or move) ``name``'s entry; a later call for the same name replaces it.

        A no-op when no record holds ``name`` (the certificate was deleted
        meanwhile).  On a Redis Cluster that check and the write are two steps:
        a delete between them can leave an entry whose name has no record, which
        a tick that finds no record should :meth:`unschedule`.
        """
        ...

    async def manage(self, name: str, renew_at: float) -> None:
        """Opt the certificate(s) stored for ``name`` into renewal at ``renew_at``.

        Marks every record holding ``name`` ``managed`` =
        :data:`~certagent.store.issuance.ACME_MANAGED` and schedules ``name``
        (``not_after`` the latest of those records').  NotFound when no record
        holds ``name``; ReadOnlyRecord for a record the agent may not write
        (certbot's, in a directory store).  O(records holding the name).
        """
        ...

    async def unschedule(self, name: str) -> None:
        """Drop ``name``'s entry (a no-op if it has none).

        The store's delete does this itself for the names no record holds any more.
        """
        ...

    async def entry(self, name: str) -> DueRenewal | None:
        """``name``'s entry, or None."""
        ...

    async def due(self, now: float, limit: int) -> list[DueRenewal]:
        """Up to ``limit`` entries with ``renew_at <= now``, earliest first.

        O(log M + returned): one range read on the ordered schedule.
        """
        ...

    async def count(self, now: float) -> tuple[int, int]:
        """(entries in all, entries due at ``now``): O(log M), for status and metrics."""
        ...

    async def spend(self, windows: tuple[BudgetWindow, ...], now: float) -> float:
        """Take one unit from every window at once, or none.

        Returns 0.0 when taken; otherwise the seconds until every refused
        window has started afresh (the longest wait; nothing is taken).  Atomic
        across the fleet.  Windows are fixed: window *i* of ``w`` spans
        ``[i * w.seconds, (i + 1) * w.seconds)`` by ``now`` (the caller's clock).
        An empty ``windows`` takes nothing and returns 0.0.  ValueError for a
        window whose key is not 1-200 of ``A-Z a-z 0-9 _ . : * -``, whose limit
        is negative or whose seconds are not in (0, 366 days], or for the same
        (key, seconds) twice.  O(windows).
        """
        ...
