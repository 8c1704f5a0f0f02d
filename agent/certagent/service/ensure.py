"""The ensure path: SNI in, "is HAProxy able to serve it now?" out.

validate -> asked by the worker the loader talks to? (else: a reload?) -> loaded
already? (then its mark expired, or HAProxy was reloaded) -> negative cache ->
name filter (certainly not in the store?) -> covered by a loaded wildcard? ->
single flight per name -> lookup budget (while the name filter is not ready,
:data:`~certagent.service.flood.UNFILTERED_RATE` as well) -> store lookup ->
slot load (waits at most ``hold``) -> answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from certagent.certs import hostname
from certagent.config import DualCerts
from certagent.errors import AgentError, Busy, InvalidHostname
from certagent.runtime.loader import Loader
from certagent.service.flood import UNFILTERED_RATE, LookupBudget, UnknownNames
from certagent.service.issuer import FirstConnection, Issuer
from certagent.service.metrics import LatencyHistogram
from certagent.service.namefilter import NameFilter
from certagent.store.base import Store, StoredCertificate

log = logging.getLogger(__name__)


#: Names the filter turns away that are looked up anyway, per second (writes not yet seen).
RECHECKS = 10.0


class Outcome(StrEnum):
    """What the Lua action is told; anything but OK means "use the fallback"."""

    OK = "ok"
    UNKNOWN = "unknown"  # not in the store
    BUSY = "busy"  # could not start loading before the deadline
    INVALID = "invalid"  # not a hostname
    ERROR = "error"  # store or HAProxy failed


@dataclass
class EnsureCounters:
    requests: int = 0
    hits: int = 0
    loaded: int = 0
    unknown: int = 0
    negative_hits: int = 0
    busy: int = 0
    invalid: int = 0
    errors: int = 0
    store_lookups: int = 0
    reloads: int = 0  # HAProxy reloads or restarts noticed
    filtered: int = 0  # turned away by the name filter (certainly not in the store)
    wildcard_hits: int = 0  # covered by a wildcard already loaded: no lookup
    over_budget: int = 0  # admitted, but over the store-lookup budget: busy
    issued: int = 0  # served with a certificate issued on this first connection
    busy_by_reason: dict[str, int] = field(default_factory=dict)  # Busy.reason -> count

    def note_busy(self, reason: str) -> None:
        self.busy += 1
        self.busy_by_reason[reason] = self.busy_by_reason.get(reason, 0) + 1


class NegativeCache:
    """Names known to be absent from the store, for ``ttl`` seconds; at most ``size`` names."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, name: str) -> bool:
        until = self._until.get(name)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[name]
            return False
        return True

    def add(self, name: str) -> None:
        if self.ttl <= 0 or self.size <= 0:
            return
        self._until[name] = self._clock() + self.ttl
        self._until.move_to_end(name)
        while len(self._until) > self.size:
            self._until.popitem(last=False)

    def discard(self, name: str) -> None:
        self._until.pop(name, None)

    def clear(self) -> None:
        self._until.clear()

    def __len__(self) -> int:
        return len(self._until)


def choose_kinds(
    found: tuple[StoredCertificate, ...], dual_certs: DualCerts
) -> tuple[StoredCertificate, ...]:
    """The certificates to load for a name, after the ``dual_certs`` policy.

    One per key kind (ECDSA, RSA), the best of ``found`` (best first): while a
    renewed certificate and the one it replaces are both stored, the renewed one
    (its later notAfter) is loaded, and the live path swaps it into the slot.
    ``both`` loads every kind found and lets HAProxy choose per client;
    ``ecdsa`` or ``rsa`` keeps that kind when the name has it (a name with only
    the other kind still gets it).  HAProxy 2.6.12's choice is documented in
    docs/haproxy.md (dual certificates).
    """
    best: dict[str, StoredCertificate] = {}
    for cert in found:
        best.setdefault(cert.bundle.key_type.split("-", 1)[0], cert)
    one_each = tuple(best.values())
    if dual_certs is DualCerts.BOTH or len(one_each) < 2:
        return one_each
    prefix = "ECDSA" if dual_certs is DualCerts.ECDSA else "RSA"
    kept = tuple(c for c in one_each if c.bundle.key_type.startswith(prefix))
    return kept or one_each


def _warn_expired(name: str, found: tuple[StoredCertificate, ...]) -> None:
    """The policy for an expired certificate in the store: served, with a WARNING."""
    now = datetime.now(UTC)
    for cert in found:
        if cert.bundle.not_after <= now:
            log.warning(
                "serving %s with certificate %s, which expired on %s: renew it, or delete it"
                " to serve the fallback",
                name,
                cert.id,
                cert.bundle.not_after.isoformat(),
            )


