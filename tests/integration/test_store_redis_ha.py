"""RedisStore on every kind of Redis: one server, a Sentinel set and a 3-master Cluster.

The same contract runs on each: add, lookup (exact and wildcard), list, replace
(rotate), delete, the change feed, the ticket-key ring and its lock, OCSP,
bulk adds, key rotation.  On a cluster nothing may fail with CROSSSLOT, the
records spread over the masters, and a write interrupted midway converges
when it is retried (docs/store.md, "Redis Cluster").
"""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cryptography import x509
from redis.asyncio.cluster import ClusterPipeline

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import parse_bundle
from certagent.certs.ticketkeys import fresh_key, new_ring
from certagent.errors import (
    ConfigError,
    DuplicateCertificate,
    NotFound,
    RotationInProgress,
    StoreUnavailable,
)
from certagent.store import RedisStore, parse_store_url
from certagent.store.base import Change
from certagent.store.records import make_record
from certagent.store.redis import Keys, RecordEncoder
from certagent.store.redis._cluster import CLAIM, WRITE_NEW
from certagent.store.redis._packed import chain_digest, pack_record, unpack
from certagent.store.redis._rows import SWAP, state_of
from certagent.testing import PKI, RedisFixture
from certagent.testing.ocsp import ocsp_response
from certagent.testing.redisha import ClusterSet
from tests.integration.test_import_bulk import backend, run_import, write_files

pytestmark = pytest.mark.integration

CONTRACT = pytest.mark.parametrize("any_store", ["plain", "sentinel", "cluster"], indirect=True)
SINGLE_OR_CLUSTER = pytest.mark.parametrize("any_store", ["plain", "cluster"], indirect=True)


@pytest.fixture
async def store(any_store: RedisFixture) -> AsyncIterator[RedisStore]:
    s = any_store.open()
    yield s
    await s.close()


@pytest.fixture
async def cluster_store(cluster_set: ClusterSet, key_file: Path) -> AsyncIterator[RedisStore]:
    cluster_set.flushall()
    s = RedisFixture(cluster_set.url, key_file, flusher=cluster_set.flushall).open()
    yield s
    await s.close()


async def all_changes(store: RedisStore) -> list[Change]:
    found, _ = await store.changes("0-0", 0)
    return list(found)


@CONTRACT
async def test_add_lookup_rotate_delete_list(store: RedisStore, pki: PKI) -> None:
    bundle = pki.bundle("a.ha.test", "www.a.ha.test")
    first = await store.add(bundle)
    wild = await store.add(pki.bundle("*.wild.ha.test"))
    with pytest.raises(DuplicateCertificate):
        await store.add(bundle)
    found = await store.lookup("www.a.ha.test")
    assert found is not None and found.id == first.id
    by_wildcard = await store.lookup("x.wild.ha.test")
    assert by_wildcard is not None and by_wildcard.id == wild.id
    assert await store.lookup("wild.ha.test") is None
    assert await store.lookup("nothing.ha.test") is None

    page = await store.list()
    assert sorted(r.id for r in page.records) == sorted([first.id, wild.id])
    assert [r.id for r in (await store.list(name="www.a.ha.test")).records] == [first.id]
    assert sorted([n async for n in store.names()]) == [
        "*.wild.ha.test",
        "a.ha.test",
        "www.a.ha.test",
    ]

    # rotate: a new certificate for the record, one name dropped and one gained
    rotated = await store.replace(first.id, pki.bundle("a.ha.test", "new.a.ha.test"))
    assert rotated.id == first.id and rotated.version == 2
    assert await store.lookup("www.a.ha.test") is None
    again = await store.lookup("new.a.ha.test")
    assert again is not None and again.id == first.id
    record = await store.get(first.id)
    assert record is not None and record.names == ("a.ha.test", "new.a.ha.test")

    deleted = await store.delete(first.id)
    assert deleted.id == first.id
    assert await store.lookup("a.ha.test") is None and await store.get(first.id) is None
    with pytest.raises(NotFound):
        await store.delete(first.id)
    assert [r.id for r in (await store.list()).records] == [wild.id]
    assert sorted([n async for n in store.names()]) == ["*.wild.ha.test"]

    changes = await all_changes(store)
    assert [(c.kind, c.id) for c in changes] == [
        ("put", first.id),
        ("put", wild.id),
        ("put", first.id),
        ("delete", first.id),
    ]
    assert set(changes[2].names) == {"a.ha.test", "www.a.ha.test", "new.a.ha.test"}


