"""RedisStore.bulk() (add_many, add_prepared, add_wire) against a real redis-server."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.errors import DuplicateCertificate, StoreError, StoreUnavailable
from certagent.store import RedisStore
from certagent.store.base import AddAlone, CertRecord, IdTaken, WireRecord
from certagent.store.redis import Keys
from certagent.store.redis._packed import unpack
from certagent.testing import PKI, RedisFixture
from certagent.testing.processes import free_port

pytestmark = pytest.mark.integration

KEYS = Keys()
FIXED = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture
def ring(redis_store: RedisFixture) -> KeyRing:
    return KeyRing.from_file(redis_store.key_file)


@pytest.fixture
async def store(redis_store: RedisFixture, ring: KeyRing) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_store.url, keyring=ring)
    yield s
    await s.close()


@pytest.fixture
async def raw(redis_store: RedisFixture) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_store.url, decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("certagent.store.redis._store._now", lambda: FIXED)
    yield


def bundles(pki: PKI, count: int, start: int = 0) -> list[CertBundle]:
    return [pki.bundle(f"h{i}.bulk.test", f"alias{i % 3}.bulk.test") for i in range(start, count)]


async def events(raw: redis.asyncio.Redis, keys: Keys = KEYS) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in await raw.xrange(keys.events())]


def _text(value: bytes) -> str:
    return value.decode()


async def snapshot(raw: redis.asyncio.Redis, keys: Keys, ring: KeyRing) -> dict[str, Any]:
    """The store's content with every id replaced by its record's leaf fingerprint."""
    fp_of: dict[str, str] = {}
    for cert_id in map(_text, await raw.zrange(keys.ids(), 0, -1)):
        meta = unpack(await raw.get(keys.cert(cert_id))).meta()
        fp_of[cert_id] = _text(meta["fingerprint_sha256"] or b"")
    records: dict[str, dict[str, bytes]] = {}
    for cert_id, fp in fp_of.items():
        packed = unpack(await raw.get(keys.cert(cert_id)))
        fields = {chr(tag): value for tag, value in packed.fields.items()}
        fields["K"] = packed.key_pem(ring, cert_id)  # the nonce differs
        records[fp] = fields
    names: dict[str, set[str]] = {}
    async for key in raw.scan_iter(match=keys.name("*").encode(), count=1000):
        names[_text(key)] = {fp_of[_text(m)] for m in await raw.smembers(key)}
    fps: dict[str, str] = {}
    async for key in raw.scan_iter(match=keys.fingerprint("*").encode(), count=1000):
        fps[_text(key)] = fp_of[_text(await raw.get(key))]
    scored = await raw.zrange(keys.expiry(), 0, -1, withscores=True)
    expiry = {fp_of[_text(m)]: s for m, s in scored}
    stream = [
        (e[b"kind"], fp_of[_text(e[b"id"])], e[b"names"]) for e in await events(raw, keys)
    ]
    return {
        "records": records,
        "names": {k.removeprefix(keys.prefix): v for k, v in names.items()},
        "fps": {k.removeprefix(keys.prefix): v for k, v in fps.items()},
        "expiry": expiry,
        "ids": sorted(fp_of.values()),
        "events": stream,
    }


# --- what add_many writes --------------------------------------------------------------------


async def test_add_many_writes_what_single_adds_write(
    redis_store: RedisFixture, raw: redis.asyncio.Redis, ring: KeyRing, pki: PKI, fixed_clock: None
) -> None:
    batch = bundles(pki, 30)
    single = RedisStore(redis_store.url, keyring=ring, prefix="single:")
    bulk = RedisStore(redis_store.url, keyring=ring, prefix="bulk:")
    try:
        one_by_one = [await single.add(b) for b in batch]
        together = await bulk.bulk().add_many(batch)
    finally:
        await single.close()
        await bulk.close()
    assert all(isinstance(r, CertRecord) for r in together)
    assert [dict(vars(r), id="") for r in together if isinstance(r, CertRecord)] == [
        dict(vars(r), id="") for r in one_by_one
    ]
    assert await snapshot(raw, Keys("bulk:"), ring) == await snapshot(raw, Keys("single:"), ring)
    assert len((await snapshot(raw, Keys("bulk:"), ring))["events"]) == 30


async def test_duplicates_inside_a_batch_and_against_the_store(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    stored, new1, new2 = bundles(pki, 3)
    first = await store.add(stored)
    results = await store.bulk().add_many([stored, new1, new1, new2, new2])
    assert isinstance(results[0], DuplicateCertificate)
    assert first.id in str(results[0])
    assert isinstance(results[1], CertRecord)
    assert isinstance(results[2], DuplicateCertificate)
    assert results[1].id in str(results[2])
    assert isinstance(results[3], CertRecord)
    assert isinstance(results[4], DuplicateCertificate)
    # one put per record written, none for a duplicate
    written = [first.id, results[1].id, results[3].id]
    assert [(e[b"kind"], e[b"id"].decode()) for e in await events(raw)] == [
        (b"put", i) for i in written
    ]
    assert await raw.zcard(KEYS.ids()) == 3


async def test_each_event_names_its_record(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    results = await store.bulk().add_many(bundles(pki, 5))
    found = await events(raw)
    assert len(found) == 5
    for result, event in zip(results, found, strict=True):
        assert isinstance(result, CertRecord)
        assert event == {
            b"kind": b"put",
            b"id": result.id.encode(),
            b"names": " ".join(result.names).encode(),
        }
        assert await store.lookup(result.names[0]) is not None


async def test_a_batch_is_one_round_trip(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    batch = bundles(pki, 200)
    await store.bulk().add_many(batch[:1])  # loads the script
    await raw.config_resetstat()
    await store.bulk().add_many(batch[1:])
    stats = await raw.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): value["calls"]
        for name, value in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls.get("evalsha") == 199
    assert "script|load" not in calls
    assert "multi" not in calls


async def test_a_key_of_the_wrong_type_fails_its_record_only_and_writes_nothing(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    good1, bad, good2 = (pki.bundle(f"{n}.bulk.test") for n in ("a", "b", "c"))
    await raw.set(KEYS.name("b.bulk.test"), b"not a set")
    results = await store.bulk().add_many([good1, bad, good2])
    assert isinstance(results[0], CertRecord)
    assert isinstance(results[1], StoreError)
    assert "is a string" in str(results[1])
    assert isinstance(results[2], CertRecord)
    assert await raw.get(KEYS.fingerprint(bad.fingerprint_sha256)) is None
    assert await raw.zcard(KEYS.ids()) == 2
    assert len(await events(raw)) == 2
    assert len([k async for k in raw.scan_iter(match=KEYS.cert("*").encode())]) == 2


async def test_readers_never_see_a_record_without_its_event(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    batch = bundles(pki, 400)
    samples: list[tuple[int, int, int]] = []
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            async with raw.pipeline(transaction=True) as pipe:
                pipe.zcard(KEYS.ids())
                pipe.xlen(KEYS.events())
                pipe.zcard(KEYS.expiry())
                samples.append(tuple(await pipe.execute()))  # type: ignore[arg-type]
            await asyncio.sleep(0)

    observer = asyncio.create_task(observe())
    for start in range(0, 400, 100):
        await store.bulk().add_many(batch[start : start + 100])
        await asyncio.sleep(0.001)
    stop.set()
    await observer
    assert len(samples) > 1
    assert all(ids == entries == expiry for ids, entries, expiry in samples), samples[:5]


# --- scripts gone or refused, ids taken, Redis down --------------------------------------------


async def test_scripts_flushed_between_batches(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    first, second = bundles(pki, 2)
    assert isinstance((await store.bulk().add_many([first]))[0], CertRecord)
    await raw.script_flush()
    assert isinstance((await store.bulk().add_many([second]))[0], CertRecord)
    assert len(await events(raw)) == 2


async def test_without_script_permission_transactions_write_the_same(
    redis_store: RedisFixture,
    raw: redis.asyncio.Redis,
    ring: KeyRing,
    pki: PKI,
    fixed_clock: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = bundles(pki, 6)
    await raw.acl_setuser(
        "noscript", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    port = redis_store.url.rsplit(":", 1)[1].split("/")[0]
    limited = RedisStore(f"redis://noscript:pw@127.0.0.1:{port}", keyring=ring, prefix="ns:")
    scripted = RedisStore(redis_store.url, keyring=ring, prefix="s:")
    try:
        with caplog.at_level(logging.WARNING):
            first = await limited.bulk().add_many([*batch[:3], batch[0]])
            second = await limited.bulk().add_many(batch[3:])
        await scripted.bulk().add_many([*batch[:3], batch[0]])
        await scripted.bulk().add_many(batch[3:])
    finally:
        await limited.close()
        await scripted.close()
        await raw.acl_deluser("noscript")
    assert [type(r) for r in first] == [CertRecord, CertRecord, CertRecord, DuplicateCertificate]
    assert all(isinstance(r, CertRecord) for r in second)
    assert caplog.text.count("bulk adds now take one MULTI/EXEC") == 1  # logged once
    assert "pw@" not in caplog.text
    assert await snapshot(raw, Keys("ns:"), ring) == await snapshot(raw, Keys("s:"), ring)


async def test_an_id_already_taken_is_drawn_again(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    existing = await store.add(pki.bundle("old.bulk.test"))
    draws = iter([existing.id, existing.id, "00000000000000aa"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws))
    new = pki.bundle("new.bulk.test")
    prepared = (await store.bulk().encoder()).prepare(new, FIXED)
    assert isinstance((await store.bulk().add_prepared([prepared]))[0], IdTaken)
    (result,) = await store.bulk().add_many([new])
    assert isinstance(result, CertRecord)
    assert result.id == "00000000000000aa"
    found = await store.lookup("new.bulk.test")
    assert found is not None
    assert found.bundle == new
    assert await raw.zcard(KEYS.ids()) == 2


async def test_unreachable_redis_is_unavailable(ring: KeyRing, pki: PKI) -> None:
    gone = RedisStore(f"redis://127.0.0.1:{free_port()}/0", keyring=ring, timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable):
            await gone.bulk().add_many(bundles(pki, 2))
    finally:
        await gone.close()


async def test_no_plaintext_key_in_redis(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    batch = bundles(pki, 3)
    await store.bulk().add_many(batch)
    key_body = batch[0].pem.split(b"-----BEGIN PRIVATE KEY-----")[1].split(b"\n")[1]
    async for key in raw.scan_iter(match=KEYS.cert("*").encode()):
        values = await raw.get(key)
        assert b"PRIVATE KEY" not in values
        assert key_body not in values
    encoder = await store.bulk().encoder()
    assert "k1" in repr(encoder)
    assert repr(encoder.ring.keys[0][1]) not in repr(encoder)
    assert "fields" not in repr(encoder.prepare(batch[0], FIXED))


# --- packed writes (add_wire: what cert import's workers send) -------------------------------


async def wire(
    store: RedisStore, batch: list[CertBundle], now: dt.datetime = FIXED
) -> list[WireRecord]:
    encoder = await store.bulk().encoder()
    out = [encoder.encode(b, now) for b in batch]
    assert all(isinstance(r, WireRecord) for r in out)
    return [r for r in out if isinstance(r, WireRecord)]


async def test_packed_writes_store_what_add_many_stores(
    redis_store: RedisFixture, raw: redis.asyncio.Redis, ring: KeyRing, pki: PKI, fixed_clock: None
) -> None:
    batch = bundles(pki, 30)
    packed = RedisStore(redis_store.url, keyring=ring, prefix="wire:")
    prepared = RedisStore(redis_store.url, keyring=ring, prefix="prep:")
    try:
        records = await wire(packed, batch)
        results = await packed.bulk().add_wire(records)
        await prepared.bulk().add_many(batch)
    finally:
        await packed.close()
        await prepared.close()
    assert results == records  # each one added, in order
    assert await snapshot(raw, Keys("wire:"), ring) == await snapshot(raw, Keys("prep:"), ring)
    assert "command" not in repr(records[0])


async def test_packed_writes_find_duplicates_wrong_types_and_lost_scripts(
    store: RedisStore, raw: redis.asyncio.Redis, pki: PKI
) -> None:
    stored, new1, bad, new2 = bundles(pki, 4)
    first = await store.add(stored)
    await raw.set(KEYS.name("h2.bulk.test"), b"not a set")
    await raw.script_flush()  # the next write finds no script: it loads it and sends again
    again = (await wire(store, [new1]))[0]
    results = await store.bulk().add_wire([*(await wire(store, [stored, new1, bad, new2])), again])
    assert isinstance(results[0], DuplicateCertificate)
    assert first.id in str(results[0])
    assert isinstance(results[1], WireRecord)
    assert isinstance(results[2], StoreError)
    assert "is a string" in str(results[2])
    assert isinstance(results[3], WireRecord)
    assert isinstance(results[4], DuplicateCertificate)  # new1, under another id
    assert await raw.zcard(KEYS.ids()) == 3
    assert len(await events(raw)) == 3


async def test_packed_writes_without_script_permission_are_added_alone(
    redis_store: RedisFixture, raw: redis.asyncio.Redis, ring: KeyRing, pki: PKI,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    await raw.acl_setuser(
        "noscript", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    port = redis_store.url.rsplit(":", 1)[1].split("/")[0]
    limited = RedisStore(f"redis://noscript:pw@127.0.0.1:{port}", keyring=ring)
    try:
        with caplog.at_level(logging.WARNING):
            first = await limited.bulk().add_wire(await wire(limited, bundles(pki, 3)))
            # later batches are prepared records
            assert (await limited.bulk().encoder()).call is None
    finally:
        await limited.close()
        await raw.acl_deluser("noscript")
    assert [type(r) for r in first] == [AddAlone] * 3
    assert caplog.text.count("bulk adds now take one MULTI/EXEC") == 1  # logged once
    assert await raw.zcard(KEYS.ids()) == 0  # nothing written: each is added alone instead
