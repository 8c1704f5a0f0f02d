"""First connections for never-seen hosts get their own certificate, verified."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from certagent.testing import PKI, RedisFixture, tlsclient
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration


def test_first_connection_of_200_new_hosts_is_verified(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    hosts = [f"site{i:03d}.first.test" for i in range(200)]
    redis_store.put([pki.bundle(h) for h in hosts])
    stack = make_stack(redis_store.url, capacity=250)

    failures: list[str] = []
    for host in hosts:
        try:
            info = stack.handshake(host)
        except OSError as exc:  # ssl.SSLCertVerificationError included
            failures.append(f"{host}: {exc!r}")
            continue
        if info.san != (host,) or info.issuer_cn != "certagent integration CA intermediate":
            failures.append(f"{host}: got {info.san} from {info.issuer_cn}")

    assert failures == []
    status = stack.status()
    assert status["ensure"]["loaded"] == 200
    assert status["ensure"]["store_lookups"] == 200
    assert status["slots_used"] == 200
    assert all(stack.serving_count(h) == 1 for h in hosts)


def test_100_concurrent_first_connections_over_20_hosts_load_each_once(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    hosts = [f"burst{i:02d}.concurrent.test" for i in range(20)]
    redis_store.put([pki.bundle(h) for h in hosts])
    stack = make_stack(redis_store.url, capacity=50)
    targets = [hosts[i % len(hosts)] for i in range(100)]
    context = tlsclient.client_context(stack.cafile)

    async def storm() -> list[tlsclient.CertInfo | BaseException]:
        # All 100 connections are opened at once, before any certificate is loaded.
        return await asyncio.gather(
            *(tlsclient.handshake_async(stack.port, h, context) for h in targets),
            return_exceptions=True,
        )

    results = asyncio.run(storm())

    failures = [
        f"{host}: {result!r}"
        for host, result in zip(targets, results, strict=True)
        if isinstance(result, BaseException) or result.san != (host,)
    ]
    assert failures == []
    assert {h: stack.serving_count(h) for h in hosts} == dict.fromkeys(hosts, 1)
    table = stack.settings.usage_table
    marks = [c for c in stack.runtime_commands() if c.startswith(f"set table {table} key ")]
    assert sorted(c.split()[4] for c in marks) == sorted(hosts)
    status = stack.status()
    assert status["ensure"]["loaded"] == 20
    assert status["ensure"]["store_lookups"] == 20
    assert status["loader"]["loads"] == 20


def test_wildcard_covers_one_label_only(make_stack: StackFactory, pki: PKI, tmp_path: Path) -> None:
    store = tmp_path / "certs"
    store.mkdir()
    (store / "_wildcard.example.test.pem").write_bytes(pki.combined_pem("*.example.test"))
    stack = make_stack(f"file://{store}", capacity=10)

    for host in ("a.example.test", "b.example.test", "a.example.test"):
        assert stack.handshake(host).san == ("*.example.test",), host

    for host in ("example.test", "x.a.example.test"):
        assert stack.hello(host.encode()) == stack.default_der, host
        with pytest.raises(ssl.SSLCertVerificationError):
            stack.handshake(host)

    status = stack.status(slots=True)
    assert status["slots_used"] == 1  # b.example.test reused a.example.test's slot
    assert status["loader"]["loads"] == 1
    assert status["loader"]["mark_only"] == 1
    assert status["loader"]["map_only"] == 1  # the old key, for one release
    assert status["ensure"]["unknown"] == 2
    assert stack.marked_hosts() == {
        "a.example.test": status["slots"][0]["slot"],
        "b.example.test": status["slots"][0]["slot"],
    }


def test_fallback_reject_closes_unknown_hosts(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle("known.reject.test")])
    stack = make_stack(redis_store.url, capacity=10, fallback="reject")

    assert stack.handshake("known.reject.test").san == ("known.reject.test",)
    # Unknown, invalid or missing names: closed before any certificate is sent.
    assert stack.hello(b"unknown.reject.test") is None
    assert stack.hello(b"bad name;.reject.test") is None
    assert stack.hello(None) is None
    with pytest.raises((ssl.SSLError, ConnectionError)):
        stack.handshake("unknown.reject.test")
    # The known host still works after the rejections.
    assert stack.handshake("known.reject.test").san == ("known.reject.test",)
    ensure = stack.status()["ensure"]
    assert (ensure["unknown"], ensure["negative_hits"]) == (1, 1)


@pytest.mark.timeout(120)
def test_storm_of_400_new_hosts_200_at_once_all_verified(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    """More simultaneous first connections than asyncio's default listen backlog (100) and
    redis-py's connection pool: every one is loaded and verified, none gets the fallback."""
    hosts = [f"storm{i:03d}.concurrent.test" for i in range(400)]
    redis_store.put([pki.bundle(h) for h in hosts], concurrency=50)
    stack = make_stack(redis_store.url, capacity=500, env={"CERTAGENT_LOG_LEVEL": "info"})
    context = tlsclient.client_context(stack.cafile)

    async def storm() -> list[tlsclient.CertInfo | BaseException]:
        gate = asyncio.Semaphore(200)

        async def one(host: str) -> tlsclient.CertInfo:
            async with gate:
                return await tlsclient.handshake_async(stack.port, host, context)

        return await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)

    results = asyncio.run(storm())
    failures = [
        f"{host}: {result!r}"
        for host, result in zip(hosts, results, strict=True)
        if isinstance(result, BaseException) or result.san != (host,)
    ]
    assert failures == [], failures[:5]
    status = stack.status()
    assert status["ensure"]["loaded"] == 400
    assert status["ensure"]["errors"] == status["ensure"]["busy"] == 0
