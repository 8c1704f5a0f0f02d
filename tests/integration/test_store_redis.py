"""RedisStore against a real redis-server started on a free port for this module."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import inspect
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle, parse_bundle, split_blocks
from certagent.errors import (
    ChangesLost,
    ConfigError,
    DuplicateCertificate,
    InvalidCursor,
    InvalidHostname,
    NotFound,
    StoreUnavailable,
)
from certagent.store import RedisStore, open_store
from certagent.store.base import CertRecord, Change, Store
from certagent.store.redis import Keys, _listing
from certagent.store.redis._lookup import LOOKUP_SCRIPT
from certagent.store.redis._packed import chain_pem, unpack
from certagent.testing.certs import CA, KeyType, issue, make_ca, shared_key
from certagent.testing.layout1 import add_layout1
from certagent.testing.redisha import ClusterSet

pytestmark = pytest.mark.integration

KEYS = Keys()
EVENTS = KEYS.events()


@dataclass(frozen=True)
class RedisServer:
    port: int
    unix_socket: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _free_port() -> int:
    for _ in range(20):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port != 6379:
            return port
    raise RuntimeError("no free port")


def _wait_ready(port: int, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


@pytest.fixture(scope="module")
def redis_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    workdir = tmp_path_factory.mktemp("redis")
    unix_socket = workdir / "redis.sock"
    port = _free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(workdir),
            "--unixsocket", str(unix_socket),
            "--unixsocketperm", "700",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_ready(port, proc, time.monotonic() + 10)
        yield RedisServer(port, unix_socket)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
async def raw(redis_instance: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A plain client to inspect and tamper with the key layout; flushes the db first."""
    client = redis.asyncio.Redis.from_url(redis_instance.url, decode_responses=False)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def k1_line() -> str:
    return keycrypt.generate_key_line("k1")


@pytest.fixture(scope="module")
def ring(k1_line: str) -> KeyRing:
    return KeyRing.from_text(k1_line)


