"""The renewal schedule at a thousand certificates in real Redis (issue 20, must show 3).

1,000 certificates issued in one burst (a busy minute of sign-ups, 10-hour
lifetimes) get their renewal times from the default rule (half the lifetime,
±5 % jitter): spread over an hour.  A renewer then ticks once per simulated
second through that hour against the real Redis store, with the real issuer
(a fake CA stands in for the ACME exchange).  Measured per tick with Redis's own
command counts (``INFO commandstats``, which count each command inside scripts and
MULTI blocks; INFO itself and connection handshakes left out): the tick's reads
(one ``due`` range read at rest; one more, the fleet's pause, when something is
due), and the commands of the renewals it started, per renewal.  The renewal
moments are printed as a histogram.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from certagent.acme import ChallengeSolver, IssuedCertificate
from certagent.certs.pem import parse_bundle
from certagent.service import issuer as issuer_module
from certagent.service.acmeaccount import AccountKeeper, AccountSettings
from certagent.service.issuer import Issuer, IssuerSettings
from certagent.service.permission import Permission
from certagent.service.renewer import Renewer, RenewerSettings
from certagent.service.renewtime import RenewPolicy, cert_rng
from certagent.testing import RedisFixture
from certagent.testing.certs import issue, make_ca, shared_key

pytestmark = pytest.mark.integration

COUNT = 1000
LIFETIME = 10 * 3600.0  # under 10 days: renewal at half of it, ±5 % of it = ± 30 min
BUCKET = 300.0  # the histogram's bars: 5 minutes
#: Redis commands one renewal may take, as Redis counts them (each command inside a
#: script or a MULTI counted; 67 measured: lease, schedule,
#: lookups, pause, backoff, order slot, the fenced write, the replaced record's
#: delete): a constant, whatever the number of scheduled entries
PER_RENEWAL = 100


class SimClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Directory:
    renewal_info: str | None = None


class NoAriClient:
    """The account keeper's client: registered at once, a directory without ARI."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.account_url = "https://ca/acct/1"
        self.account_key = None

    async def register(self, **kwargs: object) -> object:
        return type("Account", (), {"url": self.account_url})()

    async def directory(self) -> Directory:
        return Directory()

    async def close(self) -> None:
        return None


class FakeCa:
    """Records when (simulated) each name was renewed; issues a certificate valid from now.

    The renewed certificates live twice as long, so their next renewal falls
    after the simulated hour.  (The issuer and the store keep real time: leases
    expire in it; only the renewer's clock, which says what is due, is simulated.)
    """

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self.ca = make_ca()
        self.renewed_at: dict[str, float] = {}

    async def obtain(
        self, client: object, names: Sequence[str], solver: object, **kwargs: Any
    ) -> IssuedCertificate:
        self.renewed_at[names[0]] = self.clock.now
        start = dt.datetime.now(dt.UTC).replace(microsecond=0)
        chain, key = issue(
            self.ca,
            names[0],
            key=shared_key(),
            not_before=start,
            not_after=start + dt.timedelta(seconds=2 * LIFETIME),
        )
        return IssuedCertificate(tuple(names), "ecdsa", chain, key, "https://ca/order/1")


#: Not the store's work: INFO (this measurement), a new connection's handshake, health checks
NOT_COUNTED = ("cmdstat_info", "cmdstat_client|setinfo", "cmdstat_hello", "cmdstat_ping",
               "cmdstat_select", "cmdstat_client|setname")  # fmt: skip


