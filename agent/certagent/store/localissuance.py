"""The issuance roles of one node, kept in memory: nothing to share, nothing to lock.

The directory store (:mod:`certagent.store.directory`) serves one node: its leases,
challenges, acknowledgements, heartbeats and limits live here, in the agent's
memory, and are gone when it restarts (an order in flight is then simply placed
again).  :class:`MemoryAccounts` and :class:`MemoryDomains` keep the account and the
registrations in memory too, for tests (``tests/memstore.py`` composes every class
here); the directory store keeps those two on disk instead.

The semantics are the Redis store's (:mod:`certagent.store.redis`): fencing
tokens that only grow, ``add_issued`` refused with LeaseLost unless the lease is
still current, entries that lapse at their expiry.  Time is ``clock()``, Unix
seconds, injected (``time.time`` by default).  Writes that every node must see
(a challenge published or withdrawn, a name registered or not) are handed to
``emit`` as a :class:`~certagent.store.base.Change`.  Every call is O(1) unless
its docstring says otherwise.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from certagent.certs.pem import CertBundle
from certagent.store.issuance import (
    ACME_MANAGED,
    AcmeAccount,
    Lease,
    NameState,
    PublishedChallenge,
    Registration,
)
from certagent.store.issuing import (
    ACK_SECONDS,
    HOLD_SECONDS,
    MAX_PAGE,
    STATE_LAPSE,
    check_account,
    check_challenge,
    check_name,
    check_node,
    check_time,
    check_token,
    check_ttl,
    clean_error,
    lease_lost,
    lease_value,
)
from certagent.store.localrenewals import LocalRenewals
from certagent.store.renewals import DueRenewal
from certagent.store.renewing import check_entry
from certagent.store.values import CertRecord, Change

__all__ = [
    "Adder",
    "Clock",
    "Emit",
    "LocalBoard",
    "LocalLimits",
    "LocalLocks",
    "MemoryAccounts",
    "MemoryDomains",
]

#: Unix seconds now.
Clock = Callable[[], float]
#: Hands a change to the store's change feed.
Emit = Callable[[Change], None]
#: The store's add, keeping ``managed``: ``await add(bundle, managed)``.
Adder = Callable[[CertBundle, str], Awaitable[CertRecord]]


class LocalLocks:
    """:class:`~certagent.store.issuance.IssueLocks` of one node.

    Tokens are at least the clock in milliseconds and grow by one at least per
    lease, so they keep growing across restarts.  ``renewals``: the schedule
    ``add_issued(..., renew_at=...)`` writes to.
    """

    def __init__(
        self, add: Adder, clock: Clock = time.time, renewals: LocalRenewals | None = None
    ) -> None:
        self._add = add
        self._clock = clock
        self._renewals = renewals
        self._held: dict[str, Lease] = {}
        self._fence = 0

    def _current(self, name: str) -> Lease | None:
        lease = self._held.get(name)
        if lease is not None and lease.expires_at <= self._clock():
            del self._held[name]
            return None
        return lease

    def _ours(self, lease: Lease) -> Lease | None:
        current = self._current(check_name(lease.name))
        if current is None or lease_value(current) != lease_value(lease):
            return None
        return current

    async def acquire(self, name: str, node: str, ttl: float) -> Lease | None:
        name, node, ttl = check_name(name), check_node(node), check_ttl(ttl)
        if self._current(name) is not None:
            return None
        now = self._clock()
        self._fence = max(self._fence + 1, int(now * 1000))
        lease = Lease(name, node, self._fence, now + ttl)
        self._held[name] = lease
        return lease

    async def renew(self, lease: Lease, ttl: float) -> Lease | None:
        ttl = check_ttl(ttl)
        if self._ours(lease) is None:
            return None
        renewed = dataclasses.replace(lease, expires_at=self._clock() + ttl)
        self._held[renewed.name] = renewed
        return renewed

    async def release(self, lease: Lease) -> None:
        if self._ours(lease) is not None:
            del self._held[lease.name]

    async def add_issued(
        self,
        bundle: CertBundle,
        lease: Lease,
        *,
        managed: str = ACME_MANAGED,
        renew_at: float | None = None,
    ) -> CertRecord:
        """The store's add, if ``lease`` is current; it is made to last the write out first.

        With ``renew_at``, ``lease.name`` is scheduled once the record is written
        (one node: nothing can take the lease in between).
        """
        entry: DueRenewal | None = None
        if renew_at is not None:
            if self._renewals is None:
                raise ValueError("this store keeps no renewal schedule")
            entry = check_entry(lease.name, renew_at, bundle.not_after.timestamp())
        current = self._ours(lease)
        if current is None:
            held = self._current(check_name(lease.name))
            raise lease_lost(lease, None if held is None else lease_value(held))
        hold = self._clock() + HOLD_SECONDS
        if current.expires_at < hold:
            self._held[current.name] = dataclasses.replace(current, expires_at=hold)
        record = await self._add(bundle, managed)
        if entry is not None and self._renewals is not None:
            await self._renewals.put(entry)
        return record


class LocalBoard:
    """:class:`~certagent.store.issuance.ChallengeBoard` of one node."""

    def __init__(self, emit: Emit, clock: Clock = time.time) -> None:
        self._emit = emit
        self._clock = clock
        self._challenges: dict[str, PublishedChallenge] = {}
        self._acks: dict[str, tuple[set[str], float]] = {}
        self._beats: dict[str, float] = {}

    async def publish(self, challenge: PublishedChallenge) -> None:
        """Store ``challenge`` and emit its change; ValueError if it expired already."""
        challenge = check_challenge(challenge)
        if challenge.expires_at <= self._clock():
            raise ValueError(f"challenge {challenge.token} expired already")
        self._challenges[challenge.token] = challenge
        self._emit(Change("challenge", challenge.token, (challenge.name,)))

    async def withdraw(self, token: str) -> None:
        gone = self._challenges.pop(check_token(token), None)
        self._acks.pop(token, None)
        if gone is not None:
            self._emit(Change("challenge", token, (gone.name,)))

    async def get(self, token: str) -> PublishedChallenge | None:
        challenge = self._challenges.get(check_token(token))
        if challenge is not None and challenge.expires_at <= self._clock():
            del self._challenges[token]  # lapsed: dropped lazily, as in Redis
            return None
        return challenge

    async def current(self) -> tuple[PublishedChallenge, ...]:
        """Every live challenge by token: O(challenges)."""
        now = self._clock()
        for token in [t for t, c in self._challenges.items() if c.expires_at <= now]:
            del self._challenges[token]
        return tuple(c for _, c in sorted(self._challenges.items()))

    async def ack(self, token: str, node: str) -> None:
        token, node = check_token(token), check_node(node)
        nodes, _ = self._acks.get(token, (set(), 0.0))
        nodes.add(node)
        self._acks[token] = (nodes, self._clock() + ACK_SECONDS)

    async def acks(self, token: str) -> frozenset[str]:
        nodes, until = self._acks.get(check_token(token), (set(), 0.0))
        return frozenset(nodes) if until > self._clock() else frozenset()

    async def beat(self, node: str, ttl: float) -> None:
        self._beats[check_node(node)] = self._clock() + check_ttl(ttl)

    async def live_nodes(self) -> frozenset[str]:
        """Nodes whose beat has not lapsed: O(nodes)."""
        now = self._clock()
        for node in [n for n, until in self._beats.items() if until <= now]:
            del self._beats[node]
        return frozenset(self._beats)


class LocalLimits:
    """:class:`~certagent.store.issuance.IssueLimits` of one node."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._states: dict[str, tuple[NameState, float]] = {}
        self._paused = 0.0
        self._slots: dict[str, float] = {}

    async def name_state(self, name: str) -> NameState | None:
        name = check_name(name)
        state, lapse = self._states.get(name, (None, 0.0))
        if state is not None and lapse <= self._clock():
            del self._states[name]
            return None
        return state

    async def record_failure(self, name: str, error: str, not_before: float) -> NameState:
        """The state lapses :data:`~certagent.store.issuing.STATE_LAPSE` s after ``not_before``."""
        not_before = check_time(not_before, "not_before")
        before = await self.name_state(name)
        state = NameState(
            failures=1 if before is None else before.failures + 1,
            not_before=not_before,
            last_error=clean_error(error),
        )
        self._states[check_name(name)] = (state, max(not_before, self._clock()) + STATE_LAPSE)
        return state

    async def clear_failures(self, name: str) -> None:
        self._states.pop(check_name(name), None)

    async def paused_until(self) -> float:
        return self._paused if self._paused > self._clock() else 0.0

    async def pause(self, until: float) -> None:
        self._paused = max(self._paused, check_time(until, "until"))

    async def take_order_slot(self, name: str, cap: int, ttl: float) -> bool:
        """Dead holders' slots are dropped first: O(slots)."""
        name, ttl = check_name(name), check_ttl(ttl)
        now = self._clock()
        for held in [n for n, until in self._slots.items() if until <= now]:
            del self._slots[held]
        if name not in self._slots and len(self._slots) >= cap:
            return False
        self._slots[name] = now + ttl
        return True

    async def free_order_slot(self, name: str) -> None:
        self._slots.pop(check_name(name), None)


