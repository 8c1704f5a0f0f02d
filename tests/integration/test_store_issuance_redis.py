"""The issuance roles of RedisStore on one Redis and on a 3-master Redis Cluster.

Every role of :mod:`certagent.store.issuance`: leases and the fenced write (a
lease that lapses and is taken by another node leaves the first node's
``add_issued`` with LeaseLost and nothing anyone can list, look up or read in the
feed), the account's compare-and-set from two writers at once, the challenge
board with its feed events, acknowledgements and heartbeats, registrations and
their paging, the limits (backoff, pause, open-order slots under 20 takers), and
the renewal schedule (due in order within a limit and in one command, moves, the
delete and the fenced write that keep it, ``manage``) with the budget's
all-or-nothing fixed windows.
TTLs are fractions of a second and every wait polls for its outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.errors import (
    ConfigError,
    DuplicateCertificate,
    KeyDecryptError,
    LeaseLost,
    NotFound,
)
from certagent.store import RedisStore
from certagent.store.base import CertRecord, Change
from certagent.store.issuance import (
    ACME_MANAGED,
    AcmeAccount,
    Issuance,
    Lease,
    PublishedChallenge,
)
from certagent.store.redis import _issuance
from certagent.store.redis._layout import F_MANAGED
from certagent.store.redis._packed import unpack
from certagent.store.redis._records import RecordEncoder
from certagent.store.redis._renewals import scheduled
from certagent.store.redis._writer import Fence, Stored
from certagent.store.renewals import BudgetWindow, DueRenewal
from certagent.testing import PKI, RedisFixture

pytestmark = pytest.mark.integration

KINDS = pytest.mark.parametrize("any_store", ["plain", "cluster"], indirect=True)
THUMB = "T" * 43
CA_URL = "https://ca.example.test/directory"


@pytest.fixture
async def stores(any_store: RedisFixture) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two nodes on the same Redis: two store objects, as two agents would have.

    Each is pinged first, as the agent does at start: redis-py 8.1's cluster client
    fails some of many concurrent first commands ("Connection closed by server",
    then an AttributeError) while it discovers the cluster; once that is done the
    20 concurrent takers below never fail.
    """
    first, second = any_store.open(), any_store.open()
    await first.ping()
    await second.ping()
    yield first, second
    await first.close()
    await second.close()


def roles(store: RedisStore) -> Issuance:
    issuance = store.issuance()
    assert issuance.shared
    return issuance