class Ensurer:
    """Answers the Lua action's ``ensure <host> <pid>``: is HAProxy able to serve it now?

    Per request: O(1) work and at most one store lookup and one load (shared by
    every request for the same name that arrives meanwhile).
    """

    def __init__(
        self,
        store: Store,
        loader: Loader,
        negative: NegativeCache,
        *,
        hold: float,
        dual_certs: DualCerts = DualCerts.BOTH,
        on_reload: Callable[[list[str]], None] | None = None,
        on_loaded: Callable[[str, tuple[StoredCertificate, ...]], None] | None = None,
        names: NameFilter | None = None,
        budget: LookupBudget | None = None,
        max_hosts_per_wildcard: int = 10_000,
        issuer: Issuer | None = None,
        issue_wait: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        #: on-demand issuance for names the store lacks (None: they get "unknown")
        self.issuer = issuer
        self.issue_wait = issue_wait
        self.loader = loader
        self.negative = negative
        self.hold = hold
        self.dual_certs = dual_certs
        self.on_reload = on_reload
        #: told about every host loaded (OCSP fetching): host, its certificates
        self.on_loaded = on_loaded
        self.names = names
        self.budget = budget
        self.max_hosts_per_wildcard = max_hosts_per_wildcard
        self.unknown = UnknownNames(clock=clock)
        self._recheck = LookupBudget(RECHECKS, RECHECKS, clock=clock)
        #: store lookups while the name filter is not ready
        self.unfiltered = LookupBudget(UNFILTERED_RATE, UNFILTERED_RATE, clock=clock)
        self.counters = EnsureCounters()
        self.load_seconds = LatencyHistogram()
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[Outcome]] = {}
        self._switching: asyncio.Task[bool] | None = None

    async def ensure(self, raw: str | bytes, pid: int | None = None) -> Outcome:
        """The outcome for SNI ``raw`` asked by HAProxy worker ``pid`` (None: unknown)."""
        self.counters.requests += 1
        started = self._clock()
        try:
            name = hostname.normalise(raw)
        except InvalidHostname:
            self.counters.invalid += 1
            return Outcome.INVALID
        outcome = await self._ensure(name, pid, started)
        if outcome is Outcome.OK:
            # this client is now on its way to its handshake: its slot is not recycled
            # before its connection counts (runtime.usage), coalesced clients included
            self.loader.pool.note_asked(name, self._clock())
        return outcome

    async def _ensure(self, name: str, pid: int | None, started: float) -> Outcome:
        # Every connection of a reloaded HAProxy reaches the newest worker's fe_tls
        # (the hop's socket moves to it), so loads always go to the newest worker.
        identity = self.loader.identity
        if pid is not None and (identity is None or identity.pid != pid):
            await self._follow_newest_worker()
        # HAProxy asks only for hosts not marked loaded.  For a host in a slot, either
        # the mark expired or was purged (the certificate is still there), or HAProxy
        # was reloaded and the request comes from a worker that is stopping: ask.
        if (
            self.loader.pool.is_marked(name)
            and not await self._follow_newest_worker()
            and await self._remark(name)
        ):
            self.counters.hits += 1
            return Outcome.OK
        if name in self.negative:
            self.counters.negative_hits += 1
            return Outcome.UNKNOWN
        absent = (
            self.names is not None
            and not self.names.may_hold(name)
            and not self._recheck.take()
        )
        if absent and self.issuer is None:
            # Not in the store as far as the filter knows (neither the name nor its
            # wildcard): no lookup.  A few such names a second are looked up anyway
            # (``RECHECKS``): one written a moment ago by another process reaches the
            # filter only through the change feed.  Not negative-cached: once the feed
            # adds it, the very next ask passes.  (With issuance on, such a name goes
            # to the permission policy instead: :meth:`_load`.)
            self.counters.filtered += 1
            self.counters.unknown += 1
            self.unknown.note(name, looked_up=False)
            return Outcome.UNKNOWN
        if not absent:
            covered = await self._covered_by_loaded_wildcard(name)
            if covered is not None:
                return covered
        pending = self._inflight.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._inflight[name] = future
        try:
            outcome = await self._load(name, started, absent=absent)
        except BaseException:
            future.set_result(Outcome.ERROR)
            raise
        finally:
            del self._inflight[name]
        future.set_result(outcome)
        return outcome

    async def _covered_by_loaded_wildcard(self, name: str) -> Outcome | None:
        """OK at once for a name the store holds only as a wildcard that is already loaded.

        The certificate in HAProxy already covers it, so no lookup and no load; the
        host is marked (its next connections skip the agent) unless its wildcard
        already has ``max_hosts_per_wildcard`` marked hosts, which bounds what a
        flood of random subdomains can add to HAProxy's table.
        """
        if self.names is None or not self.names.ready or self.names.exact(name):
            return None
        wildcard = hostname.wildcard_for(name)
        slot = self.loader.pool.for_wildcard(wildcard) if wildcard else None
        if slot is None:
            return None
        self.counters.wildcard_hits += 1
        parent = name.partition(".")[2]
        if len(self.loader.pool.hosts_covered_by("*." + parent)) >= self.max_hosts_per_wildcard:
            return Outcome.OK
        try:
            await self.loader.mark_covered(name, slot, self.hold)
        except AgentError as exc:
            log.warning("marking %s (covered by %s) failed: %s", name, wildcard, exc)
        return Outcome.OK

    async def _remark(self, name: str) -> bool:
        try:
            return await self.loader.remark(name, self.hold)
        except AgentError as exc:
            log.warning("marking %s loaded again failed: %s", name, exc)
            return False

    async def _follow_newest_worker(self) -> bool:
        """Make the loader talk to the worker that serves new connections; True if it moved.

        One fresh ``show info`` (``still_current``) however many requests ask at
        once.  After a reload the loader moves to the new worker and the old
        worker's hosts are re-warmed there.
        """
        if self._switching is None:
            task = asyncio.create_task(self._switch(), name="haproxy-switch")
            task.add_done_callback(self._switched)
            self._switching = task
        return await asyncio.shield(self._switching)

    def _switched(self, task: asyncio.Task[bool]) -> None:
        if self._switching is task:
            self._switching = None

    async def _switch(self) -> bool:
        identity = self.loader.identity
        try:
            if identity is None:
                await self.loader.sync()
                return True
            if await self.loader.still_current():
                return False
            hosts = await self.loader.switch_worker(f"HAProxy pid {identity.pid} was replaced")
        except AgentError as exc:
            log.warning("cannot reach the HAProxy worker serving new connections: %s", exc)
            return False
        self.counters.reloads += 1
        if self.on_reload is not None:
            self.on_reload(hosts)
        return True

    async def _issued(self, name: str, started: float) -> tuple[StoredCertificate, ...]:
        """Certificates the issuer got for ``name`` within ``issue_wait``; () if not allowed.

        Busy (the fallback) when the name is allowed but no certificate came in time.
        """
        assert self.issuer is not None
        wait = min(self.issue_wait, self.hold - (self._clock() - started))
        result = await self.issuer.first_connection(name, wait)
        if result == FirstConnection.DENIED:
            return ()
        if result == FirstConnection.PENDING:
            raise Busy(
                f"no certificate for {name} within {wait:.1f}s; its issuance goes on", "issuing"
            )
        self.counters.store_lookups += 1
        found = choose_kinds(await self.store.lookup_all(name), self.dual_certs)
        if not found:
            raise Busy(f"{name} was issued but the store does not return it yet", "issuing")
        self.counters.issued += 1
        return found

    async def _load(self, name: str, started: float, *, absent: bool = False) -> Outcome:
        """Look ``name`` up and load it; ``absent``: the name filter says the store lacks it.

        With issuance on, a name the store lacks goes to the issuer, which waits
        at most ``issue_wait`` for a certificate (then the fallback: ``busy``).
        """
        if (
            not absent
            and self.names is not None
            and not self.names.ready
            and not self.unfiltered.take()
        ):
            # No filter yet (at start, or rebuilding): a flood would reach the store.
            # Counted, not logged per name: the fallback until the filter is ready.
            self.counters.over_budget += 1
            self.counters.note_busy("filter")
            return Outcome.BUSY
        try:
            found: tuple[StoredCertificate, ...] = ()
            if not absent:
                if self.budget is not None and not self.budget.take():
                    self.counters.over_budget += 1
                    raise Busy(
                        f"store lookups over {self.budget.rate:.0f}/s; {name} not looked up",
                        "lookups",
                    )
                self.counters.store_lookups += 1
                found = choose_kinds(await self.store.lookup_all(name), self.dual_certs)
            if not found and self.issuer is not None:
                found = await self._issued(name, started)
            if not found:
                self.negative.add(name)
                self.counters.unknown += 1
                self.unknown.note(name, looked_up=not absent)
                return Outcome.UNKNOWN
            left = self.hold - (self._clock() - started)
            if left <= 0:
                raise Busy(f"the store lookup of {name} took the whole hold ({self.hold:.1f}s)")
            slots = await self.loader.install(name, found, left)
        except Busy as exc:
            self.counters.note_busy(exc.reason)
            log.warning("busy (%s): %s", exc.reason, exc)
            return Outcome.BUSY
        except AgentError as exc:
            self.counters.errors += 1
            log.error("loading %s failed: %s", name, exc)
            return Outcome.ERROR
        self.counters.loaded += 1
        self.load_seconds.observe(self._clock() - started)
        if self.on_loaded is not None:
            self.on_loaded(name, found)
        _warn_expired(name, found)
        log.info(
            "serving %s from %s (certificate %s)",
            name,
            " ".join(s.name for s in slots),
            " ".join(c.id for c in found),
        )
        return Outcome.OK