def commands(client: redis.Redis) -> int:
    """Commands Redis has executed so far for the store (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in NOT_COUNTED)


@pytest.mark.timeout(240)  # 27 s on an idle machine; a busy one doubles or triples it
def test_a_thousand_scheduled_renewals_read_only_what_is_due_and_spread_out(
    redis_store: RedisFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_run(redis_store, monkeypatch))


async def _run(redis_store: RedisFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    store = redis_store.open()
    issuance = store.issuance()
    assert issuance is not None
    policy = RenewPolicy(jitter=0.05)
    burst = dt.datetime.now(dt.UTC).replace(microsecond=0)
    names = [f"n{i:04d}.sched.test" for i in range(COUNT)]

    # --- 1,000 certificates issued in the same minute, scheduled by the default rule ---
    ca = FakeCa(SimClock(burst.timestamp()))
    gate = asyncio.Semaphore(32)

    async def add(name: str) -> float:
        chain, key = issue(
            ca.ca,
            name,
            key=shared_key(),
            not_before=burst,
            not_after=burst + dt.timedelta(seconds=LIFETIME),
        )
        bundle = parse_bundle(chain, key)
        renew_at = policy.default_at(
            burst.timestamp(), burst.timestamp() + LIFETIME, cert_rng(f"{bundle.serial:X}")
        )
        async with gate:
            lease = await issuance.locks.acquire(name, "setup", 30)
            assert lease is not None
            await issuance.locks.add_issued(bundle, lease, renew_at=renew_at)
            await issuance.locks.release(lease)
        return renew_at

    started = time.monotonic()
    planned = dict(zip(names, await asyncio.gather(*(add(n) for n in names)), strict=True))
    print(f"\n{COUNT} certificates stored and scheduled in {time.monotonic() - started:.1f} s")
    first, last = min(planned.values()), max(planned.values())
    assert last - first <= 3600 and last - first > 3000  # spread over (nearly) an hour

    # --- a renewer ticking once per simulated second through that hour ---
    clock = SimClock(first - 5)
    ca.clock = clock
    monkeypatch.setattr(issuer_module, "obtain_certificate", ca.obtain)
    accounts = AccountKeeper(
        AccountSettings("https://ca/dir"),
        issuance.accounts,
        issuance.locks,
        "node-1",
        client_factory=NoAriClient,  # type: ignore[arg-type]
    )
    solver: ChallengeSolver = type("Solver", (), {"challenge_types": ("http-01",)})()
    issuer = Issuer(
        issuance,
        store,
        Permission(suffixes=("sched.test",)),
        accounts,
        solver,
        "node-1",
        IssuerSettings(order_timeout=5, renew=policy),
    )
    renewer = Renewer(
        issuer,
        issuance.renewals,
        RenewerSettings(tick=1.0, batch=100, concurrency=16, policy=policy),
        writer=store,
        clock=clock,
    )
    await accounts.client()  # the account, once, before measuring
    counter = redis.Redis.from_url(redis_store.url)
    baseline = commands(counter)
    baseline = commands(counter) - baseline  # 0: INFO is not counted
    times = sorted(planned.values())
    tick_reads: Counter[int] = Counter()  # commands of tick() itself -> ticks measured
    per_renewal: list[float] = []
    due_per_tick: Counter[int] = Counter()
    worst = (0, 0)  # (commands, due) of the tick with the most due
    started = time.monotonic()
    ticks = 0
    while clock.now <= last + 2:
        # due by the plan and not renewed yet: what tick() may read, at most
        expected_due = bisect.bisect_right(times, clock.now) - len(ca.renewed_at)
        measured = expected_due > 0 or ticks % 20 == 0  # idle ticks: every 20th measured
        before = commands(counter) if measured else 0
        due_before = renewer.counters.due_seen
        renewals = await renewer.tick()
        after_tick = commands(counter) if measured else 0
        await renewer.wait_idle()
        due = renewer.counters.due_seen - due_before
        due_per_tick[due] += 1
        assert due <= max(0, expected_due)  # never more than what is due
        if measured:
            after = commands(counter)
            reads = after_tick - before - baseline
            tick_reads[reads] += 1
            assert reads == (1 if due == 0 else 2), (reads, due)  # due read (+ the pause)
            if renewals:
                spent = after - after_tick - baseline
                if not per_renewal:  # the first also loads the store's scripts, once
                    print(f"first renewal: {spent} commands (the store's scripts loaded once)")
                else:
                    assert spent <= PER_RENEWAL * renewals, (spent, renewals)
                per_renewal.append(spent / renewals)
                worst = max(worst, (after - before - 2 * baseline, due))
        clock.now += 1.0
        ticks += 1
    took = time.monotonic() - started
    counter.close()
    await renewer.close()
    await issuer.close()

    print(f"{ticks} ticks (one per simulated second) in {took:.1f} s of real time")
    print(
        "store commands of tick() itself -> ticks measured (every tick with something due,"
        f" every 20th idle one): {dict(sorted(tick_reads.items()))}"
    )
    print(f"due entries per tick -> ticks: {dict(sorted(due_per_tick.items()))}")
    print(
        f"commands per renewal: median {statistics.median(per_renewal):.1f},"
        f" max after the first {max(per_renewal[1:]):.1f};"
        f" busiest tick: {worst[0]} commands for {worst[1]} due"
    )
    assert set(ca.renewed_at) == set(names)  # every one renewed, once
    assert renewer.counters.done == COUNT
    late = [ca.renewed_at[n] - planned[n] for n in names]
    assert max(late) <= 2.0  # within two ticks of its renewal time
    # spread, not bunched: renewals per 5 minutes
    bars = Counter(int((ca.renewed_at[n] - first) // BUCKET) for n in names)
    mean = COUNT / len(bars)
    print(f"renewals per {BUCKET / 60:.0f} minutes (from the first renewal time):")
    for bar in sorted(bars):
        print(f"  +{bar * BUCKET / 60:3.0f} min  {bars[bar]:4d} {'#' * (bars[bar] // 4)}")
    assert len(bars) >= 11
    assert max(bars.values()) <= 1.6 * mean and min(bars.values()) >= 0.4 * mean, bars
    assert max(due_per_tick) <= 10  # at most a handful due in any one second
    # renewed entries are scheduled half a (new) lifetime ahead: nothing is due any more
    scheduled, due_now = await issuance.renewals.count(clock.now)
    assert (scheduled, due_now) == (COUNT, 0)
    await store.close()