@CONTRACT
async def test_the_change_feed_wakes_on_a_write(store: RedisStore, pki: PKI) -> None:
    _, position = await store.changes(None, 0)
    waiting = asyncio.create_task(store.changes(position, 5.0))
    await asyncio.sleep(0.2)
    record = await store.add(pki.bundle("feed.ha.test"))
    changes, after = await asyncio.wait_for(waiting, 5.0)
    assert [(c.kind, c.id, c.names) for c in changes] == [("put", record.id, ("feed.ha.test",))]
    assert after != position


@SINGLE_OR_CLUSTER
async def test_ticket_ring_and_its_lock(store: RedisStore) -> None:
    assert await store.tickets.load() is None
    ring = await store.tickets.rotate(None, lambda current: new_ring(1000.0))
    assert (await store.tickets.load()) == ring
    # a stale expectation returns the ring as stored, unchanged
    assert await store.tickets.rotate(None, lambda current: new_ring(2000.0)) == ring
    nxt = await store.tickets.rotate(
        ring.generation, lambda current: ring.rotated(fresh_key(), 3000.0)
    )
    assert nxt.generation == ring.generation + 1
    assert [c.kind for c in await all_changes(store)] == ["tls-keys", "tls-keys"]
    # another agent holds the lock (SET NX PX, as a rotation takes it)
    client = store._client
    assert await client.set(store.keys.tls_lock(), "other", nx=True, px=5000)
    with pytest.raises(RotationInProgress):
        await store.tickets.rotate(nxt.generation, lambda current: new_ring(4000.0))
    assert (await store.tickets.load()) == nxt


@SINGLE_OR_CLUSTER
async def test_an_ocsp_response_is_kept_with_its_record(store: RedisStore, pki: PKI) -> None:
    chain, key = pki.chain_and_key("ocsp.ha.test")
    record = await store.add(parse_bundle(chain, key))
    leaf = x509.load_pem_x509_certificate(chain)
    der = ocsp_response(pki.ca, leaf)
    facts = await store.put_ocsp(record.id, der, dt.datetime.now(dt.UTC))
    assert facts is not None
    found = await store.lookup("ocsp.ha.test")
    assert found is not None and found.ocsp == der
    assert [c.kind for c in await all_changes(store)] == ["put", "put"]
    with pytest.raises(NotFound):
        await store.put_ocsp("0123456789abcdef", der, dt.datetime.now(dt.UTC))


@SINGLE_OR_CLUSTER
async def test_bulk_adds(store: RedisStore, pki: PKI) -> None:
    stored = await store.add(pki.bundle("b0.bulk-ha.test"))
    bundles = [pki.bundle(f"b{i}.bulk-ha.test", "shared.bulk-ha.test") for i in range(1, 40)]
    bundles.append(bundles[3])  # twice in one batch
    existing = await store.lookup("b0.bulk-ha.test")
    assert existing is not None
    bundles.append(existing.bundle)  # already stored
    results = await store.bulk().add_many(bundles)
    added = [r for r in results if not isinstance(r, Exception)]
    assert len(added) == 39
    assert isinstance(results[-2], DuplicateCertificate)
    assert isinstance(results[-1], DuplicateCertificate) and stored.id in str(results[-1])
    for i in range(1, 40):
        found = await store.lookup(f"b{i}.bulk-ha.test")
        assert found is not None
    assert len(await store.lookup_all("shared.bulk-ha.test")) == 39
    assert len((await store.list(limit=100)).records) == 40
    assert len([c for c in await all_changes(store) if c.kind == "put"]) == 40


@SINGLE_OR_CLUSTER
async def test_rotate_keys_re_encrypts_every_key(any_store: RedisFixture, pki: PKI) -> None:
    old_line = keycrypt.generate_key_line("k1")
    new_line = keycrypt.generate_key_line("k2")
    old = RedisStore(any_store.url, keyring=KeyRing.from_text(old_line))
    both = RedisStore(any_store.url, keyring=KeyRing.from_text(f"{new_line}\n{old_line}"))
    only_new = RedisStore(any_store.url, keyring=KeyRing.from_text(new_line))
    try:
        for i in range(12):
            await old.add(pki.bundle(f"k{i}.rekey-ha.test"))
        await old.tickets.rotate(None, lambda current: new_ring(1.0))
        assert await only_new.lookup("k3.rekey-ha.test") is None
        assert await both.rotate_keys() == 12
        assert await both.rotate_keys() == 0
        found = await only_new.lookup("k3.rekey-ha.test")
        assert found is not None
        assert await only_new.tickets.load() is not None
        assert len(await only_new.key_ids_in_use()) == 1
    finally:
        for s in (old, both, only_new):
            await s.close()


