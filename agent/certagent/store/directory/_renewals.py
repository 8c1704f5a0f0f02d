"""The directory store's renewal schedule: in memory, journalled in ``.certagent/renewals.log``.

One node's schedule (:class:`~certagent.store.localrenewals.Schedule`, a sorted
list: ``due`` is O(log M + due)), replayed from the journal
(:mod:`._journal`) on first use and kept in memory.  Every change appends one
line to the journal (fsynced, under its lock) before it changes the memory, so
a change costs O(1) I/O whatever the schedule's size.  A CLI command given the
same directory writes the same journal: a reader looks at the journal's
signature (one ``stat``) at most every :data:`CHECK_EVERY` seconds and replays
it when another process wrote, and a writer that finds it changed replays it
at once, so the agent sees the command's change within that time and a
compaction never drops it.

A record *holds* a name when the file or lineage a lookup for exactly that
name would try first exists (:meth:`~certagent.store.directory._records.Records.holder`).
:meth:`~DirRenewals.manage` marks that record ``managed`` with its mark file
(:mod:`._state`); certbot's lineages are certbot's to renew (ReadOnlyRecord).
The budget is this agent's memory: one node, restarted with an empty count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from certagent.errors import NotFound, ReadOnlyRecord, StoreUnavailable
from certagent.store.directory import _journal
from certagent.store.directory._index import LIVE
from certagent.store.directory._issuance import Run
from certagent.store.directory._journal import Journal, Replayed, Signature, line_of
from certagent.store.directory._records import Records
from certagent.store.directory._scan import alias_target
from certagent.store.directory._state import STATE_DIR, write_mark
from certagent.store.issuance import ACME_MANAGED
from certagent.store.issuing import check_name
from certagent.store.localrenewals import LocalRenewals, Schedule
from certagent.store.renewals import DueRenewal

__all__ = ["CHECK_EVERY", "DirRenewals"]

#: How often (seconds) a read looks whether another process wrote the journal.
CHECK_EVERY = 1.0

T = TypeVar("T")


class DirRenewals(LocalRenewals):
    """:class:`~certagent.store.renewals.Renewals` of a directory store (module docstring).

    ``run(what, call)`` runs ``call`` on the store's worker threads (with the
    time limit of a write); ``records`` are the store's.
    """

    def __init__(self, records: Records, uri: str, run: Run) -> None:
        super().__init__(self._holds_name, self._mark_name)
        self._records = records
        self._uri = uri
        self._run = run
        self._journal = Journal(records.root / STATE_DIR)
        self._seen: Signature | None = None  # None: not read yet
        self._lines = 0
        self._checked = 0.0
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def _guard(self) -> asyncio.Lock:
        """One lock per event loop (a CLI may run several loops on one store object)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    def _stale(self) -> bool:
        return self._seen is None or time.monotonic() - self._checked >= CHECK_EVERY

    async def _loaded(self) -> Schedule:
        if self._stale():
            async with self._guard():
                await self._refresh()
        return self._schedule

    async def _refresh(self) -> None:
        """Replay the journal if it was never read or another process wrote it (lock held)."""
        if not self._stale():
            return
        seen = self._seen
        if seen is None:
            replayed: Replayed | None = await self._call(
                "reading the renewal schedule", self._journal.read
            )
        else:
            replayed = await self._call(
                "reading the renewal schedule", lambda: self._journal.read_if_changed(seen)
            )
        self._checked = time.monotonic()
        if replayed is not None:
            self._take(replayed)

    def _take(self, replayed: Replayed) -> None:
        self._schedule, self._lines, self._seen = (
            replayed.schedule,
            replayed.lines,
            replayed.signature,
        )

    async def put(self, entry: DueRenewal) -> None:
        await self._change(entry.name, entry)

    async def unschedule(self, name: str) -> None:
        await self._change(check_name(name), None)

    async def _change(self, name: str, entry: DueRenewal | None) -> None:
        """Journal the change, then make it in memory; compact when the journal doubled."""
        async with self._guard():
            await self._refresh()
            if entry is None and self._schedule.get(name) is None:
                return
            line, seen = line_of(name, entry), self._seen or (0, 0)
            replayed, signature = await self._call(
                "journalling the renewal schedule", lambda: self._journal.append(line, seen)
            )
            if replayed is not None:
                self._take(replayed)  # another process wrote too: its changes and ours
            else:
                if entry is None:
                    self._schedule.drop(name)
                else:
                    self._schedule.set(entry)
                self._seen, self._lines = signature, self._lines + 1
            if self._lines >= _journal.COMPACT_AT and self._lines > 2 * len(self._schedule):
                self._take(
                    await self._call("compacting the renewal schedule", self._journal.compact)
                )

    async def _holds_name(self, name: str) -> bool:
        holder = await self._call(f"looking for {name}", lambda: self._records.holder(name))
        return holder is not None

    async def _mark_name(self, name: str) -> float:
        return await self._call(f"marking {name} managed", lambda: self._mark_sync(name))

    def _mark_sync(self, name: str) -> float:
        """Mark the record a lookup of ``name`` finds first; its not_after (worker thread)."""
        holder = self._records.holder(name)
        if holder is None:
            raise NotFound(
                f"{self._uri}: no certificate is stored for {name}; add it before asking"
                " for its renewal"
            )
        if holder.startswith(f"{LIVE}/"):
            raise ReadOnlyRecord(
                f"{self._uri}: {name} is certbot's lineage {holder!r}; certbot renews it"
            )
        cert_id = alias_target(self._records.root, holder) or holder
        record = self._records.get(cert_id)
        if record is None:
            raise NotFound(f"{self._uri}: no certificate {cert_id!r} for {name}")
        write_mark(self._records.root, cert_id, ACME_MANAGED, record.fingerprint_sha256)
        return record.not_after.timestamp()

    async def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return await self._run(what, call)
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: {what}: {exc.strerror or exc}") from exc