async def until(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll ``check`` until it is true (fails after ``within`` s)."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition never became true"
        await asyncio.sleep(0.02)


async def feed(store: RedisStore) -> list[Change]:
    found, _ = await store.changes("0-0", 0)
    return list(found)


def challenge(token: str, name: str = "a.acme.test", life: float = 60.0) -> PublishedChallenge:
    return PublishedChallenge("http-01", name, token, f"{token}.{THUMB}", time.time() + life)


def account_key() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# --- leases and the fenced write ------------------------------------------------------------


@KINDS
async def test_one_lease_per_name_with_growing_tokens(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).locks, roles(stores[1]).locks
    lease = await one.acquire("a.acme.test", "node-1", 30)
    assert lease is not None and lease.node == "node-1" and lease.name == "a.acme.test"
    assert lease.expires_at == pytest.approx(time.time() + 30, abs=2)
    assert await two.acquire("a.acme.test", "node-2", 30) is None
    other = await two.acquire("b.acme.test", "node-2", 30)
    assert other is not None and other.token > lease.token

    renewed = await one.renew(lease, 60)
    assert renewed is not None and renewed.token == lease.token
    assert renewed.expires_at > lease.expires_at
    forged = Lease(lease.name, "node-2", lease.token, lease.expires_at)
    assert await two.renew(forged, 60) is None
    await two.release(forged)  # not node-2's: a no-op
    assert await two.acquire("a.acme.test", "node-2", 30) is None
    await one.release(lease)
    again = await two.acquire("a.acme.test", "node-2", 30)
    assert again is not None and again.token > other.token


@KINDS
async def test_a_lapsed_lease_cannot_store_its_certificate(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    """Node 1's lease lapses, node 2 takes the name: node 1's write is refused, invisibly."""
    store1, store2 = stores
    one, two = roles(store1).locks, roles(store2).locks
    late = pki.bundle("late.acme.test")
    stale = await one.acquire("late.acme.test", "node-1", 0.2)
    assert stale is not None
    taken: list[Lease] = []

    async def node_2_took_it() -> bool:
        lease = await two.acquire("late.acme.test", "node-2", 30)
        if lease is not None:
            taken.append(lease)
        return bool(taken)

    await until(node_2_took_it)
    with pytest.raises(LeaseLost, match=r"node node-2 holds it now") as lost:
        await one.add_issued(late, stale)
    assert "late.acme.test" in str(lost.value) and "nothing was stored" in str(lost.value)
    assert (await store2.list()).records == ()
    assert await store2.lookup("late.acme.test") is None
    assert [c for c in await feed(store2) if c.kind == "put"] == []
    # the fingerprint was not kept either: node 2 stores the very same certificate
    record = await two.add_issued(late, taken[0])
    assert record.managed == ACME_MANAGED
    assert [r.id for r in (await store1.list()).records] == [record.id]
    found = await store1.lookup("late.acme.test")
    assert found is not None and found.id == record.id
    assert [(c.kind, c.id) for c in await feed(store1)] == [("put", record.id)]


@KINDS
async def test_a_released_lease_or_no_lease_stores_nothing(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    locks = roles(stores[0]).locks
    lease = await locks.acquire("gone.acme.test", "node-1", 30)
    assert lease is not None
    await locks.release(lease)
    with pytest.raises(LeaseLost, match="no node holds it now"):
        await locks.add_issued(pki.bundle("gone.acme.test"), lease)
    assert (await stores[0].list()).records == ()
    assert await feed(stores[0]) == []


@KINDS
async def test_the_commit_checks_the_fence_and_takes_everything_back(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    """The writer's own check: a fence that does not hold at the commit leaves nothing."""
    store = stores[0]
    bundle = pki.bundle("fence.acme.test", "www.fence.acme.test")
    lease = Lease("fence.acme.test", "node-1", 1, time.time() + 30)
    key = store.keys.lease("fence.acme.test")
    assert store.keyring is not None
    writer = store._writer  # the store's writer, as add_issued uses it
    await store.fleet().state()  # what the store's own writes do first: a new store, format 2
    record = RecordEncoder(store.keyring).prepare(bundle, datetime.now(UTC), managed="acme")
    await store._client.set(key, "7 node-2")
    outcome = await writer.add(record, Fence(key, "1 node-1", lease))
    assert isinstance(outcome, LeaseLost) and "node node-2 holds it now (token 7)" in str(outcome)
    client = store._client
    assert await client.exists(store.keys.cert(record.record.id)) == 0
    assert await client.exists(store.keys.fingerprint(bundle.fingerprint_sha256)) == 0
    for name in bundle.names:
        assert await client.smembers(store.keys.name(name)) == set()
    assert await store.get(record.record.id) is None and await feed(store) == []
    # with the fence holding, the same record goes in
    await client.set(key, "1 node-1")
    assert await writer.add(record, Fence(key, "1 node-1", lease)) == record.record
    assert await writer.add(record, Fence(key, "1 node-1", lease)) == Stored(record.record.id)


@KINDS
async def test_issued_records_say_so_and_an_upload_that_replaces_one_does_not(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store = stores[0]
    locks = roles(store).locks
    lease = await locks.acquire("m.acme.test", "node-1", 30)
    assert lease is not None
    bundle = pki.bundle("m.acme.test")
    issued = await locks.add_issued(bundle, lease)
    assert issued.managed == "acme" and issued.version == 1
    got = await store.get(issued.id)
    assert got is not None and got.managed == "acme"
    assert [r.managed for r in (await store.list(name="m.acme.test")).records] == ["acme"]
    with pytest.raises(DuplicateCertificate):
        await locks.add_issued(bundle, lease)  # the same leaf
    uploaded = await store.add(pki.bundle("up.acme.test"))
    assert uploaded.managed == ""
    raw = await store._client.get(store.keys.cert(uploaded.id))
    assert unpack(raw).meta()[F_MANAGED] is None
    replaced = await store.replace(issued.id, pki.bundle("m.acme.test", "n.acme.test"))
    assert replaced.managed == "" and replaced.version == 2
    again = await store.get(issued.id)
    assert again is not None and again.managed == ""


# --- the account ------------------------------------------------------------------------------


@KINDS
async def test_the_first_of_two_concurrent_account_writes_wins(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).accounts, roles(stores[1]).accounts
    assert await one.load_account(CA_URL) is None
    now = datetime.now(UTC)
    mine = AcmeAccount(CA_URL, account_key(), "https://ca/acct/1", ("mailto:a@x.test",), now)
    theirs = AcmeAccount(CA_URL, account_key(), "https://ca/acct/2", (), now)
    first, second = await asyncio.gather(
        one.save_account(mine, previous_url=None), two.save_account(theirs, previous_url=None)
    )
    assert first == second and first.url in ("https://ca/acct/1", "https://ca/acct/2")
    loaded = await two.load_account(CA_URL)
    assert loaded == first
    assert loaded.key_pem in (mine.key_pem, theirs.key_pem)
    stored_key = await stores[0]._client.hget(stores[0].keys.account(CA_URL), "key")
    assert isinstance(stored_key, bytes) and stored_key.startswith(b"cak1:")
    assert b"PRIVATE KEY" not in stored_key

    # the CA forgot the account: both nodes register again, from the URL they knew
    fresh_a = AcmeAccount(CA_URL, account_key(), "https://ca/acct/3", (), now)
    fresh_b = AcmeAccount(CA_URL, account_key(), "https://ca/acct/4", (), now)
    a, b = await asyncio.gather(
        one.save_account(fresh_a, previous_url=first.url),
        two.save_account(fresh_b, previous_url=first.url),
    )
    assert a == b and a.url in ("https://ca/acct/3", "https://ca/acct/4")
    # a write from a stale URL changes nothing and gets the stored account back
    assert await one.save_account(mine, previous_url="https://ca/acct/1") == a
    assert await one.load_account("https://other.example.test/dir") is None


@KINDS
async def test_an_account_key_needs_the_data_key(
    stores: tuple[RedisStore, RedisStore], any_store: RedisFixture
) -> None:
    now = datetime.now(UTC)
    saved = await roles(stores[0]).accounts.save_account(
        AcmeAccount(CA_URL, account_key(), None, (), now), previous_url=None
    )
    assert saved.url is None
    other = RedisStore(any_store.url, keyring=KeyRing.from_text(generate_key_line("k9")))
    keyless = RedisStore(any_store.url)
    try:
        with pytest.raises(KeyDecryptError, match=CA_URL):
            await other.issuance().accounts.load_account(CA_URL)
        with pytest.raises(ConfigError, match="key_file"):
            await keyless.issuance().accounts.load_account(CA_URL)
    finally:
        await other.close()
        await keyless.close()


# --- the challenge board ----------------------------------------------------------------------


@KINDS
async def test_challenges_are_published_withdrawn_and_in_the_feed(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).challenges, roles(stores[1]).challenges
    _, start = await stores[1].changes(None, 0)
    first, second = challenge("tok_" + "a" * 40), challenge("tok-" + "b" * 40, "b.acme.test")
    await one.publish(first)
    await one.publish(second)
    assert await two.get(first.token) == first
    assert await two.current() == (second, first)  # by token
    changes, position = await stores[1].changes(start, 0)
    assert changes == (
        Change("challenge", first.token, ("a.acme.test",)),
        Change("challenge", second.token, ("b.acme.test",)),
    )
    await one.withdraw(first.token)
    await one.withdraw(first.token)  # gone already: no second event
    assert await two.get(first.token) is None
    assert await two.current() == (second,)
    changes, _ = await stores[1].changes(position, 0)
    assert changes == (Change("challenge", first.token, ("a.acme.test",)),)
    with pytest.raises(ValueError, match="token"):
        await one.publish(challenge("bad/token" + "x" * 20))
    with pytest.raises(ValueError, match="expired"):
        await one.publish(challenge("tok_" + "c" * 40, life=-1))


@KINDS
async def test_a_challenge_lapses_at_its_expiry(stores: tuple[RedisStore, RedisStore]) -> None:
    board = roles(stores[0]).challenges
    store = stores[0]
    short, long = challenge("short" + "s" * 30, life=0.3), challenge("long" + "l" * 30)
    await board.publish(short)
    await board.publish(long)
    ttl = await store._client.pttl(store.keys.challenges())
    assert 60_000 < ttl <= 121_000  # the latest entry's life plus the grace

    async def lapsed() -> bool:
        return await board.get(short.token) is None

    await until(lapsed)
    assert await board.current() == (long,)
    assert await store._client.hexists(store.keys.challenges(), short.token) is False


@KINDS
async def test_acknowledgements_and_live_nodes(stores: tuple[RedisStore, RedisStore]) -> None:
    one, two = roles(stores[0]).challenges, roles(stores[1]).challenges
    token = "ack" + "k" * 30
    await one.publish(challenge(token))
    await one.ack(token, "node-1")
    await two.ack(token, "node-2")
    await two.ack(token, "node-2")
    assert await one.acks(token) == {"node-1", "node-2"}
    ttl = await stores[0]._client.pttl(stores[0].keys.acks(token))
    assert 0 < ttl <= 3_600_000
    await one.withdraw(token)
    assert await two.acks(token) == frozenset()

    await one.beat("node-1", 0.3)
    await two.beat("node-2", 30)
    assert await one.live_nodes() == {"node-1", "node-2"}

    async def node_1_lapsed() -> bool:
        return await two.live_nodes() == {"node-2"}

    await until(node_1_lapsed)
    await one.beat("node-1", 30)
    assert await two.live_nodes() == {"node-1", "node-2"}


# --- registrations ----------------------------------------------------------------------------


@KINDS
async def test_registrations_page_in_name_order_and_are_in_the_feed(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).domains, roles(stores[1]).domains
    _, start = await stores[0].changes(None, 0)
    names = [f"n{i:03d}.reg.acme.test" for i in range(250)]
    # concurrent, but no more at once than the store's connection pool holds: 250 at once
    # waited for a pooled connection past its 10 s timeout on a machine at load 12
    for chunk in range(0, len(names), 25):
        await asyncio.gather(
            *(
                one.register(n, issue=(i % 2 == 0))
                for i, n in enumerate(names)
                if chunk <= i < chunk + 25
            )
        )
    listed: list[str] = []
    after: str | None = None
    while page := await two.registrations(after=after, limit=100):
        assert len(page) <= 100
        listed += [r.name for r in page]
        after = page[-1].name
    assert listed == names
    first = await two.registration(names[1])
    assert first is not None and first.issue is False
    assert abs(first.added_at.timestamp() - time.time()) < 60  # registered during this test
    again = await two.register(names[1].upper(), issue=True)
    assert again.name == names[1] and again.issue and again.added_at == first.added_at
    assert await one.unregister(names[0]) is True
    assert await one.unregister(names[0]) is False
    assert await two.registration(names[0]) is None
    assert [r.name for r in await two.registrations(limit=2)] == names[1:3]
    changes, _ = await stores[1].changes(start, 0)
    domains = [c for c in changes if c.kind == "domain"]
    assert len(domains) == 252  # 250 registered, one again, one forgotten
    assert domains[-1] == Change("domain", names[0], (names[0],))


# --- limits -----------------------------------------------------------------------------------


@KINDS
async def test_backoff_counts_failures_and_lapses(
    stores: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = roles(stores[0]).limits, roles(stores[1]).limits
    assert await one.name_state("f.acme.test") is None
    later = time.time() + 600
    await one.record_failure("f.acme.test", "rateLimited:\ntoo many", later - 300)
    state = await two.record_failure("f.acme.test", "timeout", later)
    assert state.failures == 2 and state.not_before == later and state.last_error == "timeout"
    assert await one.name_state("f.acme.test") == state
    ttl = await stores[0]._client.pttl(stores[0].keys.backoff("f.acme.test"))
    assert (600 + 86_400 - 60) * 1000 < ttl <= (600 + 86_400) * 1000
    await two.clear_failures("f.acme.test")
    assert await one.name_state("f.acme.test") is None

    monkeypatch.setattr(_issuance, "STATE_LAPSE", 0.3)
    first = await one.record_failure("g.acme.test", "badNonce", time.time())
    assert first.failures == 1 and first.last_error == "badNonce"

    async def lapsed() -> bool:
        return await two.name_state("g.acme.test") is None

    await until(lapsed)
    assert (await one.record_failure("g.acme.test", "again", time.time())).failures == 1


@KINDS
async def test_the_pause_keeps_the_later_time_and_lapses(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).limits, roles(stores[1]).limits
    assert await one.paused_until() == 0.0
    now = time.time()
    await one.pause(now + 60)
    await two.pause(now + 30)  # earlier: kept the later one
    assert await two.paused_until() == pytest.approx(now + 60)
    await two.pause(now + 90)
    assert await one.paused_until() == pytest.approx(now + 90)
    await one.pause(now - 5)  # in the past: nothing to do
    assert await one.paused_until() == pytest.approx(now + 90)
    await stores[0]._client.delete(stores[0].keys.pause())
    await one.pause(time.time() + 0.3)

    async def lapsed() -> bool:
        return await two.paused_until() == 0.0

    await until(lapsed)
    assert await stores[0]._client.exists(stores[0].keys.pause()) == 0


@KINDS
async def test_order_slots_hold_the_cap_under_twenty_takers(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).limits, roles(stores[1]).limits
    names = [f"s{i}.acme.test" for i in range(20)]
    taken = await asyncio.gather(
        *((one if i % 2 else two).take_order_slot(n, 5, 30) for i, n in enumerate(names))
    )
    assert sum(taken) == 5
    holders = [n for n, t in zip(names, taken, strict=True) if t]
    assert await one.take_order_slot(holders[0], 5, 30) is True  # its own slot, renewed
    assert await one.take_order_slot("late.acme.test", 5, 30) is False
    await two.free_order_slot(holders[0])
    assert await one.take_order_slot("late.acme.test", 5, 30) is True
    assert await two.take_order_slot(holders[0], 5, 30) is False

    # a holder that died: its slot lapses after its TTL and goes to the next taker
    await two.free_order_slot(holders[1])
    assert await one.take_order_slot("dead.acme.test", 5, 0.3) is True

    async def freed() -> bool:
        return await two.take_order_slot("next.acme.test", 5, 30)

    await until(freed)
    assert await stores[0]._client.zcard(stores[0].keys.order_slots()) == 5


@KINDS
async def test_keys_rotate_re_encrypts_the_account_key(any_store: RedisFixture) -> None:
    old_line, new_line = generate_key_line("k1"), generate_key_line("k2")
    old = RedisStore(any_store.url, keyring=KeyRing.from_text(old_line))
    both = RedisStore(any_store.url, keyring=KeyRing.from_text(f"{new_line}\n{old_line}"))
    only_new = RedisStore(any_store.url, keyring=KeyRing.from_text(new_line))
    try:
        saved = await old.issuance().accounts.save_account(
            AcmeAccount(CA_URL, account_key(), "https://ca/acct/1", (), datetime.now(UTC)),
            previous_url=None,
        )
        with pytest.raises(KeyDecryptError):
            await only_new.issuance().accounts.load_account(CA_URL)
        assert await both.rotate_keys() == 1
        assert await both.rotate_keys() == 0
        assert await only_new.issuance().accounts.load_account(CA_URL) == saved
    finally:
        for store in (old, both, only_new):
            await store.close()


# --- the renewal schedule and the budget ------------------------------------------------------


async def stored(store: RedisStore, pki: PKI, *names: str) -> CertRecord:
    return await store.add(pki.bundle(*names))


@KINDS
async def test_due_gives_only_what_is_due_earliest_first_within_the_limit(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store, other = stores
    renewals = roles(store).renewals
    for i, at in enumerate([500.0, 100.0, 300.0, 900.0, 200.5]):
        record = await stored(store, pki, f"d{i}.renew.test")
        await renewals.schedule(f"D{i}.renew.test", at, record.not_after.timestamp())
    due = await roles(other).renewals.due(300.0, 10)  # another node reads the same schedule
    assert [(d.name, d.renew_at) for d in due] == [
        ("d1.renew.test", 100.0),
        ("d4.renew.test", 200.5),
        ("d2.renew.test", 300.0),  # renew_at == now is due
    ]
    found = await store.lookup("d1.renew.test")
    assert found is not None
    assert due[0].not_after == found.bundle.not_after.timestamp()
    assert [d.name for d in await renewals.due(300.0, 2)] == ["d1.renew.test", "d4.renew.test"]
    assert await renewals.due(99.0, 10) == []
    assert await renewals.count(300.0) == (5, 3)
    assert await renewals.count(1e10) == (5, 5)
    with pytest.raises(ValueError, match="limit"):
        await renewals.due(300.0, 0)


@KINDS
async def test_a_moved_entry_moves_and_a_name_without_a_record_is_not_scheduled(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store = stores[0]
    renewals = roles(store).renewals
    await stored(store, pki, "m1.renew.test")
    await stored(store, pki, "m2.renew.test")
    await renewals.schedule("m1.renew.test", 100.0, 5000.0)
    await renewals.schedule("m2.renew.test", 200.0, 6000.0)
    await renewals.schedule("m1.renew.test", 300.0, 7000.5)  # moved later, new not_after
    assert await renewals.entry("m1.renew.test") == DueRenewal("m1.renew.test", 300.0, 7000.5)
    assert [d.name for d in await renewals.due(250.0, 10)] == ["m2.renew.test"]
    assert [d.name for d in await renewals.due(300.0, 10)] == ["m2.renew.test", "m1.renew.test"]
    assert await renewals.count(1000.0) == (2, 2)  # moved, not duplicated
    await renewals.schedule("nothing.renew.test", 50.0, 60.0)  # no record: a no-op
    assert await renewals.entry("nothing.renew.test") is None
    assert await renewals.count(1000.0) == (2, 2)
    await renewals.unschedule("m2.renew.test")
    await renewals.unschedule("m2.renew.test")  # again: a no-op
    assert await renewals.entry("m2.renew.test") is None
    assert await renewals.due(1000.0, 10) == [DueRenewal("m1.renew.test", 300.0, 7000.5)]


@KINDS
async def test_deleting_the_last_record_of_a_name_unschedules_it(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store = stores[0]
    renewals = roles(store).renewals
    both = await stored(store, pki, "x.renew.test", "y.renew.test")
    await stored(store, pki, "y.renew.test")  # y has a second record
    for name in ("x.renew.test", "y.renew.test"):
        await renewals.schedule(name, 100.0, both.not_after.timestamp())
    await store.delete(both.id)
    assert await renewals.entry("x.renew.test") is None
    assert await renewals.entry("y.renew.test") is not None  # still held
    assert [d.name for d in await renewals.due(1e10, 10)] == ["y.renew.test"]
    unscheduled = await stored(store, pki, "z.renew.test")
    await store.delete(unscheduled.id)  # nothing scheduled: the delete is as before
    assert await renewals.count(1e10) == (1, 1)


@KINDS
async def test_spend_takes_from_every_window_or_from_none(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    one, two = roles(stores[0]).renewals, roles(stores[1]).renewals
    now = 1_800_000_000.0 + 10.0  # 10 s into a minute and into an hour
    hourly = BudgetWindow("global", 3, 3600)
    per_name = BudgetWindow("domain:example.com", 1, 60)
    assert await one.spend((hourly, per_name), now) == 0.0
    # the per-name window is full: refused, and the hourly window is not charged
    assert await two.spend((hourly, per_name), now + 1) == pytest.approx(49.0)
    assert await two.spend((hourly, per_name), now + 2) == pytest.approx(48.0)
    assert await two.spend((hourly,), now + 3) == 0.0
    assert await one.spend((hourly,), now + 4) == 0.0  # 3 of 3: both nodes count together
    assert await one.spend((hourly,), now + 5) == pytest.approx(3600 - 15)
    # both full: the wait is the longer one
    assert await two.spend((per_name, hourly), now + 6) == pytest.approx(3600 - 16)
    # the next minute's window of the per-name budget starts afresh
    assert await one.spend((per_name,), now + 50) == 0.0
    assert await one.spend((), now) == 0.0
    with pytest.raises(ValueError, match="seconds"):
        await one.spend((BudgetWindow("global", 1, 0),), now)
    with pytest.raises(ValueError, match="budget key"):
        await one.spend((BudgetWindow("{global}", 1, 60),), now)


@KINDS
async def test_add_issued_schedules_in_its_fenced_write_and_a_lost_lease_schedules_nothing(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store1, store2 = stores
    one, two = roles(store1), roles(store2)
    late = pki.bundle("sched.renew.test")
    stale = await one.locks.acquire("sched.renew.test", "node-1", 0.2)
    assert stale is not None
    taken: list[Lease] = []

    async def node_2_took_it() -> bool:
        lease = await two.locks.acquire("sched.renew.test", "node-2", 30)
        if lease is not None:
            taken.append(lease)
        return bool(taken)

    await until(node_2_took_it)
    with pytest.raises(LeaseLost):
        await one.locks.add_issued(late, stale, renew_at=1000.0)
    assert await two.renewals.entry("sched.renew.test") is None
    assert await two.renewals.count(1e10) == (0, 0)
    record = await two.locks.add_issued(late, taken[0], renew_at=1234.5)
    assert await one.renewals.entry("sched.renew.test") == DueRenewal(
        "sched.renew.test", 1234.5, late.not_after.timestamp()
    )
    assert record.managed == ACME_MANAGED
    await store1.delete(record.id)
    assert await one.renewals.entry("sched.renew.test") is None


@KINDS
async def test_manage_marks_an_imported_certificate_and_schedules_it(
    stores: tuple[RedisStore, RedisStore], pki: PKI
) -> None:
    store = stores[0]
    renewals = roles(store).renewals
    imported = await stored(store, pki, "imp.renew.test", "www.imp.renew.test")
    assert imported.managed == ""
    await renewals.manage("IMP.renew.test", 4242.0)
    got = await store.get(imported.id)
    assert got is not None and got.managed == ACME_MANAGED and got.version == imported.version
    assert await renewals.entry("imp.renew.test") == DueRenewal(
        "imp.renew.test", 4242.0, imported.not_after.timestamp()
    )
    assert await renewals.entry("www.imp.renew.test") is None  # only the name asked for
    with pytest.raises(NotFound, match=r"no certificate is stored for missing\.renew\.test"):
        await renewals.manage("missing.renew.test", 1.0)
    assert await renewals.entry("missing.renew.test") is None


@KINDS
async def test_due_is_one_command_whatever_the_schedule_size(
    any_store: RedisFixture, stores: tuple[RedisStore, RedisStore]
) -> None:
    """1,000 entries, 10 due: ``due`` sends one ZRANGEBYSCORE (counted by the client and,
    on one Redis, by the server's INFO commandstats)."""
    store = stores[0]
    client, keys = store._client, store.keys
    async with client.pipeline(transaction=False) as pipe:
        for i in range(1000):
            entry = scheduled(DueRenewal(f"n{i:04d}.renew.test", 1000.0 + i, 99_999.0))
            pipe.zadd(keys.renewals(), {entry.member: float(entry.score)})
            pipe.hset(keys.renewal_entries(), entry.name, entry.member)
        await pipe.execute()
    renewals = roles(store).renewals
    sent: list[str] = []
    real: Callable[..., Awaitable[Any]] = client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return await real(*args, **options)

    server: redis.asyncio.Redis | None = None
    if "cluster" not in any_store.url:
        server = redis.asyncio.Redis.from_url(any_store.url)
    if server is not None:
        await server.config_resetstat()
    client.execute_command = counted  # type: ignore[method-assign]
    try:
        due = await renewals.due(1009.0, 100)
    finally:
        del client.execute_command
    assert [d.name for d in due] == [f"n{i:04d}.renew.test" for i in range(10)]
    assert sent == ["ZRANGEBYSCORE"]
    if server is not None:
        stats = await server.info("commandstats")
        await server.aclose()
        calls = {
            name.removeprefix("cmdstat_"): row["calls"]
            for name, row in stats.items()
            if not name.startswith(("cmdstat_config", "cmdstat_info", "cmdstat_ping"))
        }
        assert calls == {"zrangebyscore": 1}
    assert await renewals.count(1009.0) == (1000, 10)