#: Tests that look at the plain layout or its transactions: not run on a cluster.
_PLAIN_ONLY = {"test_each_write_is_one_transaction_with_its_event"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests that use only ``store`` (no raw client, no server of their own) run on a
    3-master Redis Cluster too: the store's contract does not depend on the layout."""
    asks = set(inspect.signature(metafunc.function).parameters)
    generic = "store" in asks and not asks & {"raw", "redis_instance"}
    if generic and metafunc.function.__name__ not in _PLAIN_ONLY:
        metafunc.parametrize("store", ["plain", "cluster"], indirect=True)


@pytest.fixture
async def store(
    request: pytest.FixtureRequest,
    redis_instance: RedisServer,
    raw: redis.asyncio.Redis,
    ring: KeyRing,
) -> AsyncIterator[RedisStore]:
    url = redis_instance.url
    if getattr(request, "param", "plain") == "cluster":
        cluster: ClusterSet = request.getfixturevalue("cluster_set")
        cluster.flushall()
        url = cluster.url
    s = RedisStore(url, keyring=ring)
    yield s
    await s.close()


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def bundle_for(
    ca: CA, *names: str, key_type: KeyType = "ec", not_after: dt.datetime | None = None
) -> CertBundle:
    return parse_bundle(*issue(ca, *names, key=shared_key(key_type), not_after=not_after))


def key_block(bundle: CertBundle) -> bytes:
    return bundle.pem[bundle.pem.index(b"-----BEGIN PRIVATE KEY") :]


def chain_part(bundle: CertBundle) -> bytes:
    return bundle.pem[: bundle.pem.index(b"-----BEGIN PRIVATE KEY")]


async def events(raw: redis.asyncio.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in await raw.xrange(EVENTS)]


async def all_values(raw: redis.asyncio.Redis) -> dict[bytes, list[bytes]]:
    """Every key and every value (hash fields, members, stream fields) in the db."""
    found: dict[bytes, list[bytes]] = {}
    async for key in raw.scan_iter(count=1000):
        kind = await raw.type(key)
        values: list[bytes]
        if kind == b"string":
            values = [await raw.get(key)]
        elif kind == b"hash":
            values = [v for pair in (await raw.hgetall(key)).items() for v in pair]
        elif kind == b"set":
            values = list(await raw.smembers(key))
        elif kind == b"zset":
            values = list(await raw.zrange(key, 0, -1))
        elif kind == b"stream":
            values = [
                v
                for entry_id, fields in await raw.xrange(key)
                for v in (entry_id, *fields.keys(), *fields.values())
            ]
        else:
            raise AssertionError(f"unexpected {kind!r} at {key!r}")
        found[key] = values
    return found


# --- add and the key layout ----------------------------------------------------------------


async def test_add_writes_the_documented_layout(
    store: RedisStore, raw: redis.asyncio.Redis, ring: KeyRing, ca: CA
) -> None:
    bundle = bundle_for(ca, "a.example.test", "*.example.test")
    record = await store.add(bundle)
    cert_id = record.id

    assert len(cert_id) == 16
    int(cert_id, 16)
    packed = unpack(await raw.get(f"certagent:cert:{cert_id}"))
    assert packed.key_token.startswith(b"cak2:k1:")
    assert packed.key_pem(ring, cert_id) == key_block(bundle)
    assert packed.meta() == {
        "names": b"a.example.test *.example.test",
        "fingerprint_sha256": bundle.fingerprint_sha256.encode(),
        "serial": format(bundle.serial, "X").encode(),
        "key_type": b"ECDSA-P256",
        "not_before": bundle.not_before.strftime("%Y-%m-%dT%H:%M:%SZ").encode(),
        "not_after": bundle.not_after.strftime("%Y-%m-%dT%H:%M:%SZ").encode(),
        "version": b"1",
        "updated_at": record.updated_at.strftime("%Y-%m-%dT%H:%M:%SZ").encode(),
        "managed": None,
    }
    leaf, intermediate = split_blocks(chain_part(bundle))
    assert packed.leaf_pem() == leaf[1]
    assert packed.chain_digest is not None
    chain_key = f"certagent:chain:{packed.chain_digest.hex()}"
    assert chain_pem(await raw.get(chain_key)) == intermediate[1]
    assert packed.ocsp is None and packed.dropped is None
    assert await raw.smembers("certagent:name:a.example.test") == {cert_id.encode()}
    assert await raw.smembers("certagent:name:*.example.test") == {cert_id.encode()}
    assert await raw.get(f"certagent:fp:{bundle.fingerprint_sha256}") == cert_id.encode()
    assert await raw.zrange("certagent:ids", 0, -1, withscores=True) == [(cert_id.encode(), 0)]
    assert await raw.zrange("certagent:expiry", 0, -1, withscores=True) == [
        (cert_id.encode(), bundle.not_after.timestamp())
    ]
    assert await events(raw) == [
        {b"kind": b"put", b"id": cert_id.encode(), b"names": b"a.example.test *.example.test"}
    ]
    assert sorted(await raw.keys("*")) == sorted(
        k.encode()
        for k in [
            f"certagent:cert:{cert_id}",
            "certagent:name:a.example.test",
            "certagent:name:*.example.test",
            f"certagent:fp:{bundle.fingerprint_sha256}",
            chain_key,
            "certagent:ids",
            "certagent:expiry",
            "certagent:events",
            "certagent:format",  # the store's format: a new store starts at the newest
        ]
    )
    assert await raw.hget("certagent:format", "format") == b"2"


async def test_add_returns_the_record(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test", "b.example.test", key_type="rsa")
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    record = await store.add(bundle)
    assert record.names == ("a.example.test", "b.example.test")
    assert record.fingerprint_sha256 == bundle.fingerprint_sha256
    assert record.serial == format(bundle.serial, "X")
    assert record.key_type == "RSA-2048"
    assert (record.not_before, record.not_after) == (bundle.not_before, bundle.not_after)
    assert record.version == 1
    assert record.updated_at >= before
    stored = await store.get(record.id)
    assert stored is not None
    assert stored == record


async def test_add_refuses_a_duplicate(store: RedisStore, raw: redis.asyncio.Redis, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = await store.add(bundle)
    with pytest.raises(DuplicateCertificate, match=record.id):
        await store.add(bundle)
    assert len(await events(raw)) == 1
    assert await store.put(bundle) == record.id  # put is idempotent
    assert len(await raw.keys("certagent:cert:*")) == 1


async def test_concurrent_adds_of_one_certificate(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    results = await asyncio.gather(*(store.add(bundle) for _ in range(8)), return_exceptions=True)
    added = [r for r in results if not isinstance(r, BaseException)]
    assert len(added) == 1
    assert all(isinstance(r, DuplicateCertificate) for r in results if r not in added)
    assert len(await store.lookup_all("a.example.test")) == 1


async def test_put_returns_the_new_id(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    cert_id = await store.put(bundle)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == cert_id
    assert found.bundle == bundle


async def test_no_keyring(redis_instance: RedisServer, store: RedisStore, ca: CA) -> None:
    await store.add(bundle_for(ca, "a.example.test"))
    bare = RedisStore(redis_instance.url)
    try:
        with pytest.raises(ConfigError, match="key_file"):
            await bare.add(bundle_for(ca, "b.example.test"))
        with pytest.raises(ConfigError, match="key_file"):
            await bare.put(bundle_for(ca, "b.example.test"))
        with pytest.raises(ConfigError, match="key_file"):
            await bare.lookup("a.example.test")
        assert await bare.lookup("c.example.test") is None  # nothing to decrypt
        assert (await bare.list()).records  # metadata needs no key
    finally:
        await bare.close()


# --- no key material in Redis ----------------------------------------------------------------


async def test_no_private_key_anywhere_in_redis(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    bundles = [
        bundle_for(ca, "a.example.test"),
        bundle_for(ca, "a.example.test", key_type="rsa"),
        bundle_for(ca, "*.example.test", "example.test"),
        parse_bundle(*issue(ca, "b.example.test")),  # a key of its own
    ]
    records = [await store.add(b) for b in bundles]
    await store.replace(records[0].id, bundle_for(ca, "a.example.test", "c.example.test"))
    await store.delete(records[3].id)

    # Base64 lines of the keys; a line can also be in a certificate (public-key bytes).
    chains = b"".join(chain_part(b) for b in bundles)
    key_lines = {
        line
        for b in bundles
        for line in key_block(b).splitlines()
        if line and not line.startswith(b"-----") and line not in chains
    }
    assert len(key_lines) >= 8
    found = await all_values(raw)
    assert len(found) >= 10
    for key, values in found.items():
        for value in [key, *values]:
            assert b"PRIVATE KEY" not in value, key
            assert not any(line in value for line in key_lines), key


# --- lookup ----------------------------------------------------------------------------------


async def test_lookup_exact(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = await store.add(bundle)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == record.id
    assert found.bundle == bundle
    assert await store.lookup("b.example.test") is None
    assert await store.lookup_all("b.example.test") == ()


async def test_lookup_all_prefers_ecdsa(store: RedisStore, ca: CA) -> None:
    rsa = bundle_for(ca, "a.example.test", key_type="rsa")
    ecdsa = bundle_for(ca, "a.example.test")
    rsa_id = (await store.add(rsa)).id
    ecdsa_id = (await store.add(ecdsa)).id
    found = await store.lookup_all("a.example.test")
    assert [(s.id, s.bundle) for s in found] == [(ecdsa_id, ecdsa), (rsa_id, rsa)]
    best = await store.lookup("a.example.test")
    assert best is not None
    assert best.id == ecdsa_id


async def test_lookup_wildcard(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "*.example.test")
    await store.add(bundle)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == bundle
    assert await store.lookup("example.test") is None
    assert await store.lookup("x.a.example.test") is None
    assert await store.lookup("a.other.test") is None


async def test_exact_name_beats_wildcard(store: RedisStore, ca: CA) -> None:
    wildcard_ec = bundle_for(ca, "*.example.test")
    wildcard_rsa = bundle_for(ca, "*.example.test", key_type="rsa")
    exact = bundle_for(ca, "a.example.test", key_type="rsa")
    for bundle in (wildcard_ec, exact, wildcard_rsa):
        await store.add(bundle)
    assert [s.bundle for s in await store.lookup_all("a.example.test")] == [exact]
    assert [s.bundle for s in await store.lookup_all("b.example.test")] == [
        wildcard_ec,
        wildcard_rsa,
    ]


async def test_lookup_all_is_one_round_trip(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key_type in ("ec", "rsa"):
        await store.add(bundle_for(ca, "*.example.test", key_type=key_type))
    await store.lookup_all("b.example.test")  # connect, and load the script (NOSCRIPT once)
    sent: list[object] = []
    original = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    await raw.config_resetstat()
    sent.clear()
    found = await store.lookup_all("a.example.test")
    assert len(found) == 2
    assert len(sent) == 1
    stats = await raw.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): value["calls"]
        for name, value in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls == {"evalsha": 1, "smembers": 2, "get": 2}


async def test_concurrent_lookups_after_a_script_flush(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    """A server that forgot the script (restarted, flushed) answers NOSCRIPT: lookups
    asked together (a storm) load it again and are answered."""
    exact = bundle_for(ca, "a.example.test")
    await store.add(exact)
    assert await store.lookup_all("a.example.test")
    await raw.script_flush()
    found = await asyncio.gather(*(store.lookup_all(n) for n in ["a.example.test"] * 3))
    assert [[s.bundle for s in f] for f in found] == [[exact]] * 3
    assert await raw.script_exists(*[hashlib.sha1(LOOKUP_SCRIPT.encode()).hexdigest()]) == [True]


async def test_concurrent_lookups_each_get_the_error(
    redis_instance: RedisServer, ring: KeyRing, ca: CA
) -> None:
    """A store that cannot be reached fails each of the lookups asked together."""
    dead = RedisStore(f"redis://127.0.0.1:{_free_port()}", keyring=ring)
    try:
        results = await asyncio.gather(
            *(dead.lookup_all(f"h{i}.example.test") for i in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, StoreUnavailable) for r in results), results
    finally:
        await dead.close()


async def test_lookup_without_script_permission_takes_two_round_trips(
    redis_instance: RedisServer,
    raw: redis.asyncio.Redis,
    ring: KeyRing,
    ca: CA,
    caplog: pytest.LogCaptureFixture,
) -> None:
    exact = bundle_for(ca, "a.example.test")
    wildcard = bundle_for(ca, "*.example.test")
    await raw.acl_setuser(
        "noscript", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    url = f"redis://noscript:pw@127.0.0.1:{redis_instance.port}"
    limited = RedisStore(url, keyring=ring)
    try:
        await limited.add(exact)
        await limited.add(wildcard)
        with caplog.at_level(logging.WARNING):
            assert [s.bundle for s in await limited.lookup_all("a.example.test")] == [exact]
            assert [s.bundle for s in await limited.lookup_all("b.example.test")] == [wildcard]
        assert caplog.text.count("lookups now take two round trips") == 1  # logged once
        assert "pw@" not in caplog.text
    finally:
        await limited.close()
        await raw.acl_deluser("noscript")


async def test_invalid_hostname_is_rejected(store: RedisStore, raw: redis.asyncio.Redis) -> None:
    await raw.sadd("certagent:name:../x", b"whatever")
    for name in ("../x", "*.example.test", "a b.test", "localhost"):
        with pytest.raises(InvalidHostname):
            await store.lookup(name)
        with pytest.raises(InvalidHostname):
            await store.lookup_all(name)


# --- replace and delete ------------------------------------------------------------------------


async def test_replace(store: RedisStore, raw: redis.asyncio.Redis, ca: CA) -> None:
    old = bundle_for(ca, "a.example.test", "b.example.test")
    new = bundle_for(ca, "a.example.test", "c.example.test", key_type="rsa")
    first = await store.add(old)
    record = await store.replace(first.id, new)

    assert record.id == first.id
    assert record.version == 2
    assert record.names == ("a.example.test", "c.example.test")
    assert record.fingerprint_sha256 == new.fingerprint_sha256
    assert await store.get(first.id) == record
    found = await store.lookup("c.example.test")
    assert found is not None
    assert (found.id, found.bundle) == (first.id, new)
    assert await store.lookup("b.example.test") is None
    assert await raw.exists("certagent:name:b.example.test") == 0
    assert await raw.get(f"certagent:fp:{old.fingerprint_sha256}") is None
    assert await raw.get(f"certagent:fp:{new.fingerprint_sha256}") == first.id.encode()
    assert await raw.zscore("certagent:expiry", first.id) == new.not_after.timestamp()
    assert (await events(raw))[-1] == {
        b"kind": b"put",
        b"id": first.id.encode(),
        b"names": b"a.example.test c.example.test b.example.test",
    }
    again = await store.replace(first.id, new)  # the same certificate again: a new version
    assert again.version == 3


async def test_replace_errors(store: RedisStore, ca: CA) -> None:
    one = await store.add(bundle_for(ca, "a.example.test"))
    other = bundle_for(ca, "b.example.test")
    await store.add(other)
    with pytest.raises(NotFound):
        await store.replace("0123456789abcdef", bundle_for(ca, "a.example.test"))
    with pytest.raises(NotFound):
        await store.replace("../../x", bundle_for(ca, "a.example.test"))
    with pytest.raises(DuplicateCertificate):
        await store.replace(one.id, other)
    assert (await store.get(one.id)) == one


async def test_concurrent_replaces_keep_the_index_consistent(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    record = await store.add(bundle_for(ca, "a.example.test"))
    bundles = [bundle_for(ca, "a.example.test", f"n{i}.example.test") for i in range(6)]
    results = await asyncio.gather(
        *(store.replace(record.id, b) for b in bundles), return_exceptions=True
    )
    done = [r for r in results if not isinstance(r, BaseException)]
    assert done, results
    final = await store.get(record.id)
    assert final is not None
    assert final.version == 1 + len(done)
    name_keys = sorted(k.decode() for k in await raw.keys("certagent:name:*"))
    assert name_keys == sorted(f"certagent:name:{n}" for n in final.names)
    assert len(await raw.keys("certagent:fp:*")) == 1
    assert len(await events(raw)) == 1 + len(done)


async def test_delete(store: RedisStore, raw: redis.asyncio.Redis, ca: CA) -> None:
    keep = await store.add(bundle_for(ca, "a.example.test"))
    gone_bundle = bundle_for(ca, "a.example.test", "*.example.test", key_type="rsa")
    gone = await store.add(gone_bundle)
    before = sorted(await raw.keys("*"))

    assert await store.delete(gone.id) == gone
    assert await store.get(gone.id) is None
    assert [s.id for s in await store.lookup_all("a.example.test")] == [keep.id]
    assert await store.lookup("b.example.test") is None
    after = sorted(await raw.keys("*"))
    assert set(before) - set(after) == {
        f"certagent:cert:{gone.id}".encode(),
        f"certagent:fp:{gone_bundle.fingerprint_sha256}".encode(),
        b"certagent:name:*.example.test",
    }
    assert await raw.zrange("certagent:ids", 0, -1) == [keep.id.encode()]
    assert await raw.zrange("certagent:expiry", 0, -1) == [keep.id.encode()]
    assert (await events(raw))[-1] == {
        b"kind": b"delete",
        b"id": gone.id.encode(),
        b"names": b"a.example.test *.example.test",
    }
    with pytest.raises(NotFound):
        await store.delete(gone.id)
    with pytest.raises(NotFound):
        await store.delete("no such id!")


async def test_get_unknown(store: RedisStore) -> None:
    assert await store.get("0123456789abcdef") is None
    assert await store.get("../etc/passwd") is None
    assert await store.get("") is None


async def test_each_write_is_one_transaction_with_its_event(
    store: RedisStore, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions: list[list[str]] = []
    original = Pipeline._execute_transaction

    async def spy(self: Pipeline, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        transactions.append([str(args[0]).upper() for args, _ in commands])
        return await original(self, connection, commands, raise_on_error)

    monkeypatch.setattr(Pipeline, "_execute_transaction", spy)
    record = await store.add(bundle_for(ca, "a.example.test", "b.example.test"))
    await store.replace(record.id, bundle_for(ca, "a.example.test", "c.example.test"))
    await store.delete(record.id)
    writes = [t for t in transactions if "XADD" in t]
    assert len(writes) == 3
    add, replace, delete = writes
    assert {"SET", "SADD", "ZADD", "XADD"} <= set(add)
    assert {"DEL", "SET", "SADD", "SREM", "ZADD", "XADD"} <= set(replace)
    assert {"DEL", "SREM", "ZREM", "XADD"} <= set(delete)


async def test_readers_never_see_data_without_its_event(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    """Sampled atomically, the number of records always equals the number of events."""
    bundles = [bundle_for(ca, f"h{i}.example.test") for i in range(20)]
    samples: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            async with raw.pipeline(transaction=True) as pipe:
                pipe.zcard(KEYS.ids())
                pipe.xlen(EVENTS)
                records, entries = await pipe.execute()
                samples.append((records, entries))
            await asyncio.sleep(0)

    observer = asyncio.create_task(observe())
    await asyncio.gather(*(store.add(b) for b in bundles))
    stop.set()
    await observer
    assert samples
    assert all(records == entries for records, entries in samples), samples
    assert await raw.xlen(EVENTS) == 20


# --- list ----------------------------------------------------------------------------------------


async def test_list_pages_in_id_order(store: RedisStore, ca: CA) -> None:
    added = [await store.add(bundle_for(ca, f"h{i}.example.test")) for i in range(5)]
    seen: list[CertRecord] = []
    cursor = None
    pages = 0
    while True:
        page = await store.list(cursor=cursor, limit=2)
        pages += 1
        seen.extend(page.records)
        cursor = page.cursor
        if cursor is None:
            break
    assert pages == 3
    assert [r.id for r in seen] == sorted(r.id for r in added)
    assert sorted(seen, key=lambda r: r.id) == sorted(added, key=lambda r: r.id)
    assert (await store.list(limit=5)).cursor is None


async def test_list_filters(store: RedisStore, ca: CA) -> None:
    now = dt.datetime.now(dt.UTC)
    soon = await store.add(bundle_for(ca, "a.example.test", not_after=now + dt.timedelta(days=5)))
    late = await store.add(
        bundle_for(ca, "a.example.test", key_type="rsa", not_after=now + dt.timedelta(days=60))
    )
    other = await store.add(bundle_for(ca, "*.example.test", not_after=now + dt.timedelta(days=6)))

    by_name = await store.list(name="a.example.test")
    assert {r.id for r in by_name.records} == {soon.id, late.id}
    assert [r.id for r in (await store.list(name="*.example.test")).records] == [other.id]
    assert (await store.list(name="b.example.test")).records == ()

    expiring = await store.list(expiring_before=now + dt.timedelta(days=30))
    assert [r.id for r in expiring.records] == sorted([soon.id, other.id])
    both = await store.list(name="a.example.test", expiring_before=now + dt.timedelta(days=30))
    assert [r.id for r in both.records] == [soon.id]

    first = await store.list(expiring_before=now + dt.timedelta(days=30), limit=1)
    assert len(first.records) == 1
    assert first.cursor is not None
    rest = await store.list(expiring_before=now + dt.timedelta(days=30), cursor=first.cursor)
    assert [r.id for r in first.records + rest.records] == sorted([soon.id, other.id])
    assert rest.cursor is None


@pytest.mark.parametrize("budget", [6, 20])
async def test_list_expiring_reads_a_bounded_share_of_the_ids_per_page(
    store: RedisStore, ca: CA, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    """More matches than the budget: ids read in chunks, at most the budget a page, no gaps.

    Fewer: the matches from the expiry index (ZRANGEBYSCORE), full pages.
    """
    monkeypatch.setattr(_listing, "SCAN_CHUNK", 3)
    monkeypatch.setattr(_listing, "SCAN_BUDGET", budget)
    now = dt.datetime.now(dt.UTC)
    expiring = []
    for i in range(14):
        days = 5 if i % 2 else 60
        record = await store.add(
            bundle_for(ca, f"x{i}.example.test", not_after=now + dt.timedelta(days=days))
        )
        if days == 5:
            expiring.append(record.id)
    client = store._client
    replies: list[tuple[str, int]] = []
    for command in ("zrangebylex", "zrangebyscore", "zmscore"):
        real = getattr(client, command)

        async def recorded(*args: Any, _real: Any = real, _name: str = command) -> Any:
            reply = await _real(*args)
            replies.append((_name, len(reply)))
            return reply

        monkeypatch.setattr(client, command, recorded)
    before = now + dt.timedelta(days=30)
    seen: list[str] = []
    sizes: list[int] = []
    cursor = None
    while True:
        replies.clear()
        page = await store.list(expiring_before=before, cursor=cursor, limit=2)
        seen += [r.id for r in page.records]
        sizes.append(len(page.records))
        assert sum(n for c, n in replies if c != "zmscore") <= budget + 1, replies
        cursor = page.cursor
        if cursor is None:
            break
        assert len(sizes) < 30
    assert seen == sorted(expiring)
    if budget < len(expiring):
        assert {c for c, _ in replies} <= {"zrangebylex", "zmscore"}
    else:
        assert sizes == [2, 2, 2, 1]


async def test_list_rejects_bad_arguments(store: RedisStore) -> None:
    with pytest.raises(InvalidCursor):
        await store.list(cursor="garbage")
    with pytest.raises(InvalidCursor):
        await store.list(cursor="c1.!!!")
    with pytest.raises(InvalidHostname):
        await store.list(name="../x")
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=0)


# --- change feed ---------------------------------------------------------------------------------


async def test_changes_from_an_empty_store(store: RedisStore, ca: CA) -> None:
    changes, position = await store.changes(None, 0)
    assert (changes, position) == ((), "0-0")
    assert await store.changes(position, 0) == ((), "0-0")
    record = await store.add(bundle_for(ca, "a.example.test"))
    changes, position = await store.changes(position, 0)
    assert changes == (Change("put", record.id, ("a.example.test",)),)
    assert position != "0-0"


async def test_changes_after_a_position(store: RedisStore, ca: CA) -> None:
    first = await store.add(bundle_for(ca, "a.example.test"))
    changes, start = await store.changes(None, 0)
    assert changes == ()
    record = await store.add(bundle_for(ca, "b.example.test", "*.example.test"))
    await store.replace(first.id, bundle_for(ca, "a.example.test", "c.example.test"))
    await store.delete(record.id)
    changes, position = await store.changes(start, 5)
    assert changes == (
        Change("put", record.id, ("b.example.test", "*.example.test")),
        Change("put", first.id, ("a.example.test", "c.example.test")),
        Change("delete", record.id, ("b.example.test", "*.example.test")),
    )
    started = time.monotonic()
    assert await store.changes(position, 0.2) == ((), position)
    assert 0.15 < time.monotonic() - started < 2


async def test_changes_waits_for_a_write(store: RedisStore, ca: CA) -> None:
    _, position = await store.changes(None, 0)
    waiting = asyncio.create_task(store.changes(position, 5))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    started = time.monotonic()
    record = await store.add(bundle_for(ca, "a.example.test"))
    changes, _ = await asyncio.wait_for(waiting, 2)
    assert time.monotonic() - started < 1
    assert changes == (Change("put", record.id, ("a.example.test",)),)


async def test_a_cancelled_wait_leaves_the_store_usable(store: RedisStore, ca: CA) -> None:
    _, position = await store.changes(None, 0)
    for _ in range(3):
        waiting = asyncio.create_task(store.changes(position, 5))
        await asyncio.sleep(0.1)
        waiting.cancel()
        # the wait ends at once, whatever redis-py does with the cancel (its Cluster client
        # has let one pass and blocked on: the read now runs in a task of its own)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 1)
    record = await store.add(bundle_for(ca, "a.example.test"))
    changes, _ = await asyncio.wait_for(store.changes(position, 2), 3)
    assert changes == (Change("put", record.id, ("a.example.test",)),)


async def test_changes_blocks_longer_than_the_client_timeout(
    redis_instance: RedisServer, raw: redis.asyncio.Redis, ring: KeyRing
) -> None:
    store = RedisStore(redis_instance.url, keyring=ring, timeout=0.3)
    try:
        _, position = await store.changes(None, 0)
        started = time.monotonic()
        assert await store.changes(position, 1.0) == ((), position)
        assert 0.9 < time.monotonic() - started < 3
    finally:
        await store.close()


async def test_changes_lost_after_trimming(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    await store.add(bundle_for(ca, "a.example.test"))
    _, position = await store.changes(None, 0)
    for i in range(3):
        await store.add(bundle_for(ca, f"h{i}.example.test"))
    assert len((await store.changes(position, 0))[0]) == 3
    assert await raw.xtrim(EVENTS, maxlen=1, approximate=False) == 3
    with pytest.raises(ChangesLost):
        await store.changes(position, 0)
    with pytest.raises(ChangesLost):
        await store.changes("0-0", 0)
    _, fresh = await store.changes(None, 0)
    assert await store.changes(fresh, 0) == ((), fresh)


async def test_events_maxlen_trims_the_stream(
    redis_instance: RedisServer, raw: redis.asyncio.Redis, ring: KeyRing, ca: CA
) -> None:
    await raw.config_set("stream-node-max-entries", 2)  # lets MAXLEN ~ trim to a few entries
    store = RedisStore(redis_instance.url, keyring=ring, events_maxlen=2)
    try:
        _, position = await store.changes(None, 0)
        for i in range(10):
            await store.add(bundle_for(ca, f"h{i}.example.test"))
        assert await raw.xlen(EVENTS) <= 4
        with pytest.raises(ChangesLost):
            await store.changes(position, 0)
    finally:
        await raw.config_set("stream-node-max-entries", 100)
        await store.close()


async def test_changes_rejects_foreign_positions(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    await store.add(bundle_for(ca, "a.example.test"))
    _, position = await store.changes(None, 0)
    for bad in ("garbage", "99999999999999-0", "1-2-3", ""):
        with pytest.raises(ChangesLost):
            await store.changes(bad, 0)
    await raw.delete(EVENTS)  # the feed was wiped: whatever it said is gone
    with pytest.raises(ChangesLost):
        await store.changes(position, 0)


# --- keys at rest: on records of both layouts ------------------------------------------------


@pytest.fixture(params=[1, 2], ids=["layout1", "layout2"])
def layout(request: pytest.FixtureRequest) -> int:
    return int(request.param)


async def add_as(
    layout: int, store: RedisStore, raw: redis.asyncio.Redis, ring: KeyRing, bundle: CertBundle
) -> CertRecord:
    """``bundle`` added by the store (layout 2) or as a store written before did (layout 1)."""
    if layout == 1:
        return await add_layout1(raw, KEYS, ring, bundle)
    return await store.add(bundle)


async def stored_token(raw: redis.asyncio.Redis, cert_id: str) -> bytes:
    """The key's token of a record of either layout."""
    if await raw.type(KEYS.cert(cert_id)) == b"hash":
        token = await raw.hget(KEYS.cert(cert_id), "key")
        assert token is not None
        return bytes(token)
    return unpack(await raw.get(KEYS.cert(cert_id))).key_token


async def set_stored(raw: redis.asyncio.Redis, cert_id: str, field: str, value: bytes) -> None:
    """Overwrite a record's ``key`` or ``chain`` (layout 1's fields; ``K``, ``L`` in layout 2)."""
    key = KEYS.cert(cert_id)
    if await raw.type(key) == b"hash":
        await raw.hset(key, field, value)
        return
    tag = {"key": "K", "chain": "L"}[field]
    await raw.set(key, unpack(await raw.get(key)).with_fields(**{tag: value}))


async def test_old_data_keys_still_decrypt_and_rotate(
    redis_instance: RedisServer,
    raw: redis.asyncio.Redis,
    store: RedisStore,
    ca: CA,
    k1_line: str,
    ring: KeyRing,
    layout: int,
) -> None:
    bundles = [bundle_for(ca, "a.example.test"), bundle_for(ca, "b.example.test", key_type="rsa")]
    records = [await add_as(layout, store, raw, ring, b) for b in bundles]  # encrypted with k1
    new_ring = KeyRing.from_text(f"{keycrypt.generate_key_line('k2')}\n{k1_line}\n")
    rotated = RedisStore(redis_instance.url, keyring=new_ring)
    try:
        found = await rotated.lookup("a.example.test")
        assert found is not None
        assert found.bundle == bundles[0]
        events_before = await raw.xlen(EVENTS)

        assert await rotated.rotate_keys() == 2
        for record in records:
            token = await stored_token(raw, record.id)
            # each record keeps its layout: a store of layout-1 records is at format 1
            assert token.startswith(b"cak1:k2:" if layout == 1 else b"cak2:k2:")
            assert await rotated.get(record.id) == record  # same version, same metadata
        assert await raw.xlen(EVENTS) == events_before
        assert await rotated.rotate_keys() == 0

        only_k2 = RedisStore(
            redis_instance.url, keyring=KeyRing(keys=(new_ring.keys[0],), current="k2")
        )
        try:
            for name, bundle in zip(("a.example.test", "b.example.test"), bundles, strict=True):
                found = await only_k2.lookup(name)
                assert found is not None
                assert found.bundle == bundle
        finally:
            await only_k2.close()
    finally:
        await rotated.close()


async def test_undecryptable_record_is_skipped_without_key_material(
    redis_instance: RedisServer,
    raw: redis.asyncio.Redis,
    store: RedisStore,
    ca: CA,
    ring: KeyRing,
    layout: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = await add_as(layout, store, raw, ring, bundle)
    token = await stored_token(raw, record.id)
    stranger = RedisStore(
        redis_instance.url, keyring=KeyRing.from_text(keycrypt.generate_key_line("k1"))
    )
    try:
        with caplog.at_level(logging.DEBUG):
            assert await stranger.lookup("a.example.test") is None
            assert await stranger.lookup_all("a.example.test") == ()
            assert await stranger.rotate_keys() == 0
    finally:
        await stranger.close()
    assert record.id in caplog.text
    assert "cannot decrypt" in caplog.text
    assert "PRIVATE KEY" not in caplog.text
    assert token.decode("latin-1") not in caplog.text
    assert token.decode("latin-1")[8:40] not in caplog.text
    for line in key_block(bundle).splitlines()[1:-1]:
        assert line.decode() not in caplog.text


async def test_a_key_moved_to_another_record_does_not_decrypt(
    store: RedisStore,
    raw: redis.asyncio.Redis,
    ca: CA,
    ring: KeyRing,
    layout: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = await add_as(layout, store, raw, ring, bundle_for(ca, "a.example.test"))
    b = await add_as(layout, store, raw, ring, bundle_for(ca, "b.example.test"))
    await set_stored(raw, a.id, "key", await stored_token(raw, b.id))  # same data key, wrong aad
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "belongs to another record" in caplog.text
    assert await store.lookup("b.example.test") is not None


async def test_a_layout1_token_in_a_layout2_record_does_not_decrypt(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA, ring: KeyRing
) -> None:
    """A layout-2 key is bound to its layout too: an old token copied in fails."""
    record = await store.add(bundle_for(ca, "a.example.test"))
    old = keycrypt.encrypt(ring, key_block(bundle_for(ca, "x.example.test")), record.id.encode())
    await set_stored(raw, record.id, "key", old)
    assert await store.lookup("a.example.test") is None


async def test_a_plaintext_key_is_refused(
    store: RedisStore,
    raw: redis.asyncio.Redis,
    ca: CA,
    ring: KeyRing,
    layout: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    record = await add_as(layout, store, raw, ring, bundle)
    await set_stored(raw, record.id, "key", key_block(bundle))
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "plaintext" in caplog.text
    assert "BEGIN PRIVATE KEY" not in caplog.text


# --- records that must not be served --------------------------------------------------------------


async def test_record_not_covering_the_name(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    record = await store.add(bundle_for(ca, "a.example.test"))
    await raw.sadd(KEYS.name("z.example.test"), record.id)
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("z.example.test") is None
    assert "covers only a.example.test" in caplog.text
    assert "PRIVATE KEY" not in caplog.text


async def test_corrupt_chain(
    store: RedisStore,
    raw: redis.asyncio.Redis,
    ca: CA,
    ring: KeyRing,
    layout: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rsa = await store.add(bundle_for(ca, "a.example.test", key_type="rsa"))
    ecdsa = await add_as(layout, store, raw, ring, bundle_for(ca, "a.example.test"))
    await set_stored(raw, ecdsa.id, "chain", b"garbage")
    with caplog.at_level(logging.WARNING):
        assert [s.id for s in await store.lookup_all("a.example.test")] == [rsa.id]
    assert ecdsa.id in caplog.text
    assert "not a valid bundle" in caplog.text


async def test_dangling_and_wrongly_typed_entries(
    store: RedisStore, raw: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await raw.sadd(KEYS.name("a.example.test"), "0" * 16)
    await raw.set(KEYS.name("b.example.test"), "0" * 32)  # the layout of certagent 0.1
    await raw.sadd(KEYS.name("c.example.test"), "x" * 16)
    await raw.set(KEYS.cert("x" * 16), b"a string, not a hash")
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
        assert await store.lookup("b.example.test") is None
        assert await store.lookup("c.example.test") is None
    assert "which is not a record" in caplog.text
    assert "it is not a set" in caplog.text


# --- availability and URLs ------------------------------------------------------------------------


async def test_custom_prefix(
    redis_instance: RedisServer, raw: redis.asyncio.Redis, ring: KeyRing, ca: CA
) -> None:
    store = RedisStore(redis_instance.url, prefix="t1:", keyring=ring)
    try:
        bundle = bundle_for(ca, "a.example.test")
        record = await store.add(bundle)
        assert await raw.exists(f"t1:cert:{record.id}", "t1:name:a.example.test", "t1:events") == 3
        assert await raw.keys("certagent:*") == []
        found = await store.lookup("a.example.test")
        assert found is not None
        assert found.bundle == bundle
        default = RedisStore(redis_instance.url, keyring=ring)
        try:
            assert await default.lookup("a.example.test") is None
        finally:
            await default.close()
    finally:
        await store.close()


async def test_ping(store: RedisStore) -> None:
    await store.ping()


async def test_unix_socket(
    redis_instance: RedisServer, raw: redis.asyncio.Redis, ring: KeyRing, ca: CA
) -> None:
    store: Store = open_store(f"unix://{redis_instance.unix_socket}?db=0", keyring=ring)
    try:
        await store.ping()
        bundle = bundle_for(ca, "a.example.test")
        await store.add(bundle)
        found = await store.lookup("a.example.test")
        assert found is not None
        assert found.bundle == bundle
    finally:
        await store.close()


async def test_unreachable_redis_is_unavailable(ca: CA, ring: KeyRing) -> None:
    store = RedisStore(f"redis://:secret@127.0.0.1:{_free_port()}/0", timeout=0.5, keyring=ring)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await store.ping()
        assert time.monotonic() - started < 3  # no long retry loop
        assert "secret" not in str(info.value)
        with pytest.raises(StoreUnavailable):
            await store.lookup("a.example.test")
        with pytest.raises(StoreUnavailable):
            await store.add(bundle_for(ca, "a.example.test"))
        with pytest.raises(StoreUnavailable):
            await store.changes(None, 0)
        with pytest.raises(StoreUnavailable):
            await store.list()
    finally:
        await store.close()


def test_describe_hides_password() -> None:
    store = RedisStore("redis://user:secret@127.0.0.1:6399/0")
    assert store.describe() == "redis://user:***@127.0.0.1:6399/0"


def test_events_maxlen_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        RedisStore("redis://127.0.0.1:6399/0", events_maxlen=0)
