"""Renewal: every ACME-managed certificate renews itself before expiry, once per fleet.

Renewal is paced by work, not by a clock.  Each node asks the store's schedule for
what is due (:meth:`~certagent.store.renewals.Renewals.due`: one range read,
O(due), never a scan) and starts renewals, most urgent first (earliest expiry),
up to ``renew_concurrency`` at once on this node; whenever one ends, the schedule
is read again and the freed place filled at once, so a node renews as fast as its
renewals complete.  Only when nothing is due (or nothing more can start) does it
wait: until the next entry comes due when the read (which looks ``renew_tick``
ahead) saw one, ``renew_tick`` seconds at most; at rest that read is the only store
command per tick.  When renewals are late (a due entry waited past a tenth of its margin
to expiry, a minute at most), the node raises its concurrency to the fleet's
order slots (``acme_concurrency``): the pace rises to the budget, which is shared
by every node that renews (the fleet's open-order cap, its issuance budget with
renewals before new names, a CA's ``Retry-After``).  :meth:`Renewer.status` and
the metrics show the backlog (names due), this node's pace (renewals a second
over the last five minutes) and the time to clear the backlog at that pace.

For each name started:

1. the name's issuance lease is taken (the lease on-demand issuance takes too);
   a name whose lease another node holds is left to it (and not tried again
   here for a few seconds);
2. the schedule is read again under the lease: another node may have renewed it
   meanwhile (its new entry is then later);
3. the permission policy is asked: a name that is now denied is taken off the
   schedule (a WARNING says so; its certificate is served until it expires); a
   transient denial (the ask endpoint down) postpones it;
4. where the CA's directory offers ``renewalInfo`` (RFC 9773), the CA's window
   decides: a moment in it still ahead moves the entry there (or to when ARI
   should be asked again, if sooner);
5. :meth:`~certagent.service.issuer.Issuer.order` orders under the lease, with
   the same account, challenges, fencing, fleet pause and budget as a first
   connection, and stores the certificate with its next renewal time.  The change
   feed brings it to every node's loaded slot (:mod:`certagent.service.live`: a
   ``set``/``commit`` into the same slot, no reload).

A failed renewal is retried with exponential backoff, never planned past expiry
minus a margin, and on until the certificate expires (:mod:`.renewtime`); the
retry floor, the backoff cap (the issuer's too), the margin and the issuance
lease scale with the certificate's remaining lifetime
(:meth:`~certagent.service.renewtime.RenewPolicy.scaled`), so a certificate
living minutes renews like one living days.  Every failure is one WARNING with
the time left.  While the CA asked the fleet to wait (a 429's ``Retry-After``)
no renewal starts: a read with due entries then costs one more read (the pause).

Cost: 1 store command per ``renew_tick`` at rest; with D due entries, O(D)
commands (about a dozen per renewal) plus one schedule read per renewal ended.
Memory: O(renewals running + failing names + renewals in the pace window).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cryptography import x509

from certagent.acme import AcmeError, cert_id
from certagent.config import Settings
from certagent.errors import AgentError, NotFound
from certagent.service.issuer import Issuer, Outcome
from certagent.service.metrics import LatencyHistogram
from certagent.service.renewtime import RenewPolicy, Scaled, cert_rng
from certagent.store.base import StoredCertificate, Writer
from certagent.store.issuance import Lease
from certagent.store.renewals import DueRenewal, Renewals

__all__ = ["Renewer", "RenewerSettings", "renewer_settings"]

log = logging.getLogger(__name__)

#: Buckets (s) of the time from an entry's renewal time to its renewed certificate.
RENEW_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)
#: Overdue names listed by ``status``, at most.
OVERDUE_LISTED = 20
#: A name whose lease another node held (or whose renewal met a store error) is not
#: tried again here for this long (s).
ELSEWHERE_HOLD = 5.0
#: The pace is measured over this window (s).
PACE_WINDOW = 300.0
#: A due entry is late once it waited this share of its margin (expiry - renewal time) ...
LATE_SHARE = 0.1
#: ... or this long (s), whichever is less.
LATE_AFTER = 60.0
#: A renewal waiting for a fleet order slot is looked at again after this (s), at least.
WAIT_FLOOR = 1.0
#: The loop never wakes sooner than this (s) for an entry coming due.
WAKE_FLOOR = 0.05


@dataclass(frozen=True)
class RenewerSettings:
    tick: float = 1.0  # seconds between reads of the schedule when nothing is due
    batch: int = 100  # due entries read at once, at most
    concurrency: int = 4  # renewals running on this node at once
    late_concurrency: int = 10  # ... when renewals are late (the fleet's order slots)
    overdue_grace: float = 3600.0  # an entry this long past its time counts as overdue
    policy: RenewPolicy = field(default_factory=RenewPolicy)


def renewer_settings(settings: Settings) -> RenewerSettings:
    """The ``renew_*`` settings (and ``acme_concurrency``, the pace's ceiling when late)."""
    return RenewerSettings(
        tick=settings.renew_tick,
        batch=settings.renew_batch,
        concurrency=settings.renew_concurrency,
        late_concurrency=max(settings.renew_concurrency, settings.acme_concurrency),
        overdue_grace=settings.renew_overdue_grace,
        policy=RenewPolicy(
            jitter=settings.renew_jitter,
            ari_min=settings.renew_ari_min,
            ari_max=settings.renew_ari_max,
            retry_min=settings.renew_retry_min,
            retry_max=settings.renew_retry_max,
            margin=settings.renew_margin,
        ),
    )


@dataclass
class RenewerCounters:
    ticks: int = 0
    due_seen: int = 0  # due entries read, over all ticks
    started: int = 0  # renewals this node took the lease for
    done: int = 0
    failed: int = 0
    postponed: int = 0  # waited (pause, backoff, budget, slots, transient denial)
    ari_checks: int = 0
    ari_moved: int = 0  # ARI windows that moved an entry instead of renewing now
    unscheduled: int = 0  # names taken off the schedule (denied, or no certificate left)
    elsewhere: int = 0  # due names whose lease another node held
    late_reads: int = 0  # schedule reads that found renewals late (concurrency raised)


@dataclass(frozen=True)
class Failing:
    """A name whose renewal failed here, last time: for status and the expiry alarms."""

    failures: int
    not_after: float
    reason: str
    retry_at: float


class Renewer:
    """The renewal loop of one node (module docstring)."""

    def __init__(
        self,
        issuer: Issuer,
        renewals: Renewals,
        settings: RenewerSettings,
        *,
        writer: Writer | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.issuer = issuer
        self.renewals = renewals
        self.writer = writer  # deletes the records a renewal replaced; None: kept
        self.settings = settings
        self.counters = RenewerCounters()
        self.renew_seconds = LatencyHistogram(RENEW_BUCKETS)  # renewal time -> renewed
        self.failing: dict[str, Failing] = {}
        self._clock = clock
        self._rand = rand
        self._running: dict[str, asyncio.Task[None]] = {}
        self._elsewhere: dict[str, float] = {}  # name -> not tried here before (clock)
        self._freed = asyncio.Event()  # a renewal ended: its place can be filled
        self._busy = False  # the last read left due entries unstarted for want of room
        self._late = False  # the last read found renewals late
        self._renewed: deque[float] = deque()  # when renewals ended well, PACE_WINDOW back
        self._next_due: float | None = None  # the next entry due within a tick (last read)
        self._began = clock()

    @property
    def policy(self) -> RenewPolicy:
        return self.settings.policy

    # --- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fill free places with due renewals until ``stop`` (module docstring).

        After a read that started everything it could, the loop waits for a renewal
        to end (its place is then filled at once), the next entry to come due, or
        ``tick`` seconds, whichever comes first; store errors are logged and the read
        retried after ``tick``.
        """
        while not stop.is_set():
            self._freed.clear()
            try:
                await self.tick()
            except AgentError as exc:
                log.warning(
                    "reading the renewal schedule: %s; trying again in %g s",
                    exc,
                    self.settings.tick,
                )
                self._busy = False
                self._next_due = None
            await self._wait(stop, self._idle_wait())

    def _idle_wait(self) -> float:
        """``tick``, or less when the last read saw an entry come due within it."""
        if self._next_due is None:
            return self.settings.tick
        return min(self.settings.tick, max(WAKE_FLOOR, self._next_due - self._clock()))

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        """Until ``stop``, a renewal ends (when one is running), or ``timeout``."""
        waiters = [asyncio.ensure_future(stop.wait())]
        if self._running:
            waiters.append(asyncio.ensure_future(self._freed.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    @property
    def concurrency(self) -> int:
        """Renewals this node runs at once now: more while renewals are late."""
        s = self.settings
        return s.late_concurrency if self._late else s.concurrency

    async def tick(self) -> int:
        """Read what is due and start renewing it; returns how many renewals were started.

        One store command when nothing is due; one more (the fleet's pause) when
        something is.  Due entries start most urgent first (earliest expiry); the
        renewals run on after this returns.
        """
        self.counters.ticks += 1
        now = self._clock()
        if self.settings.concurrency - len(self._running) <= 0 and not self._late:
            self._busy = True
            self._next_due = None
            return 0
        # one read also looks a tick ahead: the loop then wakes when the next entry is due
        read = await self.renewals.due(now + self.settings.tick, self.settings.batch)
        due = [entry for entry in read if entry.renew_at <= now]
        ahead = [entry.renew_at for entry in read if entry.renew_at > now]
        self._next_due = min(ahead) if ahead else None
        self.counters.due_seen += len(due)
        self._late = any(_late(entry, now) for entry in due)
        self.counters.late_reads += self._late
        room = self.concurrency - len(self._running)
        self._busy = False
        if not due or room <= 0:
            self._busy = bool(due)
            return 0
        if await self.issuer.issuance.limits.paused_until() > now:
            return 0  # the CA asked the fleet to wait: the entries stay due
        self._elsewhere = {n: t for n, t in self._elsewhere.items() if t > now}
        started = 0
        for entry in sorted(due, key=_urgency):
            if entry.name in self._running or entry.name in self._elsewhere:
                continue
            if started >= room:
                self._busy = True
                break
            task = asyncio.create_task(self._renew_quietly(entry), name=f"renew {entry.name}")
            self._running[entry.name] = task
            task.add_done_callback(self._ended)
            started += 1
        return started

    def _ended(self, task: asyncio.Task[None]) -> None:
        name = task.get_name().removeprefix("renew ")
        if self._running.get(name) is task:
            del self._running[name]
        self._freed.set()

    async def wait_idle(self) -> None:
        """Until the renewals started so far have ended (tests, shutdown)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    # --- one renewal -------------------------------------------------------------------------

    async def _renew_quietly(self, entry: DueRenewal) -> None:
        try:
            await self.renew(entry)
        except AgentError as exc:
            # the store failed somewhere: the entry stays due, tried again after a pause
            self._elsewhere[entry.name] = self._clock() + ELSEWHERE_HOLD
            log.warning(
                "renewing %s: %s; trying again in %.0f s at the earliest",
                entry.name,
                exc,
                ELSEWHERE_HOLD,
            )

    async def renew(self, entry: DueRenewal) -> None:
        """Renew ``entry``'s name if this node gets its lease (module docstring, 1-5)."""
        issuer, name = self.issuer, entry.name
        scaled = self.policy.scaled(self._clock(), entry.not_after, issuer.settings.lease_seconds)
        lease = await issuer.issuance.locks.acquire(name, issuer.node, scaled.lease)
        if lease is None:
            self.counters.elsewhere += 1
            self._elsewhere[name] = self._clock() + ELSEWHERE_HOLD
            return
        try:
            current = await self.renewals.entry(name)
            now = self._clock()
            if current is None or current.renew_at > now:
                return  # renewed (or dropped) elsewhere since the tick read it
            self.counters.started += 1
            await self._renew_held(current, lease, now, scaled)
        finally:
            await issuer.issuance.locks.release(lease)

    async def _renew_held(
        self, entry: DueRenewal, lease: Lease, now: float, scaled: Scaled
    ) -> None:
        name = entry.name
        found = await self.issuer.reader.lookup_all(name)
        if not found:
            await self._unschedule(name, "the store has no certificate for it any more")
            return
        current = found[0]
        not_after = current.bundle.not_after.timestamp()
        decision = await self.issuer.permission.decide(name)
        if not decision.allowed:
            if decision.transient:
                await self._postpone(entry, now + scaled.retry_min, decision.reason)
                return
            await self._unschedule(
                name,
                f"the permission policy denies it now ({decision.reason or 'no policy allows it'});"
                f" its certificate is served until {current.bundle.not_after.isoformat()}",
            )
            return
        replaces = None
        ari = await self._ari(current, now)
        if ari is not None:
            renew_at, check_at, replaces = ari
            if renew_at > now:
                self.counters.ari_moved += 1
                await self.renewals.schedule(name, min(renew_at, check_at), not_after)
                return
        ordered = await self.issuer.order(
            name,
            lease,
            renewal=True,
            replaces=replaces,
            ttl=scaled.lease,
            backoff_cap=scaled.retry_max,
        )
        done = self._clock()
        if ordered.outcome is Outcome.ISSUED:
            self.counters.done += 1
            self._renewed.append(done)
            self.renew_seconds.observe(max(0.0, done - entry.renew_at))
            if self.failing.pop(name, None) is not None:
                log.info("renewal of %s succeeded after failures", name)
            await self._retire(name, found)
            return
        if ordered.outcome is Outcome.WAITING:
            await self._postpone(
                entry, max(ordered.retry_at, done + WAIT_FLOOR), ordered.detail or ordered.reason
            )
            return
        self.counters.failed += 1
        retry_at = self.policy.retry_at(done, ordered.failures, not_after, self._rand())
        retry_at = max(retry_at, ordered.retry_at)  # the issuer's own backoff, a 429's pause
        await self.renewals.schedule(name, retry_at, not_after)
        self.failing[name] = Failing(ordered.failures, not_after, ordered.reason, retry_at)
        log.warning(
            "renewal of %s failing (%d in a row, %s: %s); it expires in %s (%s);"
            " next attempt in %.0f s",
            name,
            ordered.failures,
            ordered.reason,
            ordered.detail,
            _span(not_after - done),
            current.bundle.not_after.isoformat(),
            retry_at - done,
        )

    async def _retire(self, name: str, replaced: tuple[StoredCertificate, ...]) -> None:
        """Delete the records a renewal replaced: those for ``name`` alone, of a renewed kind.

        Whatever their expiry (a renewal may bring a shorter lifetime): the renewed
        certificate is the one to serve.  The new record's ``put`` is ahead of these
        ``delete`` changes in the feed, so every node has moved its slot to the new
        certificate when the delete arrives (it unloads nothing).  A record holding
        other names too stays until it expires.
        """
        if self.writer is None:
            return
        old_ids = {s.id for s in replaced}
        renewed_kinds = {
            _kind(stored)
            for stored in await self.issuer.reader.lookup_all(name)
            if stored.id not in old_ids
        }
        for old in replaced:
            if old.bundle.names != (name,) or _kind(old) not in renewed_kinds:
                continue
            with contextlib.suppress(NotFound):
                await self.writer.delete(old.id)
                log.info("renewed %s: deleted the certificate it replaced, %s", name, old.id)

    async def _ari(self, current: StoredCertificate, now: float) -> tuple[float, float, str] | None:
        """(renew at, ask again at, ARI id) from the CA's renewalInfo; None without ARI.

        A CA that offers ARI but cannot answer now: the default moment decides
        (renew if it has come), and ARI is asked again at its default interval.
        """
        try:
            client = await self.issuer.accounts.client()
            if (await client.directory()).renewal_info is None:
                return None
        except AgentError as exc:
            log.info("renewing %s: cannot read the CA's directory (%s)", current.bundle.names, exc)
            return None
        leaf = x509.load_pem_x509_certificate(current.bundle.pem)
        rng = cert_rng(f"{current.bundle.serial:X}")
        try:
            ident = cert_id(leaf)
            self.counters.ari_checks += 1
            info = await client.renewal_info(ident)
        except AcmeError as exc:
            log.info("renewalInfo for %s: %s; using the default renewal time", current.id, exc)
            default = self.policy.default_at(
                current.bundle.not_before.timestamp(), current.bundle.not_after.timestamp(), rng
            )
            return default, self.policy.ari_check_at(now, None), ""
        if info is None:
            return None
        at = self.policy.ari_at(info.start.timestamp(), info.end.timestamp(), now, rng)
        return at, self.policy.ari_check_at(now, info.retry_after), ident

    async def _postpone(self, entry: DueRenewal, at: float, why: str) -> None:
        self.counters.postponed += 1
        log.info(
            "renewal of %s postponed %.0f s: %s", entry.name, max(0.0, at - self._clock()), why
        )
        await self.renewals.schedule(entry.name, at, entry.not_after)

    async def _unschedule(self, name: str, why: str) -> None:
        self.counters.unscheduled += 1
        self.failing.pop(name, None)
        await self.renewals.unschedule(name)
        log.warning("not renewing %s any more: %s", name, why)

    # --- status ------------------------------------------------------------------------------

    def pace(self) -> float:
        """Renewals this node completed a second, over the last ``PACE_WINDOW`` seconds."""
        now = self._clock()
        while self._renewed and self._renewed[0] < now - PACE_WINDOW:
            self._renewed.popleft()
        window = min(PACE_WINDOW, max(1.0, now - self._began))
        return len(self._renewed) / window

    async def status(self, fleet: tuple[float, int] | None = None) -> dict[str, object]:
        """Schedule counts (two O(log M) store reads), the pace, failing and overdue names.

        ``backlog`` is the fleet's due names; ``pace`` this node's renewals a second
        (last five minutes); ``clear_seconds`` the backlog over that pace (None when
        nothing is renewing here), an upper bound when other nodes renew too.
        ``fleet``: (renewals a second, renewing nodes) of the whole fleet, from its
        board (:meth:`~certagent.service.fleet.Presence.fleet_pace`): adds
        ``fleet_pace``, ``fleet_renewing_nodes`` and ``fleet_clear_seconds``.
        """
        now = self._clock()
        grace = self.settings.overdue_grace
        scheduled, due = await self.renewals.count(now)
        _, overdue = await self.renewals.count(now - grace)
        listed = await self.renewals.due(now - grace, OVERDUE_LISTED) if overdue else []
        pace = self.pace()
        extra: dict[str, object] = {}
        if fleet is not None:
            extra = {
                "fleet_pace": round(fleet[0], 6),
                "fleet_renewing_nodes": fleet[1],
                "fleet_clear_seconds": _clear(due, fleet[0]),
            }
        clear = _clear(due, pace)
        return {
            "scheduled": scheduled,
            "due": due,
            "backlog": due,
            "pace": round(pace, 6),
            "clear_seconds": clear,
            "late": self._late,
            "concurrency": self.concurrency,
            "overdue": overdue,
            "overdue_names": [
                {
                    "name": e.name,
                    "renew_at": _iso(e.renew_at),
                    "expires": _iso(e.not_after) if e.not_after else None,
                }
                for e in listed
            ],
            "failing": len(self.failing),
            "failing_names": {
                name: {
                    "failures": f.failures,
                    "reason": f.reason,
                    "expires": _iso(f.not_after),
                    "next_attempt": _iso(f.retry_at),
                }
                for name, f in sorted(self.failing.items())[:OVERDUE_LISTED]
            },
            "running": len(self._running),
            "running_names": sorted(self._running)[:OVERDUE_LISTED],
            **vars(self.counters),
            "renew_seconds": self.renew_seconds.snapshot(),
            "tick_seconds": self.settings.tick,
            **extra,
        }

    def failing_for(self, name: str) -> Failing | None:
        """This node's last failure renewing ``name`` (for the expiry alarms), or None."""
        return self.failing.get(name)

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)


def _clear(backlog: int, pace: float) -> float | None:
    """Seconds to clear ``backlog`` at ``pace`` a second; None without a pace."""
    if not backlog:
        return 0.0
    return round(backlog / pace, 1) if pace > 0 else None


def _urgency(entry: DueRenewal) -> tuple[float, float]:
    """Earliest expiry first (unknown expiry last), then earliest renewal time."""
    return (entry.not_after if entry.not_after > 0 else math.inf, entry.renew_at)


def _late(entry: DueRenewal, now: float) -> bool:
    """Whether ``entry`` waited past a tenth of its margin to expiry (a minute at most)."""
    margin = entry.not_after - entry.renew_at if entry.not_after > 0 else math.inf
    return now - entry.renew_at > min(LATE_AFTER, LATE_SHARE * max(0.0, margin))


def _span(seconds: float) -> str:
    """``3.2 days``, ``4.5 hours``, ``95 s``; negative: ``expired 95 s ago``."""
    if seconds < 0:
        return f"expired {_span(-seconds)} ago"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:.0f} s"


def _kind(stored: StoredCertificate) -> str:
    """ECDSA or RSA (the key kinds a name may hold one each of)."""
    return stored.bundle.key_type.split("-", 1)[0]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
