"""Stores written before layout 2 keep working, and layout 2's shared chains, on one Redis
and on a Redis Cluster.

Records of layout 1 (one hash each) are written here as the writers before layout 2
did (:mod:`certagent.testing.layout1`); the store must read, list, update, replace
(which rewrites a record as layout 2) and delete them beside records of layout 2.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator

import pytest
from cryptography import x509

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import parse_bundle
from certagent.errors import DuplicateCertificate, NotFound
from certagent.store import RedisStore
from certagent.store.redis._packed import unpack
from certagent.store.redis._rows import SWAP, read_one
from certagent.testing import PKI, RedisFixture
from certagent.testing.layout1 import add_layout1
from certagent.testing.ocsp import ocsp_response

pytestmark = pytest.mark.integration

SINGLE_OR_CLUSTER = pytest.mark.parametrize("any_store", ["plain", "cluster"], indirect=True)


@pytest.fixture
async def store(any_store: RedisFixture) -> AsyncIterator[RedisStore]:
    s = any_store.open()
    yield s
    await s.close()


async def kind_of(store: RedisStore, cert_id: str) -> bytes:
    return bytes(await store._client.type(store.keys.cert(cert_id)))


async def chain_keys(store: RedisStore, any_store: RedisFixture) -> list[bytes]:
    pattern = store.keys.chain(b"\0" * 32).rsplit(":", 1)[0] + ":*"
    return [k async for k in store._client.scan_iter(match=pattern)]  # every master of a cluster


@SINGLE_OR_CLUSTER
async def test_a_store_written_before_layout_2_keeps_format_1_until_finalized(
    store: RedisStore, any_store: RedisFixture, pki: PKI
) -> None:
    """A store of an earlier release (hashes, no format number) is read and written in
    format 1, which every release reads, until ``fleet finalize`` moves it to format 2
    and rewrites its records online."""
    ring = store.keyring
    assert ring is not None
    client = store._client
    old = [pki.bundle(f"o{i}.layout.test", f"www.o{i}.layout.test") for i in range(4)]
    records = [await add_layout1(client, store.keys, ring, b) for b in old]
    state = await store.fleet().state()
    assert (state.number, state.marked) == (1, False)  # a store with records stays format 1
    new = await store.add(pki.bundle("n.layout.test"))
    assert [await kind_of(store, r.id) for r in [*records, new]] == [b"hash"] * 5

    # reads: lookups, get, list, names
    for record, bundle in zip(records, old, strict=True):
        found = await store.lookup(f"www.{record.names[0]}")
        assert found is not None and found.id == record.id and found.bundle == bundle
        assert await store.get(record.id) == record
    listed = (await store.list()).records
    assert sorted(r.id for r in listed) == sorted([*(r.id for r in records), new.id])
    assert len([n async for n in store.names()]) == 9
    with pytest.raises(DuplicateCertificate):
        await store.add(old[0])  # the fingerprint index of layout 1 is the same

    # an OCSP response on an old record: kept in its hash
    der = ocsp_response(pki.ca, x509.load_pem_x509_certificate(old[1].pem))
    await store.put_ocsp(records[1].id, der, dt.datetime.now(dt.UTC))
    assert await kind_of(store, records[1].id) == b"hash"
    found = await store.lookup("o1.layout.test")
    assert found is not None and found.ocsp == der

    # the managed mark (``renewal manage``) on an old and a new record
    renewals = store.issuance().renewals
    now = dt.datetime.now(dt.UTC).timestamp()
    await renewals.manage("o2.layout.test", now + 3600)
    await renewals.manage("n.layout.test", now + 3600)
    for cert_id in (records[2].id, new.id):
        marked = await store.get(cert_id)
        assert marked is not None and marked.managed == "acme"

    # a replace writes format 1 too: id kept, version + 1, names moved
    replaced = await store.replace(records[0].id, pki.bundle("o0.layout.test", "x.layout.test"))
    assert replaced.version == 2 and await kind_of(store, records[0].id) == b"hash"
    assert await store.lookup("www.o0.layout.test") is None
    again = await store.lookup("x.layout.test")
    assert again is not None and again.id == records[0].id

    # a delete of an old record leaves nothing of it
    await store.delete(records[3].id)
    assert await store.get(records[3].id) is None
    assert await client.exists(store.keys.fingerprint(records[3].fingerprint_sha256)) == 0
    assert await store.lookup("o3.layout.test") is None
    with pytest.raises(NotFound):
        await store.delete(records[3].id)

    # keys rotate re-encrypts every key and keeps each hash a hash (base64 tokens, as
    # releases before 0.2.0 read them); no event
    k2 = keycrypt.generate_key_line("k2")
    both = KeyRing(keys=(*KeyRing.from_text(k2).keys, *ring.keys), current="k2")
    rotating = RedisStore(any_store.url, keyring=both)
    events_before = len((await store.changes("0-0", 0))[0])
    before = {r.id: await store.get(r.id) for r in [*records[:3], new]}
    try:
        assert await rotating.rotate_keys() == 4  # o0, o1, o2, n
    finally:
        await rotating.close()
    assert len((await store.changes("0-0", 0))[0]) == events_before
    for cert_id in before:
        assert await kind_of(store, cert_id) == b"hash"
        token = await client.hget(store.keys.cert(cert_id), "key")
        assert token.startswith(b"cak1:k2:")
    only_k2 = RedisStore(any_store.url, keyring=KeyRing.from_text(k2))
    try:
        for host in ("x.layout.test", "o1.layout.test", "www.o2.layout.test", "n.layout.test"):
            assert await only_k2.lookup(host) is not None, host

        # finalize: format 2, then the migration rewrites every hash (online, no event)
        board = only_k2.fleet()
        moved = await board.finalize(2, "test-node")
        assert (moved.number, moved.marked, moved.node) == (2, True, "test-node")
        report = await board.migrate()
        assert (report.scanned, report.rewritten, report.left) == (4, 4, 0)
        assert len((await store.changes("0-0", 0))[0]) == events_before
        for cert_id, record in before.items():
            assert await kind_of(only_k2, cert_id) == b"string"
            assert await only_k2.get(cert_id) == record  # version, dates, managed kept
        found = await only_k2.lookup("o1.layout.test")
        assert found is not None and found.ocsp == der  # the OCSP response kept
        # a second run finds nothing left; the format never moves down
        assert (await board.migrate()).rewritten == 0
        assert (await board.finalize(1, "test-node")).number == 2
        # and every write from now on is format 2, by any writer of this store
        later = await only_k2.add(pki.bundle("later.layout.test"))
        assert await kind_of(only_k2, later.id) == b"string"
        after = await store.replace(new.id, pki.bundle("n.layout.test"))
        assert after.version == 2 and await kind_of(store, new.id) == b"string"
    finally:
        await only_k2.close()


@SINGLE_OR_CLUSTER
async def test_a_new_store_starts_at_the_newest_format(
    store: RedisStore, any_store: RedisFixture, pki: PKI
) -> None:
    record = await store.add(pki.bundle("new.format.test"))
    state = await store.fleet().state()
    assert (state.number, state.marked) == (2, True)
    assert await kind_of(store, record.id) == b"string"
    added = await store.bulk().add_many([pki.bundle(f"b{i}.format.test") for i in range(3)])
    for result in added:
        assert not isinstance(result, Exception)
        assert await kind_of(store, result.id) == b"string"


async def test_a_write_encoded_before_a_finalize_is_encoded_again(
    redis_store: RedisFixture, pki: PKI
) -> None:
    """One Redis checks the format in every write's transaction or script: a writer that
    saw format 1 before ``fleet finalize`` writes format 2 after it, never a stale hash."""
    seen = redis_store.open()
    other = redis_store.open()
    try:
        assert seen.keyring is not None
        await add_layout1(seen._client, seen.keys, seen.keyring, pki.bundle("a.race.test"))
        first = await seen.add(pki.bundle("b.race.test"))  # format 1, remembered
        assert await kind_of(seen, first.id) == b"hash"
        await other.fleet().finalize(2, "elsewhere")
        single = await seen.add(pki.bundle("c.race.test"))
        assert await kind_of(seen, single.id) == b"string"
        await other.fleet().finalize(2, "elsewhere")
        late = redis_store.open()
        try:
            assert late.keyring is not None
            await late.add(pki.bundle("d.race.test"))  # remembers format 2
            await late._client.delete(late.keys.store_format())  # as if format 1 again
            stale = late.bulk()
            batch = await stale.add_many([pki.bundle(f"e{i}.race.test") for i in range(3)])
            for result in batch:
                assert not isinstance(result, Exception)
                assert await kind_of(late, result.id) == b"hash"
        finally:
            await late.close()
    finally:
        await seen.close()
        await other.close()


@SINGLE_OR_CLUSTER
async def test_records_share_one_chain_and_readers_cache_it(
    store: RedisStore, any_store: RedisFixture, pki: PKI
) -> None:
    first = await store.add(pki.bundle("c0.chain.test"))
    added = await store.bulk().add_many([pki.bundle(f"c{i}.chain.test") for i in range(1, 30)])
    assert all(not isinstance(r, Exception) for r in added)
    keys = await chain_keys(store, any_store)
    assert len(keys) == 1
    digest = unpack(await store._client.get(store.keys.cert(first.id))).chain_digest
    assert digest is not None and keys[0].decode() == store.keys.chain(digest)
    for i in range(30):
        assert await store.lookup(f"c{i}.chain.test") is not None


@SINGLE_OR_CLUSTER
async def test_a_missing_chain_is_named_and_its_records_not_served(
    store: RedisStore, any_store: RedisFixture, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    record = await store.add(pki.bundle("m.chain.test"))
    (key,) = await chain_keys(store, any_store)
    await store._client.delete(key)
    fresh = any_store.open()  # nothing cached
    try:
        with caplog.at_level(logging.WARNING):
            assert await fresh.lookup("m.chain.test") is None
        assert record.id in caplog.text and key.decode() in caplog.text
        assert "is missing" in caplog.text
        assert await fresh.get(record.id) == record  # listing does not need the chain
        # adding a record with that chain writes it again
        await fresh.add(pki.bundle("m2.chain.test"))
        assert await fresh.lookup("m.chain.test") is not None
    finally:
        await fresh.close()


@SINGLE_OR_CLUSTER
async def test_a_corrupt_record_is_named_and_skipped(
    store: RedisStore, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    good = await store.add(pki.bundle("g.corrupt.test"))
    bad = await store.add(pki.bundle("b.corrupt.test"))
    raw = await store._client.get(store.keys.cert(bad.id))
    # cut inside its last field (the key): a cut at a fixed offset sometimes fell exactly
    # between two fields, whose length varies (then "fields ... are missing")
    await store._client.set(store.keys.cert(bad.id), raw[:-10])
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("b.corrupt.test") is None
        assert [r.id for r in (await store.list()).records] == [good.id]
    assert bad.id in caplog.text and "cut short" in caplog.text
    assert await store.lookup("g.corrupt.test") is not None


async def test_old_and_new_records_of_one_name_are_both_served(
    redis_store: RedisFixture, pki: PKI
) -> None:
    """A name with a record of each layout (one lookup script reads both)."""
    store = redis_store.open()
    try:
        assert store.keyring is not None
        old = await add_layout1(
            store._client, store.keys, store.keyring, pki.bundle("both.layout.test")
        )
        new = await store.add(parse_bundle(*pki.chain_and_key("both.layout.test")))
        found = await store.lookup_all("both.layout.test")
        assert sorted(f.id for f in found) == sorted([old.id, new.id])
    finally:
        await store.close()


@SINGLE_OR_CLUSTER
async def test_a_layout1_record_written_meanwhile_is_not_rewritten(
    store: RedisStore, pki: PKI
) -> None:
    """The rewrite's compare-and-set sees every write of layout 1, not just a new version."""
    assert store.keyring is not None
    bundle = pki.bundle("cas.layout.test")
    record = await add_layout1(store._client, store.keys, store.keyring, bundle)
    key = store.keys.cert(record.id)
    row = await read_one(store._client, key)
    assert row is not None
    der = ocsp_response(pki.ca, x509.load_pem_x509_certificate(bundle.pem))
    await store.put_ocsp(record.id, der, dt.datetime.now(dt.UTC))  # the version stays 1
    assert await store._client.eval(SWAP, 1, key, row.state, b"new") == 0
    fresh = await read_one(store._client, key)
    assert fresh is not None and fresh.state != row.state
    assert await store._client.eval(SWAP, 1, store.keys.cert("0" * 16), row.state, b"x") == -1


@SINGLE_OR_CLUSTER
async def test_lookups_never_miss_while_the_migration_rewrites_a_store(
    store: RedisStore, any_store: RedisFixture, pki: PKI
) -> None:
    """The migration (``fleet finalize``) runs online: a reader serving throughout finds
    every record, whichever layout it is in at that moment."""
    assert store.keyring is not None
    names = [f"m{i}.online.test" for i in range(60)]
    for name in names:
        await add_layout1(store._client, store.keys, store.keyring, pki.bundle(name))
    migrating = any_store.open()
    done = asyncio.Event()
    misses: list[str] = []
    served = 0

    async def serve() -> None:
        nonlocal served
        while not done.is_set():
            for name in names:
                if await store.lookup(name) is None:
                    misses.append(name)
                served += 1

    async def migrate() -> int:
        try:
            await migrating.fleet().finalize(2, "test")
            return (await migrating.fleet().migrate()).rewritten
        finally:
            done.set()

    reader = asyncio.create_task(serve())
    try:
        assert await migrate() == 60
    finally:
        await reader
        await migrating.close()
    assert misses == [] and served >= len(names)
    for record in (await store.list(limit=100)).records:
        assert await kind_of(store, record.id) == b"string"
