"""Expiry: a WARNING for each stored certificate entering the warning window, and counts.

Once an hour (and at start) the agent lists the stored certificates whose
notAfter falls within ``expiry_warning_days`` (the store's expiry index: Redis
ZRANGEBYSCORE, O(log N + M) for M certificates in the window, which is about 0
when renewals work), warns once for each certificate that entered the window
and once more when it expires, and keeps the counts for ``status`` and
``/metrics``.  Memory: O(M).

ACME-managed certificates (``managed == "acme"``) renew themselves: one inside the
window is not warned about while its renewal has not yet come (a 6-day certificate
is always inside a 21-day window).  The warning fires from the renewal's own
horizon instead: when this node's last renewal of it failed ("renewal of X failing
(...), expires in 9.0 days") or when its renewal time (the default moment,
:mod:`~certagent.service.renewtime`) has passed and it is still the one stored.

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
from typing import Protocol

from certagent.errors import AgentError
from certagent.service.renewtime import RenewPolicy, cert_rng
from certagent.store.base import CertRecord, Store
from certagent.store.issuance import ACME_MANAGED

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
    renewing: int = 0  # ACME-managed ones within the window whose renewal has not yet come
    renewal_late: int = 0  # ACME-managed ones whose renewal is failing or late


class RenewalFailure(Protocol):
    """What the renewer knows of a name's failing renewal (``failures``, ``reason``)."""

    @property
    def failures(self) -> int: ...

    @property
    def reason(self) -> str: ...


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
        renewal: Callable[[str], RenewalFailure | None] | None = None,
        renew_policy: RenewPolicy | None = None,
    ) -> None:
        self.store = store
        self.renewal = renewal
        self.renew_policy = renew_policy
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
                late = self._renewal_late(record, now) if stage == "expiring" else None
                if late == "":
                    counts.renewing += 1
                    continue  # renews itself; its renewal has not yet come
                counts.renewal_late += late is not None
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
                elif late is not None:
                    days = (record.not_after - now).total_seconds() / 86400
                    log.warning(
                        "renewal of %s %s; certificate %s expires in %.1f days (%s)",
                        names,
                        late,
                        record.id,
                        days,
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

    def _renewal_late(self, record: CertRecord, now: datetime) -> str | None:
        """For an ACME-managed ``record``: "" while its renewal has not come, else what is wrong.

        None for a record the agent does not renew (uploaded, or renewal off).
        """
        if record.managed != ACME_MANAGED or self.renew_policy is None:
            return None
        for name in record.names:
            failing = self.renewal(name) if self.renewal is not None else None
            if failing is not None:
                return f"failing ({failing.failures} in a row, {failing.reason})"
        due = self.renew_policy.default_at(
            record.not_before.timestamp(), record.not_after.timestamp(), cert_rng(record.serial)
        )
        if due > now.timestamp():
            return ""
        since = datetime.fromtimestamp(due, UTC).isoformat(timespec="seconds")
        return f"is late (due since {since}; see 'certagent status')"

    async def run(self, stop: asyncio.Event) -> None:
        """Scan now and then every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.scan()
            except AgentError as exc:
                log.warning("expiry scan failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