class MemoryAccounts:
    """:class:`~certagent.store.issuance.AccountStore` in memory (tests)."""

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._accounts: dict[str, AcmeAccount] = {}

    async def load_account(self, directory: str) -> AcmeAccount | None:
        return self._accounts.get(directory)

    async def save_account(self, account: AcmeAccount, *, previous_url: str | None) -> AcmeAccount:
        """Compare-and-set on the URL; with no account stored, any ``previous_url`` creates it."""
        check_account(account)
        stored = self._accounts.get(account.directory)
        if stored is not None and stored.url != previous_url:
            return stored
        saved = dataclasses.replace(
            account, updated_at=datetime.fromtimestamp(int(self._clock()), UTC)
        )
        self._accounts[account.directory] = saved
        return saved


class MemoryDomains:
    """:class:`~certagent.store.issuance.DomainRegistry` in memory (tests)."""

    def __init__(self, emit: Emit, clock: Clock = time.time) -> None:
        self._emit = emit
        self._clock = clock
        self._registered: dict[str, Registration] = {}
        self._sorted: list[str] = []

    async def register(self, name: str, *, issue: bool = False) -> Registration:
        name = check_name(name)
        before = self._registered.get(name)
        if before is None:
            added = datetime.fromtimestamp(int(self._clock()), UTC)
            bisect.insort(self._sorted, name)
        else:
            added = before.added_at
        registration = Registration(name, added, issue)
        self._registered[name] = registration
        self._emit(Change("domain", name, (name,)))
        return registration

    async def unregister(self, name: str) -> bool:
        name = check_name(name)
        if self._registered.pop(name, None) is None:
            return False
        del self._sorted[bisect.bisect_left(self._sorted, name)]
        self._emit(Change("domain", name, (name,)))
        return True

    async def registration(self, name: str) -> Registration | None:
        return self._registered.get(check_name(name))

    async def registrations(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[Registration, ...]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        start = 0 if after is None else bisect.bisect_right(self._sorted, after)
        names = self._sorted[start : start + min(limit, MAX_PAGE)]
        return tuple(self._registered[n] for n in names)
