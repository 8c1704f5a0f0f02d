"""The issuance roles of DirectoryStore: one node's, the durable parts in ``<root>/.certagent/``.

An issued record is an ordinary ``<name>.pem`` with a mark beside it in
``.certagent/managed/`` (an upload replacing it, or any other file in its place,
reads as uploaded); the account's key is a 0600 PEM file next to its JSON; the
registrations are one file per name.  Leases, challenges and limits are in
memory; challenges and registrations reach the store's change feed.  The
scanner and watcher never report anything under ``.certagent/``.  The renewal
schedule is journalled in ``.certagent/renewals.log`` and replayed on restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certagent.errors import (
    DuplicateCertificate,
    LeaseLost,
    NotFound,
    ReadOnlyRecord,
    StoreCorrupt,
)
from certagent.store import DirectoryStore
from certagent.store.base import Change
from certagent.store.directory import _journal, atomic_write
from certagent.store.directory import _renewals as _dir_renewals
from certagent.store.issuance import AcmeAccount, Issuance, Lease, PublishedChallenge
from certagent.store.renewals import BudgetWindow, DueRenewal
from certagent.testing import PKI

pytestmark = pytest.mark.integration

CA_URL = "https://ca.example.test/directory"
TOKEN = "tok_" + "d" * 40


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[DirectoryStore]:
    root = tmp_path / "certs"
    root.mkdir()
    opened = DirectoryStore(root)
    yield opened
    await opened.close()


def roles(store: DirectoryStore) -> Issuance:
    issuance = store.issuance()
    assert issuance.shared is False
    return issuance


async def until(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "the condition never became true"
        await asyncio.sleep(0.02)


def account_key() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


async def test_an_issued_record_is_marked_and_an_upload_in_its_place_is_not(
    store: DirectoryStore, pki: PKI
) -> None:
    locks = roles(store).locks
    lease = await locks.acquire("i.dir.test", "node-1", 30)
    assert lease is not None
    bundle = pki.bundle("i.dir.test", "www.i.dir.test")
    record = await locks.add_issued(bundle, lease)
    assert record.id == "i.dir.test.pem" and record.managed == "acme"
    got = await store.get(record.id)
    assert got is not None and got.managed == "acme"
    assert [(r.id, r.managed) for r in (await store.list()).records] == [(record.id, "acme")]
    found = await store.lookup("www.i.dir.test")
    assert found is not None and found.id == record.id
    mark = store.root / ".certagent" / "managed" / "i.dir.test.pem.json"
    assert json.loads(mark.read_bytes()) == {
        "managed": "acme",
        "sha256": bundle.fingerprint_sha256,
    }
    assert stat.S_IMODE(os.stat(store.root / ".certagent").st_mode) == 0o700
    with pytest.raises(DuplicateCertificate):
        await locks.add_issued(pki.bundle("i.dir.test"), lease)
    assert json.loads(mark.read_bytes())["sha256"] == bundle.fingerprint_sha256  # kept

    # another certificate copied over the file: the mark is about another leaf
    atomic_write(store.root, record.id, pki.bundle("i.dir.test").pem)
    again = await store.get(record.id)
    assert again is not None and again.managed == ""
    # an upload that replaces an issued record takes it over; a delete drops the mark
    second = await locks.add_issued(pki.bundle("j.dir.test"), lease)
    replaced = await store.replace(second.id, pki.bundle("j.dir.test"))
    assert replaced.managed == ""
    assert not (store.root / ".certagent" / "managed" / "j.dir.test.pem.json").exists()
    await store.delete(record.id)
    assert not mark.exists()
    upload = await store.add(pki.bundle("u.dir.test"))
    assert upload.managed == ""


async def test_a_lapsed_lease_stores_nothing(store: DirectoryStore, pki: PKI) -> None:
    locks = roles(store).locks
    stale = await locks.acquire("l.dir.test", "node-1", 0.1)
    assert stale is not None
    taken: list[Lease] = []

    async def another_took_it() -> bool:
        lease = await locks.acquire("l.dir.test", "node-2", 30)
        if lease is not None:
            taken.append(lease)
        return bool(taken)

    await until(another_took_it)
    assert taken[0].token > stale.token
    with pytest.raises(LeaseLost, match="node node-2 holds it now"):
        await locks.add_issued(pki.bundle("l.dir.test"), stale)
    assert (await store.list()).records == ()
    assert not (store.root / ".certagent" / "managed").exists()


async def test_the_account_is_kept_in_files_and_compared_and_set(
    store: DirectoryStore, tmp_path: Path
) -> None:
    accounts = roles(store).accounts
    other = DirectoryStore(store.root)  # a second process on the same directory
    try:
        assert await accounts.load_account(CA_URL) is None
        now = datetime.now(UTC)
        unregistered = AcmeAccount(CA_URL, account_key(), None, ("mailto:a@x.test",), now)
        saved = await accounts.save_account(unregistered, previous_url=None)
        assert saved.url is None and saved.key_pem == unregistered.key_pem
        mine = AcmeAccount(CA_URL, saved.key_pem, "https://ca/acct/1", saved.contact, now)
        theirs = AcmeAccount(CA_URL, account_key(), "https://ca/acct/2", (), now)
        a, b = await asyncio.gather(
            accounts.save_account(mine, previous_url=None),
            other.issuance().accounts.save_account(theirs, previous_url=None),
        )
        assert a == b and a.url in ("https://ca/acct/1", "https://ca/acct/2")
        assert await other.issuance().accounts.load_account(CA_URL) == a
        folder = store.root / ".certagent" / "acme"
        keys = sorted(folder.glob("*.key"))
        assert len(keys) == 1 and keys[0].read_bytes() == a.key_pem
        assert stat.S_IMODE(os.stat(keys[0]).st_mode) == 0o600
        (meta,) = folder.glob("*.json")
        assert json.loads(meta.read_bytes())["url"] == a.url
        assert b"PRIVATE KEY" not in meta.read_bytes()
        stale = await accounts.save_account(theirs, previous_url="https://ca/acct/0")
        assert stale == a
        meta.write_text("{not json")
        with pytest.raises(StoreCorrupt, match="not an ACME account"):
            await accounts.load_account(CA_URL)
    finally:
        await other.close()


async def test_registrations_are_files_pages_and_changes(store: DirectoryStore) -> None:
    domains = roles(store).domains
    _, position = await store.changes(None, 0)
    names = [f"n{i:02d}.dir.test" for i in range(30)] + ["*.wild.dir.test"]
    for name in names:
        await domains.register(name)
    first = await domains.registration("n00.dir.test")
    assert first is not None and first.issue is False
    again = await domains.register("N00.dir.test", issue=True)
    assert again.issue and again.added_at == first.added_at
    listed: list[str] = []
    after: str | None = None
    while page := await domains.registrations(after=after, limit=7):
        listed += [r.name for r in page]
        after = page[-1].name
    assert listed == sorted(names)
    assert (store.root / ".certagent" / "domains" / "_wildcard.wild.dir.test").is_file()
    assert await domains.unregister("n01.dir.test") is True
    assert await domains.unregister("n01.dir.test") is False
    reopened = DirectoryStore(store.root)
    try:
        kept = await reopened.issuance().domains.registration("n00.dir.test")
        assert kept == again
        assert await reopened.issuance().domains.registration("n01.dir.test") is None
    finally:
        await reopened.close()
    changes, _ = await store.changes(position, 1)
    assert {c.kind for c in changes} == {"domain"}
    assert {c.id for c in changes} == set(names)  # merged per name
    assert (await store.list()).records == ()  # nothing under .certagent is a record


async def test_challenges_are_changes_and_the_rest_is_memory(store: DirectoryStore) -> None:
    board = roles(store).challenges
    _, position = await store.changes(None, 0)
    answer = PublishedChallenge("http-01", "c.dir.test", TOKEN, f"{TOKEN}.{'T' * 43}", 2e9)
    await board.publish(answer)
    assert await board.current() == (answer,)
    await board.ack(TOKEN, "node-1")
    assert await board.acks(TOKEN) == {"node-1"}
    await board.withdraw(TOKEN)
    changes, position = await store.changes(position, 1)
    assert changes == (Change("challenge", TOKEN, ("c.dir.test",)),)
    await board.beat("node-1", 30)
    assert await board.live_nodes() == {"node-1"}
    limits = roles(store).limits
    assert await limits.take_order_slot("c.dir.test", 1, 30)
    assert not await limits.take_order_slot("d.dir.test", 1, 30)
    # nothing of this is a file, and the watcher reports nothing else
    assert sorted(p.name for p in store.root.iterdir()) == []
    assert await store.changes(position, 0.2) == ((), position)


# --- the renewal schedule ---------------------------------------------------------------------


async def test_the_schedule_is_due_in_order_and_survives_a_restart(
    store: DirectoryStore, pki: PKI
) -> None:
    renewals = roles(store).renewals
    for i, at in enumerate([500.0, 100.0, 300.0, 900.0]):
        await store.add(pki.bundle(f"s{i}.dir.test"))
        await renewals.schedule(f"s{i}.dir.test", at, 10_000.0 + i)
    await renewals.schedule("s3.dir.test", 200.0, 20_000.0)  # moved earlier
    await renewals.schedule("none.dir.test", 1.0, 2.0)  # no record: a no-op
    expected = [
        DueRenewal("s1.dir.test", 100.0, 10_001.0),
        DueRenewal("s3.dir.test", 200.0, 20_000.0),
        DueRenewal("s2.dir.test", 300.0, 10_002.0),
    ]
    assert await renewals.due(300.0, 10) == expected
    assert await renewals.due(300.0, 2) == expected[:2]
    assert await renewals.count(300.0) == (4, 3)
    assert await renewals.entry("none.dir.test") is None
    await renewals.unschedule("s0.dir.test")

    reopened = DirectoryStore(store.root)  # the agent restarted: the journal is replayed
    try:
        again = roles(reopened).renewals
        assert await again.due(300.0, 10) == expected
        assert await again.count(1e10) == (3, 3)
        assert await again.entry("s0.dir.test") is None
    finally:
        await reopened.close()
    journal = store.root / ".certagent" / "renewals.log"
    assert stat.S_IMODE(os.stat(journal).st_mode) == 0o600
    assert journal.read_text().splitlines()[-1] == "D s0.dir.test"


async def test_the_journal_is_compacted_and_a_torn_line_is_skipped(
    store: DirectoryStore, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_journal, "COMPACT_AT", 20)
    renewals = roles(store).renewals
    await store.add(pki.bundle("c.dir.test"))
    for at in range(50):
        await renewals.schedule("c.dir.test", float(at), 7.5)
    journal = store.root / ".certagent" / "renewals.log"
    assert len(journal.read_text().splitlines()) < 25  # rewritten, not 50 lines
    with journal.open("a") as torn:
        torn.write("S half.dir.test 12")  # a write cut short
    reopened = DirectoryStore(store.root)
    try:
        assert await roles(reopened).renewals.due(1e10, 10) == [
            DueRenewal("c.dir.test", 49.0, 7.5)
        ]
    finally:
        await reopened.close()


async def test_a_delete_unschedules_the_names_no_record_holds(
    store: DirectoryStore, pki: PKI
) -> None:
    renewals = roles(store).renewals
    first = await store.add(pki.bundle("a.del.dir.test", "b.del.dir.test"))
    await store.add(pki.bundle("c.del.dir.test"))
    for name in ("a.del.dir.test", "b.del.dir.test", "c.del.dir.test"):
        await renewals.schedule(name, 10.0, 20.0)
    await store.delete(first.id)  # its alias for b goes with it
    assert [d.name for d in await renewals.due(1e10, 10)] == ["c.del.dir.test"]


async def test_add_issued_schedules_and_a_lapsed_lease_schedules_nothing(
    store: DirectoryStore, pki: PKI
) -> None:
    issuance = roles(store)
    stale = await issuance.locks.acquire("r.dir.test", "node-1", 0.1)
    assert stale is not None
    taken: list[Lease] = []

    async def another_took_it() -> bool:
        lease = await issuance.locks.acquire("r.dir.test", "node-2", 30)
        if lease is not None:
            taken.append(lease)
        return bool(taken)

    await until(another_took_it)
    bundle = pki.bundle("r.dir.test")
    with pytest.raises(LeaseLost):
        await issuance.locks.add_issued(bundle, stale, renew_at=100.0)
    assert await issuance.renewals.count(1e10) == (0, 0)
    await issuance.locks.add_issued(bundle, taken[0], renew_at=150.0)
    assert await issuance.renewals.entry("r.dir.test") == DueRenewal(
        "r.dir.test", 150.0, bundle.not_after.timestamp()
    )


async def test_manage_marks_and_schedules_an_imported_file_but_not_certbots(
    store: DirectoryStore, pki: PKI
) -> None:
    renewals = roles(store).renewals
    imported = await store.add(pki.bundle("imp.dir.test", "www.imp.dir.test"))
    await renewals.manage("www.imp.dir.test", 77.0)  # through its alias
    got = await store.get(imported.id)
    assert got is not None and got.managed == "acme"
    assert await renewals.entry("www.imp.dir.test") == DueRenewal(
        "www.imp.dir.test", 77.0, imported.not_after.timestamp()
    )
    with pytest.raises(NotFound, match=r"no certificate is stored for gone\.dir\.test"):
        await renewals.manage("gone.dir.test", 1.0)
    lineage = store.root / "live" / "cb.dir.test"
    lineage.mkdir(parents=True)
    chain, key = pki.chain_and_key("cb.dir.test")
    (lineage / "fullchain.pem").write_bytes(chain)
    (lineage / "privkey.pem").write_bytes(key)
    with pytest.raises(ReadOnlyRecord, match="certbot"):
        await renewals.manage("cb.dir.test", 1.0)
    assert await renewals.entry("cb.dir.test") is None


async def test_spend_takes_from_every_window_or_none(store: DirectoryStore) -> None:
    renewals = roles(store).renewals
    now = 1_800_000_000.0 + 10.0
    hourly, per_name = BudgetWindow("global", 2, 3600), BudgetWindow("domain:x.test", 1, 60)
    assert await renewals.spend((hourly, per_name), now) == 0.0
    assert await renewals.spend((hourly, per_name), now + 1) == pytest.approx(49.0)
    assert await renewals.spend((hourly,), now + 2) == 0.0  # not charged by the refusal
    assert await renewals.spend((hourly,), now + 3) == pytest.approx(3600 - 13)
    assert await renewals.spend((per_name,), now + 50) == 0.0  # a new minute


async def test_a_change_made_by_another_process_reaches_the_agent_and_survives_compaction(
    store: DirectoryStore, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI command on the same directory writes the journal the running agent keeps."""
    monkeypatch.setattr(_journal, "COMPACT_AT", 10)
    monkeypatch.setattr(_dir_renewals, "CHECK_EVERY", 0.0)
    agent = roles(store).renewals
    await store.add(pki.bundle("agent.dir.test"))
    await store.add(pki.bundle("cli.dir.test"))
    await agent.schedule("agent.dir.test", 10.0, 99.0)
    assert await agent.count(1e10) == (1, 1)  # read: the agent's schedule is in memory
    cli_store = DirectoryStore(store.root)
    try:
        await roles(cli_store).renewals.manage("cli.dir.test", 20.0)
    finally:
        await cli_store.close()
    assert [d.name for d in await agent.due(1e10, 10)] == ["agent.dir.test", "cli.dir.test"]
    for at in range(30):  # enough moves to compact the journal, more than once
        await agent.schedule("agent.dir.test", 30.0 + at, 99.0)
    journal = store.root / ".certagent" / "renewals.log"
    assert len(journal.read_text().splitlines()) <= 20
    assert [d.name for d in await agent.due(1e10, 10)] == ["cli.dir.test", "agent.dir.test"]
    again = DirectoryStore(store.root)
    try:
        assert await roles(again).renewals.due(1e10, 10) == await agent.due(1e10, 10)
    finally:
        await again.close()
