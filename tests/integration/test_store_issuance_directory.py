"""The issuance roles of DirectoryStore: one node's, the durable parts in ``<root>/.certagent/``.

An issued record is an ordinary ``<name>.pem`` with a mark beside it in
``.certagent/managed/`` (an upload replacing it, or any other file in its place,
reads as uploaded); the account's key is a 0600 PEM file next to its JSON; the
registrations are one file per name.  Leases, challenges and limits are in
memory; challenges and registrations reach the store's change feed.  The
scanner and watcher never report anything under ``.certagent/``.
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

from certagent.errors import DuplicateCertificate, LeaseLost, StoreCorrupt
from certagent.store import DirectoryStore
from certagent.store.base import Change
from certagent.store.directory import atomic_write
from certagent.store.issuance import AcmeAccount, Issuance, Lease, PublishedChallenge
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
