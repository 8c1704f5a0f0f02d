"""RedisStore against a real redis-server started on a free port for this module."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio

from agent.errors import InvalidHostname, StoreUnavailable
from agent.pem import CertBundle, parse_bundle
from agent.store import RedisStore, open_store
from agent.store.base import Store
from agent.store.redis import Keys, record_id
from tests.certs import CA, issue, make_ca, shared_key

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class RedisServer:
    port: int
    unix_socket: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
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
async def raw(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A plain client to inspect and tamper with the key layout; flushes the db first."""
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=False)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis_server: RedisServer, raw: redis.asyncio.Redis) -> AsyncIterator[RedisStore]:
    s = RedisStore(redis_server.url)
    yield s
    await s.close()


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def bundle_for(ca: CA, *names: str) -> CertBundle:
    return parse_bundle(*issue(ca, *names, key=shared_key()))


KEYS = Keys()


# --- put and the key layout ------------------------------------------------------------------


async def test_put_writes_the_documented_layout(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    bundle = bundle_for(ca, "a.example.test", "*.example.test")
    cert_id = await store.put(bundle)

    assert cert_id == bundle.fingerprint_sha256[:32] == record_id(bundle)
    assert await raw.hgetall(f"certagent:cert:{cert_id}") == {
        b"pem": bundle.pem,
        b"names": b"a.example.test *.example.test",
    }
    assert await raw.get("certagent:name:a.example.test") == cert_id.encode()
    assert await raw.get("certagent:name:*.example.test") == cert_id.encode()
    assert sorted(await raw.keys("*")) == sorted(
        [
            f"certagent:cert:{cert_id}".encode(),
            b"certagent:name:a.example.test",
            b"certagent:name:*.example.test",
        ]
    )


async def test_put_is_idempotent(store: RedisStore, raw: redis.asyncio.Redis, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    assert await store.put(bundle) == await store.put(bundle)
    assert len(await raw.keys("*")) == 2


async def test_custom_prefix(redis_server: RedisServer, raw: redis.asyncio.Redis, ca: CA) -> None:
    store = RedisStore(redis_server.url, prefix="t1:")
    try:
        bundle = bundle_for(ca, "a.example.test")
        cert_id = await store.put(bundle)
        assert await raw.exists(f"t1:cert:{cert_id}", "t1:name:a.example.test") == 2
        assert await raw.keys("certagent:*") == []
        found = await store.lookup("a.example.test")
        assert found is not None
        assert found.bundle == bundle
        default = RedisStore(redis_server.url)
        try:
            assert await default.lookup("a.example.test") is None
        finally:
            await default.close()
    finally:
        await store.close()


# --- lookup -------------------------------------------------------------------------------------


async def test_lookup_exact(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "a.example.test")
    cert_id = await store.put(bundle)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == cert_id
    assert found.bundle == bundle
    assert await store.lookup("b.example.test") is None


async def test_lookup_wildcard(store: RedisStore, ca: CA) -> None:
    bundle = bundle_for(ca, "*.example.test")
    await store.put(bundle)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == bundle
    assert await store.lookup("example.test") is None
    assert await store.lookup("x.a.example.test") is None
    assert await store.lookup("a.other.test") is None


async def test_exact_beats_wildcard(store: RedisStore, ca: CA) -> None:
    wildcard = bundle_for(ca, "*.example.test")
    exact = bundle_for(ca, "a.example.test")
    await store.put(exact)
    await store.put(wildcard)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == exact
    found = await store.lookup("b.example.test")
    assert found is not None
    assert found.bundle == wildcard


async def test_lookup_is_two_round_trips(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    await store.put(bundle_for(ca, "*.example.test"))
    await store.ping()  # connect (HELLO/CLIENT SETINFO) before counting
    await raw.config_resetstat()
    assert await store.lookup("a.example.test") is not None
    stats = await raw.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): value["calls"]
        for name, value in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls == {"mget": 1, "hget": 1}


async def test_invalid_hostname_is_rejected(store: RedisStore, raw: redis.asyncio.Redis) -> None:
    await raw.set("certagent:name:../x", b"whatever")
    for name in ("../x", "*.example.test", "a b.test", "localhost"):
        with pytest.raises(InvalidHostname):
            await store.lookup(name)


# --- reindexing ---------------------------------------------------------------------------------


async def test_put_reindexes_names(store: RedisStore, raw: redis.asyncio.Redis, ca: CA) -> None:
    first = bundle_for(ca, "a.example.test", "b.example.test")
    second = bundle_for(ca, "a.example.test", "c.example.test")
    first_id = await store.put(first)
    second_id = await store.put(second)

    found_a = await store.lookup("a.example.test")
    found_b = await store.lookup("b.example.test")
    found_c = await store.lookup("c.example.test")
    assert found_a is not None
    assert found_a.id == second_id
    assert found_b is not None
    assert found_b.id == first_id  # still served by the older record that has it
    assert found_c is not None
    assert found_c.id == second_id
    # The old record stays (b still points to it).
    assert await raw.exists(KEYS.cert(first_id)) == 1


async def test_put_drops_stale_names_of_the_same_record(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    cert_id = record_id(bundle)
    # A previous version of this record claimed more names (e.g. written by an older tool).
    await raw.hset(
        KEYS.cert(cert_id),
        mapping={"pem": bundle.pem, "names": "a.example.test old.example.test moved.example.test"},
    )
    await raw.set(KEYS.name("old.example.test"), cert_id)
    await raw.set(KEYS.name("moved.example.test"), "f" * 32)  # already points elsewhere

    assert await store.put(bundle) == cert_id

    assert await raw.get(KEYS.name("old.example.test")) is None
    assert await raw.get(KEYS.name("moved.example.test")) == b"f" * 32
    assert await raw.hget(KEYS.cert(cert_id), "names") == b"a.example.test"
    assert await raw.get(KEYS.name("a.example.test")) == cert_id.encode()


async def test_put_replaces_extra_hash_fields(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    await raw.hset(KEYS.cert(record_id(bundle)), mapping={"pem": b"old", "junk": b"x"})
    await store.put(bundle)
    assert await raw.hkeys(KEYS.cert(record_id(bundle))) in ([b"pem", b"names"], [b"names", b"pem"])


# --- records that must not be served ------------------------------------------------------------


async def test_record_not_covering_the_name(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    cert_id = await store.put(bundle_for(ca, "a.example.test"))
    await raw.set(KEYS.name("z.example.test"), cert_id)
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("z.example.test") is None
    assert "covers only a.example.test" in caplog.text
    assert "PRIVATE KEY" not in caplog.text


async def test_corrupt_record(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    cert_id = await store.put(bundle)
    chain_only = bundle.pem[: bundle.pem.index(b"-----BEGIN PRIVATE KEY")]
    await raw.hset(KEYS.cert(cert_id), "pem", chain_only)
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert cert_id in caplog.text
    assert "no private key" in caplog.text

    await raw.hset(KEYS.cert(cert_id), "pem", b"garbage")
    assert await store.lookup("a.example.test") is None


async def test_dangling_name(
    store: RedisStore, raw: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await raw.set(KEYS.name("a.example.test"), "0" * 32)
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "not a record" in caplog.text


async def test_record_of_the_wrong_type(
    store: RedisStore, raw: redis.asyncio.Redis, ca: CA
) -> None:
    bundle = bundle_for(ca, "a.example.test")
    cert_id = record_id(bundle)
    await raw.set(KEYS.name("a.example.test"), cert_id)
    await raw.set(KEYS.cert(cert_id), b"a string, not a hash")
    assert await store.lookup("a.example.test") is None
    # put repairs it
    assert await store.put(bundle) == cert_id
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == bundle


# --- availability and URLs ------------------------------------------------------------------


async def test_ping(store: RedisStore) -> None:
    await store.ping()


async def test_unix_socket(redis_server: RedisServer, raw: redis.asyncio.Redis, ca: CA) -> None:
    store: Store = open_store(f"unix://{redis_server.unix_socket}?db=0")
    try:
        await store.ping()
        bundle = bundle_for(ca, "a.example.test")
        await store.put(bundle)
        found = await store.lookup("a.example.test")
        assert found is not None
        assert found.bundle == bundle
    finally:
        await store.close()


async def test_unreachable_redis_is_unavailable(ca: CA) -> None:
    store = RedisStore(f"redis://:secret@127.0.0.1:{_free_port()}/0", timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await store.ping()
        assert time.monotonic() - started < 3  # no long retry loop
        assert "secret" not in str(info.value)
        with pytest.raises(StoreUnavailable):
            await store.lookup("a.example.test")
        with pytest.raises(StoreUnavailable):
            await store.put(bundle_for(ca, "a.example.test"))
    finally:
        await store.close()


def test_describe_hides_password() -> None:
    store = RedisStore("redis://user:secret@127.0.0.1:6399/0")
    assert store.describe() == "redis://user:***@127.0.0.1:6399/0"
