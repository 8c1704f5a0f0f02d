"""Certificates on demand: one ACME order per name across the fleet.

:meth:`Issuer.first_connection` is asked by the ensure path for a name the store
has no certificate for.  The name must pass the permission policy
(:mod:`certagent.service.permission`); then one issuance runs per name on this
agent (later connections join it), and across the fleet the store's lease makes
sure one agent orders while the others wait for its result through the change
feed.  The connection waits at most ``acme_wait`` seconds; past that it gets the
fallback and the issuance goes on, so a later connection gets the certificate.

One issuance (:meth:`Issuer._issue`), on the agent that holds the name's lease:

1. the fleet's pause (a CA ``Retry-After``) and the name's backoff are respected:
   no CA request before they end;
2. the store is asked again (another agent may have finished meanwhile);
3. one of the fleet's ``acme_concurrency`` order slots is taken (waiting for one),
   then one unit of the fleet's issuance budget (:mod:`certagent.service.budget`);
   a refusal frees the slot, so no unit is spent without an order placed;
4. the order runs (:func:`certagent.acme.obtain_certificate`, challenges through
   :class:`~certagent.service.challenges.FleetSolver`), one per key type, with a
   new key each, the lease renewed meanwhile (a lost lease cancels the order);
   each key type after the first spends its own budget unit just before its
   order: when the budget refuses it, the kinds already issued stay stored and
   served, and the name's renewal entry is moved to the end of the budget's wait,
   when the renewer orders the name again (all its kinds);
5. the certificate is validated like an upload and stored through the store's
   write path, fenced by the lease (``add_issued``), marked ``acme``.

A failure backs the name off for the whole fleet (exponential, from
``acme_backoff_min`` to ``acme_backoff_max``), a 429 pauses the whole fleet for
the CA's ``Retry-After``, and each failure is one WARNING line saying what the CA
answered and when the next attempt may happen.

Cost per first connection of an unknown name: the permission check (cached), one
store read for the backoff, then awaiting the order; per order a fixed number of
store writes and CA requests.  Nothing grows with the number of certificates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Protocol

from certagent.acme import (
    AccountDoesNotExist,
    AcmeClient,
    AcmeError,
    CaUnavailable,
    ChallengeSolver,
    RateLimited,
    obtain_certificate,
)
from certagent.acme.csr import CertKeyType
from certagent.certs.pem import CertBundle
from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.errors import AgentError, DuplicateCertificate
from certagent.service.acmeaccount import AccountKeeper
from certagent.service.metrics import LatencyHistogram
from certagent.service.orderfailure import backoff_delay, failure_reason
from certagent.service.permission import Permission
from certagent.service.renewtime import RenewPolicy, cert_rng
from certagent.store.base import Reader
from certagent.store.issuance import Issuance, Lease

log = logging.getLogger(__name__)

#: How often a waiting issuance asks for one of the fleet's order slots.
SLOT_POLL = 0.25
#: Buckets (s) of the wait from a name's first connection to its certificate.
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 30.0, 60.0)


class FirstConnection(StrEnum):
    """What :meth:`Issuer.first_connection` found for the connection that asked."""

    ISSUED = "issued"  # the store has a certificate for the name now: load it
    DENIED = "denied"  # no policy allows it: never reaches the CA
    PENDING = "pending"  # allowed, but no certificate within the wait (backing off, CA slow)


class Budget(Protocol):
    """The fleet's issuance budget: 0.0 when ``name`` may be ordered now, else seconds to wait.

    A unit is taken when 0.0 is returned; renewals take precedence over new names
    when the budget is short (:mod:`certagent.service.budget`).
    """

    async def take(self, name: str, *, renewal: bool) -> float: ...


class NoBudget:
    """No limit: every order may start at once."""

    async def take(self, name: str, *, renewal: bool) -> float:
        return 0.0


class Outcome(StrEnum):
    """What :meth:`Issuer.order` did."""

    ISSUED = "issued"  # stored (and scheduled for renewal)
    FAILED = "failed"  # the CA or the store refused; the name backs off (``retry_at``)
    WAITING = "waiting"  # not ordered: paused, backing off, over budget or no order slot;
    # or, with several key types, over budget after the first kind(s) were issued and stored


@dataclass(frozen=True)
class Ordered:
    """The result of one :meth:`Issuer.order`.

    ``retry_at``: for FAILED and WAITING, the earliest moment another try makes
    sense (Unix seconds).  ``failures``: the name's failures in a row (FAILED).
    ``reason``: a short label (``failure_reason`` or why it waits);
    ``detail``: what the CA or the store said.
    """

    outcome: Outcome
    retry_at: float = 0.0
    failures: int = 0
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True)
class IssuerSettings:
    key_types: tuple[CertKeyType, ...] = ("ecdsa",)
    profile: str | None = None
    concurrency: int = 10  # open orders in the whole fleet, at most
    order_timeout: float = 60.0  # one order, from newOrder to the certificate
    backoff_min: float = 10.0
    backoff_max: float = 3600.0
    policy: UploadPolicy = field(default_factory=UploadPolicy)
    renew: RenewPolicy = field(default_factory=RenewPolicy)

    @property
    def lease_seconds(self) -> float:
        """A lease outlives one order's timeout; it is renewed every third of it."""
        return self.order_timeout + 15.0


