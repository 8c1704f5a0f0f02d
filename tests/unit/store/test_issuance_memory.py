"""The in-memory issuance roles (store/localissuance.py), through tests/memstore.py.

The same semantics as the Redis store's, on a clock the test moves: fencing,
expiry of leases, challenges, beats, backoff and order slots, the account's
compare-and-set, registrations and the changes they append to the feed.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certagent.errors import ChangesLost, DuplicateCertificate, LeaseLost, StoreUnavailable
from certagent.store.base import Change
from certagent.store.issuance import AcmeAccount, Issuance, PublishedChallenge
from certagent.testing.certs import CA
from tests.memstore import MemoryStore
from tests.unit.store.memroles import Clock, bundle

TOKEN = "tok_" + "a" * 40
THUMB = "T" * 43


def published(clock: Clock, token: str = TOKEN, life: float = 60) -> PublishedChallenge:
    return PublishedChallenge(
        "tls-alpn-01", "a.mem.test", token, f"{token}.{THUMB}", clock() + life
    )


async def test_a_lapsed_lease_taken_by_another_node_stores_nothing(
    store: MemoryStore, roles: Issuance, clock: Clock, ca: CA
) -> None:
    locks = roles.locks
    first = await locks.acquire("a.mem.test", "node-1", 10)
    assert first is not None and first.expires_at == clock() + 10
    assert first.token >= clock() * 1000
    assert await locks.acquire("a.mem.test", "node-2", 10) is None
    clock.now += 10
    second = await locks.acquire("a.mem.test", "node-2", 10)
    assert second is not None and second.token > first.token
    assert await locks.renew(first, 10) is None
    await locks.release(first)  # not its lease any more: a no-op
    assert await locks.acquire("a.mem.test", "node-3", 10) is None
    issued = bundle(ca, "a.mem.test")
    with pytest.raises(LeaseLost, match="node node-2 holds it now"):
        await locks.add_issued(issued, first)
    assert store.records == {} and store.events == []
    record = await locks.add_issued(issued, second)
    assert record.managed == "acme"
    assert store.events == [Change("put", record.id, ("a.mem.test",))]
    with pytest.raises(DuplicateCertificate):
        await locks.add_issued(issued, second)
    replaced = await store.replace(record.id, bundle(ca, "a.mem.test"))
    assert replaced.managed == "" and replaced.version == 2


async def test_add_issued_holds_the_lease_for_its_write(roles: Issuance, clock: Clock) -> None:
    lease = await roles.locks.acquire("h.mem.test", "node-1", 1)
    assert lease is not None
    renewed = await roles.locks.renew(lease, 5)
    assert renewed is not None and renewed.expires_at == clock() + 5
    clock.now += 4
    with pytest.raises(ValueError, match="not a node name"):
        await roles.locks.acquire("x.mem.test", "bad node", 1)
    await roles.locks.release(renewed)
    with pytest.raises(LeaseLost, match="no node holds it now"):
        await roles.locks.add_issued(None, renewed)  # type: ignore[arg-type]


async def test_challenges_acks_and_beats(store: MemoryStore, roles: Issuance, clock: Clock) -> None:
    board = roles.challenges
    _, position = await store.changes(None, 0)
    short, long = published(clock, "short" + "s" * 20, 1), published(clock)
    await board.publish(short)
    await board.publish(long)
    assert await board.current() == (short, long)
    clock.now += 1
    assert await board.get(short.token) is None and await board.current() == (long,)
    await board.ack(long.token, "node-1")
    await board.ack(long.token, "node-2")
    assert await board.acks(long.token) == {"node-1", "node-2"}
    await board.withdraw(long.token)
    await board.withdraw(long.token)
    assert await board.acks(long.token) == frozenset() and await board.get(long.token) is None
    changes, _ = await store.changes(position, 0)
    assert changes == (
        Change("challenge", short.token, ("a.mem.test",)),
        Change("challenge", long.token, ("a.mem.test",)),
        Change("challenge", long.token, ("a.mem.test",)),
    )
    with pytest.raises(ValueError, match="expired already"):
        await board.publish(published(clock, life=0))
    await board.beat("node-1", 5)
    await board.beat("node-2", 50)
    assert await board.live_nodes() == {"node-1", "node-2"}
    clock.now += 5
    assert await board.live_nodes() == {"node-2"}


async def test_limits(roles: Issuance, clock: Clock) -> None:
    limits = roles.limits
    await limits.record_failure("b.mem.test", "one", clock() + 60)
    state = await limits.record_failure("b.mem.test", "two\nlines", clock() + 120)
    assert state.failures == 2 and state.last_error == "two lines"
    assert await limits.name_state("b.mem.test") == state
    clock.now += 120 + 86_400
    assert await limits.name_state("b.mem.test") is None
    await limits.record_failure("c.mem.test", "x", clock())
    await limits.clear_failures("c.mem.test")
    assert await limits.name_state("c.mem.test") is None

    with pytest.raises(ValueError, match="not_before"):
        await limits.record_failure("d.mem.test", "x", float("nan"))
    await limits.pause(clock() + 30)
    await limits.pause(clock() + 10)
    assert await limits.paused_until() == clock() + 30
    clock.now += 30
    assert await limits.paused_until() == 0.0

    taken = await asyncio.gather(
        *(limits.take_order_slot(f"s{i}.mem.test", 3, 10) for i in range(20))
    )
    assert sum(taken) == 3
    assert await limits.take_order_slot("s0.mem.test", 3, 10) is True  # its own
    await limits.free_order_slot("s0.mem.test")
    assert await limits.take_order_slot("late.mem.test", 3, 10) is True
    assert await limits.take_order_slot("later.mem.test", 3, 10) is False
    clock.now += 10  # every holder died
    assert await limits.take_order_slot("later.mem.test", 3, 10) is True


async def test_the_account_is_compared_and_set(roles: Issuance, clock: Clock) -> None:
    accounts = roles.accounts
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    now = datetime.now(UTC)
    first = AcmeAccount("https://ca.test/dir", key, "https://ca.test/acct/1", (), now)
    second = AcmeAccount("https://ca.test/dir", key, "https://ca.test/acct/2", (), now)
    a, b = await asyncio.gather(
        accounts.save_account(first, previous_url=None),
        accounts.save_account(second, previous_url=None),
    )
    assert a == b and a.url == "https://ca.test/acct/1"
    assert a.updated_at == datetime.fromtimestamp(clock(), UTC)
    assert await accounts.load_account("https://ca.test/dir") == a
    moved = await accounts.save_account(second, previous_url="https://ca.test/acct/1")
    assert moved.url == "https://ca.test/acct/2"


async def test_registrations_page_and_are_in_the_feed(store: MemoryStore, roles: Issuance) -> None:
    domains = roles.domains
    names = [f"n{i:02d}.mem.test" for i in range(25)]
    for name in reversed(names):
        await domains.register(name)
    first = await domains.register(names[0], issue=True)
    assert first.issue
    pages: list[str] = []
    after = None
    while page := await domains.registrations(after=after, limit=10):
        pages += [r.name for r in page]
        after = page[-1].name
    assert pages == names
    assert await domains.unregister(names[0]) and not await domains.unregister(names[0])
    assert await domains.registration(names[0]) is None
    assert [c.kind for c in store.events] == ["domain"] * 27


async def test_an_unavailable_store_fails_issuance_too(store: MemoryStore, roles: Issuance) -> None:
    store.available = False
    with pytest.raises(StoreUnavailable):
        await roles.limits.paused_until()
    with pytest.raises(StoreUnavailable):
        await store.changes(None, 0)


async def test_the_memory_feed_waits_and_rejects_foreign_positions(
    store: MemoryStore, roles: Issuance
) -> None:
    _, position = await store.changes(None, 0)
    waiting = asyncio.create_task(store.changes(position, 5))
    await asyncio.sleep(0)
    await roles.domains.register("w.mem.test")
    changes, after = await asyncio.wait_for(waiting, 1)
    assert changes == (Change("domain", "w.mem.test", ("w.mem.test",)),)
    assert await store.changes(after, 0.01) == ((), after)
    with pytest.raises(ChangesLost):
        await store.changes("99", 0)