# --- cluster only ---------------------------------------------------------------------------


async def test_cluster_keys_are_tagged_and_spread_over_the_masters(
    cluster_store: RedisStore, cluster_set: ClusterSet, pki: PKI
) -> None:
    for i in range(30):
        await cluster_store.add(pki.bundle(f"s{i}.spread.test"))
    await cluster_store.tickets.rotate(None, lambda current: new_ring(1.0))
    per_node = []
    for node in cluster_set.nodes:
        with node.client() as client:
            per_node.append([k.decode() for k in client.keys("*")])
    assert all(len(keys) > 5 for keys in per_node), [len(k) for k in per_node]
    everything = [k for keys in per_node for k in keys]
    shared = {k for k in everything if "{global}" in k}
    assert shared == {
        "certagent:{global}:ids",
        "certagent:{global}:expiry",
        "certagent:{global}:events",
        "certagent:{global}:tls:ring",
        "certagent:{global}:format",  # a new store is marked at the newest format
    }
    assert sum("{global}" in k for k in per_node[0] + per_node[1] + per_node[2]) == 5
    assert all(k.count("{") == 1 for k in everything)


def test_cluster_urls_are_checked_without_io() -> None:
    parsed = parse_store_url("redis+cluster://u:secret@127.0.0.1:7000,127.0.0.1:7001")
    assert parsed.password == "secret" and "secret" not in parsed.url
    sentinel = parse_store_url("redis+sentinel://:pw@h1:26379,h2:26379/mymaster/2")
    assert sentinel.kind == "redis" and sentinel.password == "pw"
    assert sentinel.url == "redis+sentinel://h1:26379,h2:26379/mymaster/2"
    for bad in (
        "redis+sentinel://h1:26379",  # no service
        "redis+sentinel://h1/mymaster",  # no port
        "redis+sentinel://h1:26379/mymaster/x",
        "redis+cluster://h1:7000/3",  # a cluster has db 0 only
        "redis+cluster://h1:7000,,h2:7001",
    ):
        with pytest.raises(ConfigError):
            parse_store_url(bad)
    with pytest.raises(ConfigError, match="prefix"):
        RedisStore("redis+cluster://127.0.0.1:7000", prefix="a{b}:")


async def test_an_add_interrupted_midway_is_completed_by_its_retry(
    cluster_store: RedisStore, pki: PKI
) -> None:
    bundle = pki.bundle("crash.add.test", "www.crash.add.test")
    keys = cluster_store.keys
    client = cluster_store._client
    prepared = RecordEncoder(cluster_store.keyring).prepare(bundle, dt.datetime.now(dt.UTC))  # type: ignore[arg-type]
    cert_id = prepared.record.id
    # the first steps of an add, then a crash: chain and record written and fp claimed
    await client.set(keys.chain(chain_digest(prepared.shared)), prepared.shared)
    assert await client.eval(WRITE_NEW, 1, keys.cert(cert_id), prepared.payload) == 1
    fp = keys.fingerprint(bundle.fingerprint_sha256)
    assert await client.eval(CLAIM, 1, fp, "", cert_id) == 1
    assert await cluster_store.lookup("crash.add.test") is None  # no name yet: not served
    assert (await cluster_store.list()).records == ()
    # the retry finds the leaf stored and completes the add
    assert await cluster_store.put(bundle) == cert_id
    found = await cluster_store.lookup("www.crash.add.test")
    assert found is not None and found.id == cert_id
    assert [r.id for r in (await cluster_store.list()).records] == [cert_id]
    assert [(c.kind, c.id) for c in await all_changes(cluster_store)] == [("put", cert_id)]
    with pytest.raises(DuplicateCertificate):
        await cluster_store.add(bundle)
    assert len(await all_changes(cluster_store)) == 1  # complete: nothing more to do