@dataclass
class IssuerCounters:
    orders_started: int = 0
    orders_valid: int = 0
    orders_failed: int = 0
    renewals_started: int = 0  # of orders_started, those for a renewal
    budget_waits: int = 0  # orders held back by the issuance budget
    waited_elsewhere: int = 0  # first connections whose name another agent was issuing
    fallbacks: int = 0  # first connections that got the fallback (pending past the wait)
    failed_by_reason: Counter[str] = field(default_factory=Counter)


class Issuer:
    """The issuance of this agent (see the module docstring)."""

    def __init__(
        self,
        issuance: Issuance,
        reader: Reader,
        permission: Permission,
        accounts: AccountKeeper,
        solver: ChallengeSolver,
        node: str,
        settings: IssuerSettings,
        *,
        budget: Budget | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.issuance = issuance
        self.budget: Budget = budget if budget is not None else NoBudget()
        self.reader = reader
        self.permission = permission
        self.accounts = accounts
        self.solver = solver
        self.node = node
        self.settings = settings
        self.counters = IssuerCounters()
        self.wait_seconds = LatencyHistogram(WAIT_BUCKETS)  # first connection -> stored
        self._clock = clock
        self._rand = rand
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stored: dict[str, asyncio.Event] = {}
        self._elsewhere: set[str] = set()  # names whose lease another agent held at our try
        self._local = asyncio.Semaphore(settings.concurrency)

    # --- asked by the ensure path --------------------------------------------------------

    async def first_connection(self, name: str, wait: float) -> FirstConnection:
        """A connection for validated ``name`` (no certificate in the store) waits here.

        At most ``wait`` seconds; the issuance it started goes on afterwards.
        StoreError if the store cannot be asked.
        """
        started = time.monotonic()
        decision = await self.permission.decide(name)
        if not decision.allowed:
            log.info("not issuing %s: %s", name, decision.reason or "no policy allows it")
            return FirstConnection.DENIED
        stored = self._stored.setdefault(name, asyncio.Event())
        task = self.request(name)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, wait - (time.monotonic() - started))):
                # this agent's issuance ends first, unless another agent issues the name:
                # then its certificate arrives through the feed
                waiting: list[asyncio.Future[object]] = [
                    asyncio.ensure_future(stored.wait()),
                    asyncio.shield(task),  # cancelling the shield leaves the issuance running
                ]
                try:
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for future in waiting:
                        future.cancel()
                if not stored.is_set() and name in self._elsewhere:
                    self.counters.waited_elsewhere += 1
                    await stored.wait()
        if stored.is_set() or await self.reader.lookup_all(name):
            self.wait_seconds.observe(time.monotonic() - started)
            return FirstConnection.ISSUED
        self.counters.fallbacks += 1
        return FirstConnection.PENDING

    def request(self, name: str) -> asyncio.Task[None]:
        """Start issuing ``name`` (already allowed) unless this agent already is."""
        task = self._tasks.get(name)
        if task is None:
            task = asyncio.create_task(self._run(name), name=f"issue {name}")
            self._tasks[name] = task
            task.add_done_callback(lambda _t: self._tasks.pop(name, None))
        return task

    def stored(self, names: Iterable[str]) -> None:
        """The store has a new certificate for ``names`` (the change feed): wake waiters."""
        for name in names:
            event = self._stored.get(name)
            if event is not None:
                event.set()

    # --- one issuance ----------------------------------------------------------------------

    async def _run(self, name: str) -> None:
        try:
            await self._issue(name)
        except AgentError as exc:
            log.warning("issuing %s: %s", name, exc)
        finally:
            # waiters of a name nobody is issuing any more are let go; the event
            # stays only while someone may still set it
            event = self._stored.get(name)
            if event is not None and event.is_set():
                self._stored.pop(name, None)

    async def _issue(self, name: str) -> None:
        """One on-demand issuance of ``name`` (module docstring), if nothing holds it back."""
        now = self._clock()
        paused = await self.issuance.limits.paused_until()
        if paused > now:
            log.info("not ordering %s: the CA asked to wait %.0f s more", name, paused - now)
            return
        state = await self.issuance.limits.name_state(name)
        if state is not None and state.not_before > now:
            log.info(
                "not ordering %s: %d failure(s), next attempt in %.0f s (last: %s)",
                name,
                state.failures,
                state.not_before - now,
                state.last_error,
            )
            return
        locks = self.issuance.locks
        lease = await locks.acquire(name, self.node, self.settings.lease_seconds)
        if lease is None:
            self._elsewhere.add(name)
            return
        self._elsewhere.discard(name)
        try:
            if await self.reader.lookup_all(name):
                self.stored((name,))
                return
            ordered = await self.order(name, lease, renewal=False)
            if ordered.outcome is Outcome.WAITING:
                log.info(
                    "not ordering %s now (%s): next attempt in %.0f s at the earliest",
                    name,
                    ordered.detail or ordered.reason,
                    max(0.0, ordered.retry_at - self._clock()),
                )
        finally:
            await locks.release(lease)

    # --- one order, for a first connection or a renewal -------------------------------------

    async def order(
        self,
        name: str,
        lease: Lease,
        *,
        renewal: bool,
        replaces: str | None = None,
        ttl: float | None = None,
        backoff_cap: float | None = None,
    ) -> Ordered:
        """Order ``name``'s certificate(s) under ``lease`` and store them, scheduled for renewal.

        The caller holds ``lease`` (and releases it).  Nothing reaches the CA while
        the fleet is paused (a CA ``Retry-After``), the name backs off after a
        failure, none of the fleet's order slots frees up while the lease lasts, or
        the budget says wait: those come back WAITING with the moment to try again.
        The slot is taken before the budget is asked (a unit is spent only for an
        order placed) and freed once on every path.  One budget unit per order: with
        several key types, a refusal after the first kind(s) keeps what was stored
        and comes back WAITING too (the name's renewal entry moved to ``retry_at``).
        ``replaces``: the ARI id of the certificate a renewal replaces (RFC 9773 §5).
        ``ttl``: the lease's TTL if not the settings' (a renewal scales it to the
        certificate's remaining lifetime, :meth:`RenewPolicy.scaled`); the order keeps
        renewing the lease every third of it.  A failure is recorded (the name backs
        off, at most ``backoff_cap`` when given; a 429 pauses the fleet for as long
        as the CA says) and comes back FAILED.  StoreError if the store cannot be asked.
        """
        ttl = self.settings.lease_seconds if ttl is None else ttl
        limits = self.issuance.limits
        now = self._clock()
        paused = await limits.paused_until()
        if paused > now:
            return Ordered(Outcome.WAITING, paused, reason="paused", detail="the CA asked to wait")
        state = await limits.name_state(name)
        if state is not None and state.not_before > now:
            return Ordered(
                Outcome.WAITING,
                state.not_before,
                state.failures,
                reason="backoff",
                detail=f"{state.failures} failure(s) in a row, last: {state.last_error}",
            )
        async with self._local:
            # freed in every case, also when the take itself was cancelled midway: a
            # no-op when none was taken (the slot is the name's, and we hold its lease)
            try:
                if not await self._take_slot(name, lease, ttl):
                    return Ordered(
                        Outcome.WAITING,
                        self._clock() + SLOT_POLL,
                        reason="slots",
                        detail=f"the fleet's {self.settings.concurrency} order slots stayed busy",
                    )
                wait = await self.budget.take(name, renewal=renewal)
                if wait > 0:
                    return self._over_budget(wait, "")
                return await self._order(
                    name, lease, ttl, renewal=renewal, replaces=replaces, backoff_cap=backoff_cap
                )
            finally:
                await limits.free_order_slot(name)

    def _over_budget(self, wait: float, issued: str) -> Ordered:
        """WAITING for the budget; ``issued``: the kinds stored before it refused, if any."""
        self.counters.budget_waits += 1
        detail = f"the fleet's issuance budget is spent for {wait:.0f} s"
        if issued:
            detail = f"{issued} issued, then {detail}; the other kinds are ordered then"
        return Ordered(Outcome.WAITING, self._clock() + wait, reason="budget", detail=detail)

    async def _take_slot(self, name: str, lease: Lease, ttl: float) -> bool:
        """One of the fleet's order slots, waiting for one while the lease lasts.

        The wait ends with enough of the lease left for the order's keeper to renew
        it (at a third of ``ttl``): 15 s of waiting with the default lease.
        """
        deadline = lease.expires_at - max(ttl * 2 / 3, ttl - 15.0)
        while self._clock() < deadline:
            if await self.issuance.limits.take_order_slot(name, self.settings.concurrency, ttl):
                return True
            await asyncio.sleep(SLOT_POLL)
        log.warning(
            "not ordering %s: the fleet's %d order slots stayed busy",
            name,
            self.settings.concurrency,
        )
        return False

    async def _order(
        self,
        name: str,
        lease: Lease,
        ttl: float,
        *,
        renewal: bool,
        replaces: str | None,
        backoff_cap: float | None,
    ) -> Ordered:
        """Order, store and announce ``name``'s certificate(s); record a failure if any."""
        self.counters.orders_started += 1
        self.counters.renewals_started += renewal
        work = asyncio.create_task(self._obtain_and_store(name, lease, renewal, replaces))
        keeper = asyncio.create_task(self._keep(lease, work, ttl))
        try:
            await work
        except (AgentError, TimeoutError) as exc:
            return await self._failed(name, exc, backoff_cap)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        self.counters.orders_valid += 1
        await self.issuance.limits.clear_failures(name)
        self.stored((name,))
        short = work.result()
        if short is not None:
            wait, issued, not_after = short
            ordered = self._over_budget(wait, issued)
            # then the renewer orders the name again, all its kinds (the new ones replace these)
            await self.issuance.renewals.schedule(name, ordered.retry_at, not_after)
            return ordered
        return Ordered(Outcome.ISSUED)

    async def _keep(self, lease: Lease, work: asyncio.Task[object], ttl: float) -> None:
        """Renew ``lease`` every third of its life (``ttl``); cancel ``work`` if it is lost."""
        while not work.done():
            await asyncio.sleep(ttl / 3)
            try:
                renewed = await self.issuance.locks.renew(lease, ttl)
            except AgentError as exc:
                log.warning("renewing the lease on %s: %s", lease.name, exc)
                continue
            if renewed is None:
                log.warning("lost the lease on %s; stopping its order", lease.name)
                work.cancel()
                return

    async def renew_at(self, bundle: CertBundle, client: AcmeClient) -> float:
        """When ``bundle`` should be renewed: its default moment, or sooner to ask ARI.

        Where the CA offers renewalInfo, the entry comes due when ARI should first be
        asked (``renew_ari_max`` at most), and the renewer follows the CA's window.
        """
        policy = self.settings.renew
        at = policy.default_at(
            bundle.not_before.timestamp(),
            bundle.not_after.timestamp(),
            cert_rng(f"{bundle.serial:X}"),
        )
        if (await client.directory()).renewal_info is not None:
            at = min(at, policy.ari_check_at(self._clock(), None))
        return at

    async def _obtain_and_store(
        self, name: str, lease: Lease, renewal: bool, replaces: str | None
    ) -> tuple[float, str, float] | None:
        """One order per key type; None, or (budget wait, kinds issued, their not_after).

        The first kind's budget unit was taken by :meth:`order`; each further kind
        takes its own just before its order, and a refusal ends the loop there.
        """
        client = await self.accounts.client()
        issued_kinds: list[str] = []
        not_after = 0.0
        for index, key_type in enumerate(self.settings.key_types):
            if index > 0:
                wait = await self.budget.take(name, renewal=renewal)
                if wait > 0:
                    return wait, "+".join(issued_kinds), not_after
            issued_kinds.append(key_type)
            try:
                issued = await obtain_certificate(
                    client,
                    [name],
                    self.solver,
                    key_type=key_type,
                    profile=self.settings.profile,
                    replaces=replaces,
                    timeout=self.settings.order_timeout,
                )
            except AccountDoesNotExist:
                client = await self.accounts.lost(client)
                issued = await obtain_certificate(
                    client,
                    [name],
                    self.solver,
                    key_type=key_type,
                    profile=self.settings.profile,
                    replaces=replaces,
                    timeout=self.settings.order_timeout,
                )
            bundle = validate_upload(
                issued.chain_pem,
                issued.key_pem,
                now=datetime.fromtimestamp(self._clock(), UTC),
                policy=self.settings.policy,
            )
            renew_at = await self.renew_at(bundle, client)
            not_after = max(not_after, bundle.not_after.timestamp())
            try:
                record = await self.issuance.locks.add_issued(bundle, lease, renew_at=renew_at)
            except DuplicateCertificate:
                continue
            log.info(
                "issued %s: certificate %s (%s, serial %s, until %s, renewal at %s) from %s",
                name,
                record.id,
                record.key_type,
                record.serial,
                record.not_after.isoformat(),
                datetime.fromtimestamp(renew_at, UTC).isoformat(timespec="seconds"),
                issued.order_url,
            )
        return None

    async def _failed(
        self, name: str, exc: BaseException, backoff_cap: float | None = None
    ) -> Ordered:
        self.counters.orders_failed += 1
        reason = failure_reason(exc)
        self.counters.failed_by_reason[reason] += 1
        now = self._clock()
        state = await self.issuance.limits.name_state(name)
        failures = (state.failures if state is not None else 0) + 1
        high = self.settings.backoff_max if backoff_cap is None else backoff_cap
        high = min(self.settings.backoff_max, high)
        low = min(self.settings.backoff_min, high)
        delay = backoff_delay(failures, low, high, self._rand())
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(exc, RateLimited | CaUnavailable) and retry_after is not None:
            delay = max(delay, float(retry_after))
        if isinstance(exc, RateLimited):
            until = now + (float(retry_after) if retry_after is not None else delay)
            await self.issuance.limits.pause(until)
        what = str(exc) if isinstance(exc, AcmeError | AgentError) else type(exc).__name__
        await self.issuance.limits.record_failure(name, f"{reason}: {what}"[:500], now + delay)
        log.warning(
            "ordering a certificate for %s failed (%s): %s; failure %d in a row, next attempt"
            " in %.0f s at the earliest",
            name,
            reason,
            what,
            failures,
            delay,
        )
        return Ordered(Outcome.FAILED, now + delay, failures, reason, what)

    # --- status and shutdown ----------------------------------------------------------------

    def pending(self) -> int:
        return len(self._tasks)

    def status(self) -> dict[str, object]:
        counters = self.counters
        return {
            "pending": self.pending(),
            "orders_started": counters.orders_started,
            "orders_valid": counters.orders_valid,
            "orders_failed": counters.orders_failed,
            "renewals_started": counters.renewals_started,
            "budget_waits": counters.budget_waits,
            "failed_by_reason": dict(counters.failed_by_reason),
            "waited_elsewhere": counters.waited_elsewhere,
            "fallbacks": counters.fallbacks,
            "wait_seconds": self.wait_seconds.snapshot(),
            "account": self.accounts.status(),
            "permission": {
                "policies": self.permission.describe(),
                **vars(self.permission.counters),
                "cached": self.permission.cached(),
            },
        }

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.accounts.close()
        await self.permission.close()
