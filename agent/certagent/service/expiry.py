"""Expiry: a WARNING for each stored certificate entering the warning window, and counts.

Once an hour (and at start) the agent lists the stored certificates whose
notAfter falls within ``expiry_warning_days`` (the store's expiry index: Redis
ZRANGEBYSCORE, O(log N + M) for M certificates in the window, which is about 0
when renewals work), warns once for each certificate that entered the window
and once more when it expires, and keeps the counts for ``status`` and
``/metrics``.  Memory: O(M).

The policy for an expired certificate in the store: it is still served (a
client then says "certificate expired", which points at the cause, where the
default certificate would only say "wrong name"), with a WARNING when it is
loaded and in this scan.  Renew it, or delete it to serve the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from certagent.errors import AgentError
from certagent.store.base import Store

__all__ = ["ExpiryWatch"]

log = logging.getLogger(__name__)

SCAN_INTERVAL = 3600.0
#: One line per certificate: not held back as a repeat of the same warning.
EACH = {"each": True}
_PAGE = 500


@dataclass
class ExpiryCounts:
    expiring: int = 0  # within the window, expired ones included
    expired: int = 0
    soonest: float | None = None  # Unix time of the earliest notAfter within the window
    scans: int = 0
    scanned_at: float | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class ExpiryWatch:
    def __init__(
        self,
        store: Store,
        window_days: float = 21.0,
        *,
        interval: float = SCAN_INTERVAL,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.store = store
        self.window = timedelta(days=window_days)
        self.interval = interval
        self.counts = ExpiryCounts()
        self._now = now
        self._warned: dict[str, str] = {}  # id -> "expiring" | "expired"

    def status(self) -> dict[str, object]:
        return {"window_days": self.window.days, **vars(self.counts)}

    async def scan(self) -> None:
        """List what expires within the window; warn for what is new in it."""
        now = self._now()
        counts = ExpiryCounts(scans=self.counts.scans + 1, scanned_at=now.timestamp())
        seen: dict[str, str] = {}
        cursor: str | None = None
        while True:
            page = await self.store.list(
                expiring_before=now + self.window, cursor=cursor, limit=_PAGE
            )
            for record in page.records:
                stage = "expired" if record.not_after <= now else "expiring"
                seen[record.id] = stage
                counts.expiring += 1
                counts.expired += stage == "expired"
                at = record.not_after.timestamp()
                counts.soonest = at if counts.soonest is None else min(counts.soonest, at)
                if self._warned.get(record.id) == stage:
                    continue
                names = " ".join(record.names)
                if stage == "expired":
                    log.warning(
                        "certificate %s for %s expired on %s; it is still served where loaded:"
                        " renew it, or delete it to serve the fallback",
                        record.id,
                        names,
                        record.not_after.isoformat(),
                        extra=EACH,
                    )
                else:
                    days = (record.not_after - now).total_seconds() / 86400
                    log.warning(
                        "certificate %s for %s expires in %.1f days (%s): renew it",
                        record.id,
                        names,
                        days,
                        record.not_after.isoformat(),
                        extra=EACH,
                    )
            cursor = page.cursor
            if cursor is None:
                break
        self._warned = seen  # renewed or deleted ones leave; they warn again if they return
        self.counts = counts

    async def run(self, stop: asyncio.Event) -> None:
        """Scan now and then every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.scan()
            except AgentError as exc:
                log.warning("expiry scan failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