async def test_a_replace_interrupted_midway_converges_on_retry(
    cluster_store: RedisStore, pki: PKI
) -> None:
    keys = cluster_store.keys
    client = cluster_store._client
    record = await cluster_store.add(pki.bundle("r.crash.test", "old.r.crash.test"))
    new = pki.bundle("r.crash.test", "new.r.crash.test")
    # a replace that wrote the record (keeping the dropped name) and crashed
    replaced = make_record(record.id, new, version=2, updated_at=dt.datetime.now(dt.UTC))
    before = await client.get(keys.cert(record.id))
    payload, _ = pack_record(
        cluster_store.keyring,  # type: ignore[arg-type]
        replaced,
        new,
        dropped=["old.r.crash.test"],
    )
    done = await client.eval(SWAP, 1, keys.cert(record.id), state_of(before), payload)
    assert done == 1
    assert unpack(await client.get(keys.cert(record.id))).dropped == b"old.r.crash.test"
    # readers: the dropped name still points at the record, which no longer covers it
    assert await cluster_store.lookup("old.r.crash.test") is None
    assert await cluster_store.lookup("r.crash.test") is not None
    # the retry (the same replace again) cleans the dropped name up
    await cluster_store.replace(record.id, new)
    assert await client.smembers(keys.name("old.r.crash.test")) == set()
    assert await client.smembers(keys.name("new.r.crash.test")) == {record.id.encode()}
    assert unpack(await client.get(keys.cert(record.id))).dropped is None
    found = await cluster_store.lookup("new.r.crash.test")
    assert found is not None and found.id == record.id


async def test_a_delete_interrupted_midway_converges_on_retry(
    cluster_store: RedisStore, pki: PKI
) -> None:
    keys = cluster_store.keys
    client = cluster_store._client
    bundle = pki.bundle("d.crash.test")
    record = await cluster_store.add(bundle)
    # the first steps of a delete (fp released, names removed), then a crash
    await client.delete(keys.fingerprint(record.fingerprint_sha256))
    await client.srem(keys.name("d.crash.test"), record.id)
    assert await cluster_store.lookup("d.crash.test") is None
    assert await cluster_store.get(record.id) is not None  # the record is still there
    await cluster_store.delete(record.id)
    assert await cluster_store.get(record.id) is None
    assert (await cluster_store.list()).records == ()
    assert [c.kind for c in await all_changes(cluster_store)] == ["put", "delete"]
    # and the same certificate can be added again
    assert (await cluster_store.add(bundle)).id != record.id


