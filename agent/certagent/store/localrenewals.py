"""The renewal schedule and budget of one node, in memory (the directory store, tests).

:class:`Schedule` is the ordered schedule itself: a dict name -> entry beside a list
of ``(renew_at, name)`` kept sorted with :mod:`bisect`, so that :meth:`Schedule.due`
is a binary search and a slice (O(log M + due)) and a move is a binary search plus a
``list`` delete and insert (memmoves: about 0.15 ms at 100,000 entries, measured).
:class:`LocalBudget` counts fixed windows in a dict. :class:`LocalRenewals` puts
both behind :class:`~certagent.store.renewals.Renewals`, asking the store, through
two callbacks, whether a record holds a name and to mark a name's records managed.
The directory store's subclass (:mod:`certagent.store.directory._renewals`) also
journals every change.

Semantics are the Redis store's (:mod:`certagent.store.redis._renewals`).
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Iterable, Sequence

from certagent.store.issuing import check_name, check_time
from certagent.store.renewals import BudgetWindow, DueRenewal
from certagent.store.renewing import (
    check_due_limit,
    check_entry,
    check_windows,
    window_index,
    window_wait,
)

__all__ = ["Holds", "LocalBudget", "LocalRenewals", "Mark", "Schedule"]

#: Whether a record holds validated ``name``: ``await holds(name)``.
Holds = Callable[[str], Awaitable[bool]]
#: Marks the records holding validated ``name`` managed, returns their latest not_after
#: (Unix seconds); raises NotFound if none does: ``await mark(name)``.
Mark = Callable[[str], Awaitable[float]]


class Schedule:
    """Entries ordered by ``renew_at`` (then name): pure, in memory, no checks."""

    def __init__(self, entries: Iterable[DueRenewal] = ()) -> None:
        self._entries: dict[str, DueRenewal] = {}
        for entry in entries:
            self._entries[entry.name] = entry
        self._order = sorted((e.renew_at, e.name) for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[DueRenewal]:
        """Every entry, earliest first: O(M)."""
        return [self._entries[name] for _, name in self._order]

    def get(self, name: str) -> DueRenewal | None:
        return self._entries.get(name)

    def set(self, entry: DueRenewal) -> None:
        """Add or move ``entry.name``'s entry: O(log M) search + an O(M) memmove."""
        self.drop(entry.name)
        self._entries[entry.name] = entry
        bisect.insort(self._order, (entry.renew_at, entry.name))

    def drop(self, name: str) -> DueRenewal | None:
        """Remove ``name``'s entry; the entry removed, or None."""
        old = self._entries.pop(name, None)
        if old is not None:
            del self._order[bisect.bisect_left(self._order, (old.renew_at, old.name))]
        return old

    def due(self, now: float, limit: int) -> list[DueRenewal]:
        """Up to ``limit`` entries with ``renew_at <= now``, earliest first: O(log M + due)."""
        stop = min(self._due_count(now), limit)
        return [self._entries[name] for _, name in self._order[:stop]]

    def count(self, now: float) -> tuple[int, int]:
        """(entries, entries due at ``now``): O(log M)."""
        return len(self._entries), self._due_count(now)

    def _due_count(self, now: float) -> int:
        # every name sorts after "", so (now, "") would stop before entries at exactly now
        return bisect.bisect_right(self._order, (now, "\U0010ffff"))


class LocalBudget:
    """Fixed-window counters of one node: ``spend`` all-or-nothing over its windows.

    One count per (key, seconds), for the window it was last spent in; counts of
    windows that ended are forgotten whenever the dict has doubled.  Gone when
    the agent restarts (one node: the CA's own limits still apply).
    """

    def __init__(self) -> None:
        self._used: dict[tuple[str, float], tuple[int, int]] = {}  # -> (window index, count)
        self._prune_at = 1024

    def spend(self, windows: Sequence[BudgetWindow], now: float) -> float:
        """:meth:`~certagent.store.renewals.Renewals.spend`: O(windows), amortised."""
        windows = check_windows(windows)
        now = check_time(now, "now")
        counts = [self._count(w, now) for w in windows]
        waits = [
            window_wait(w, now) for w, used in zip(windows, counts, strict=True) if used >= w.limit
        ]
        if waits:
            return max(waits)
        for window, used in zip(windows, counts, strict=True):
            self._used[(window.key, float(window.seconds))] = (window_index(window, now), used + 1)
        if len(self._used) > self._prune_at:
            self._prune(now)
        return 0.0

    def _count(self, window: BudgetWindow, now: float) -> int:
        index, used = self._used.get((window.key, float(window.seconds)), (0, 0))
        return used if index == window_index(window, now) else 0

    def _prune(self, now: float) -> None:
        """Forget the windows that have ended: O(keys), once the dict doubled."""
        for slot in [s for s, (index, _) in self._used.items() if (index + 1) * s[1] <= now]:
            del self._used[slot]
        self._prune_at = max(1024, 2 * len(self._used))


class LocalRenewals:
    """:class:`~certagent.store.renewals.Renewals` of one node (see the module's docstring)."""

    def __init__(self, holds: Holds, mark: Mark) -> None:
        self._holds = holds
        self._mark = mark
        self._schedule = Schedule()
        self._budget = LocalBudget()

    async def _loaded(self) -> Schedule:
        """The schedule (a subclass may load or refresh it first)."""
        return self._schedule

    async def schedule(self, name: str, renew_at: float, not_after: float) -> None:
        """Set or move the entry, if a record holds ``name`` (see Renewals.schedule)."""
        entry = check_entry(name, renew_at, not_after)
        if await self._holds(entry.name):
            await self.put(entry)

    async def put(self, entry: DueRenewal) -> None:
        """Set ``entry`` (already checked) without asking whether a record holds its name."""
        (await self._loaded()).set(entry)

    async def unschedule(self, name: str) -> None:
        (await self._loaded()).drop(check_name(name))

    async def unschedule_orphans(self, names: Iterable[str]) -> None:
        """Drop the entries of those of ``names`` no record holds (after a delete)."""
        for name in dict.fromkeys(names):
            if (await self._loaded()).get(name) is not None and not await self._holds(name):
                await self.unschedule(name)

    async def manage(self, name: str, renew_at: float) -> None:
        name = check_name(name)
        renew_at = check_time(renew_at, "renew_at")
        not_after = await self._mark(name)
        await self.put(DueRenewal(name, renew_at, not_after))

    async def entry(self, name: str) -> DueRenewal | None:
        return (await self._loaded()).get(check_name(name))

    async def due(self, now: float, limit: int) -> list[DueRenewal]:
        now, limit = check_time(now, "now"), check_due_limit(limit)
        return (await self._loaded()).due(now, limit)

    async def count(self, now: float) -> tuple[int, int]:
        return (await self._loaded()).count(check_time(now, "now"))

    async def spend(self, windows: tuple[BudgetWindow, ...], now: float) -> float:
        return self._budget.spend(windows, now)