async def test_concurrent_adds_of_one_leaf_on_a_cluster(
    cluster_store: RedisStore, pki: PKI
) -> None:
    bundle = pki.bundle("race.cluster.test")
    results = await asyncio.gather(
        *(cluster_store.add(bundle) for _ in range(5)), return_exceptions=True
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert len(ok) == 1, results
    assert all(isinstance(r, DuplicateCertificate) for r in results if r not in ok)
    assert len((await cluster_store.list()).records) == 1


def test_keys_without_cluster_are_unchanged() -> None:
    keys = Keys()
    assert keys.cert("ab") == "certagent:cert:ab"
    assert keys.name("*.x.test") == "certagent:name:*.x.test"
    assert keys.events() == "certagent:events"
    tagged = Keys(cluster=True)
    assert tagged.cert("ab") == "certagent:cert:{ab}"
    assert tagged.name_of(tagged.name("*.x.test")) == "*.x.test"
    assert tagged.events() == "certagent:{global}:events"


def test_cert_import_into_a_cluster(
    cluster_set: ClusterSet, key_file: Path, pki: PKI, tmp_path: Path
) -> None:
    cluster_set.flushall()
    ring = KeyRing.from_file(key_file)
    source = tmp_path / "import"
    write_files(pki, source, 230)
    shutil.copy(source / "f0007.import.test.pem", source / "f9999-copy.import.test.pem")
    result, out = run_import(backend(cluster_set.url, ring), source, workers=2, batch=40)
    assert (result.total, result.added, result.existing, result.failed) == (231, 230, 1, 0), out
    again, _ = run_import(backend(cluster_set.url, ring), source, workers=0, batch=40)
    assert (again.added, again.existing) == (0, 231)
    assert cluster_consistent(cluster_set) == 230


def cluster_consistent(cluster_set: ClusterSet) -> int:
    """Every record whole and indexed with one put event; no name points at a missing one."""
    keys = Keys(cluster=True)
    client = redis.RedisCluster.from_url(
        cluster_set.url.replace("redis+cluster://", "redis://").split(",")[0],
        decode_responses=True,
    )
    try:
        ids = set(client.zrange(keys.ids(), 0, -1))
        assert set(client.zrange(keys.expiry(), 0, -1)) == ids
        events = [fields for _, fields in client.xrange(keys.events())]
        assert sorted(e["id"] for e in events) == sorted(ids)
        hashes = {k[len("certagent:cert:{") : -1] for k in cluster_set_keys(cluster_set, "cert:")}
        assert hashes == ids
        raw = redis.RedisCluster.from_url(
            cluster_set.url.replace("redis+cluster://", "redis://").split(",")[0]
        )
        try:
            for cert_id in ids:
                meta = unpack(raw.get(keys.cert(cert_id))).meta()
                sha = (meta["fingerprint_sha256"] or b"").decode()
                assert client.get(keys.fingerprint(sha)) == cert_id
                for name in (meta["names"] or b"").decode().split():
                    assert client.sismember(keys.name(name), cert_id)
        finally:
            raw.close()
        for key in cluster_set_keys(cluster_set, "name:"):
            assert set(client.smembers(key)) <= ids
        return len(ids)
    finally:
        client.close()


def cluster_set_keys(cluster_set: ClusterSet, kind: str) -> list[str]:
    found = (k.decode() for k in cluster_set.all_keys())
    return [k for k in found if k.startswith(f"certagent:{kind}")]


async def test_concurrent_writes_of_one_record_on_a_cluster_keep_the_index_consistent(
    cluster_store: RedisStore, cluster_set: ClusterSet, pki: PKI
) -> None:
    record = await cluster_store.add(pki.bundle("c.lock.test"))
    bundles = [pki.bundle("c.lock.test", f"n{i}.lock.test") for i in range(6)]
    results = await asyncio.gather(
        *(cluster_store.replace(record.id, b) for b in bundles), return_exceptions=True
    )
    done = [r for r in results if not isinstance(r, BaseException)]
    assert len(done) == 6, results  # the lock makes them take turns
    final = await cluster_store.get(record.id)
    assert final is not None and final.version == 7
    name_keys = cluster_set_keys(cluster_set, "name:")
    assert sorted(name_keys) == sorted(f"certagent:name:{{{n}}}" for n in final.names)
    assert len(cluster_set_keys(cluster_set, "fp:")) == 1
    assert not cluster_set_keys(cluster_set, "lock:")
    # a delete racing a replace: either order, nothing left behind
    racing = await asyncio.gather(
        cluster_store.replace(record.id, pki.bundle("c.lock.test", "late.lock.test")),
        cluster_store.delete(record.id),
        return_exceptions=True,
    )
    assert not isinstance(racing[1], BaseException), racing
    assert (await cluster_store.list()).records == ()
    assert not cluster_set_keys(cluster_set, "cert:")
    assert not cluster_set_keys(cluster_set, "name:") and not cluster_set_keys(cluster_set, "fp:")


async def test_a_cluster_that_loses_a_master_is_unavailable_not_broken(
    key_file: Path, pki: PKI, tmp_path: Path
) -> None:
    cluster = ClusterSet(tmp_path / "cluster").start()
    store = RedisFixture(cluster.url, key_file).open()
    try:
        for i in range(10):
            await store.add(pki.bundle(f"m{i}.down.test"))
        cluster.kill_master(0)
        outcomes: list[str] = []
        started = time.monotonic()
        for i in range(10):
            try:
                found = await asyncio.wait_for(store.lookup(f"m{i}.down.test"), 10)
                outcomes.append("served" if found is not None else "none")
            except StoreUnavailable:
                outcomes.append("unavailable")
        print(outcomes, f"{time.monotonic() - started:.2f}s")
        assert "unavailable" in outcomes and "none" not in outcomes
        assert time.monotonic() - started < 30
    finally:
        await store.close()
        cluster.stop()


async def test_a_cluster_lookup_is_two_pipelined_round_trips(
    cluster_store: RedisStore, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cluster_store.add(pki.bundle("rt.cluster.test"))
    await cluster_store.add(pki.bundle("*.wild.cluster.test"))
    executed: list[int] = []
    original = ClusterPipeline.execute

    async def counting(self: ClusterPipeline, *args: Any, **kwargs: Any) -> Any:
        executed.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(ClusterPipeline, "execute", counting)
    assert await cluster_store.lookup("rt.cluster.test") is not None
    assert len(executed) == 3  # the name sets, the records, their shared chain (once)
    for host in ("rt.cluster.test", "x.wild.cluster.test"):
        executed.clear()
        assert await cluster_store.lookup(host) is not None
        assert len(executed) == 2, host  # the name sets, then the records: the chain is known
    executed.clear()
    assert await cluster_store.lookup("missing.cluster.test") is None
    assert len(executed) == 1
