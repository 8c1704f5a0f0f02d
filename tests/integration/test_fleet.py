"""A fleet acts as one: 3 nodes (HAProxy + agent each) on one store.

Sessions resume on any node (shared ticket keys, rotated at runtime, kept across
an HAProxy reload); an upload through any node's API is served by every node
within a second, on one Redis, a Sentinel-watched one and a Redis Cluster; a
store that restarts empty unloads nothing; a node made with its own data key
refuses to start against the fleet's store.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from pathlib import Path

import pytest

from certagent.api import add_token
from certagent.testing import PKI, RedisFixture, RedisProcess, Stack, free_port, wait_for
from certagent.testing.resume import ResumingClient
from tests.integration.conftest import STORE_KINDS, StackFactory

pytestmark = pytest.mark.integration

NODES = 3


def keys_pushed(node: Stack) -> bool | None:
    return (node.status()["tickets"] or {}).get("in_haproxy") or None


def fleet(make_stack: StackFactory, url: str, **env: str) -> list[Stack]:
    nodes = [make_stack(url, env=env) for _ in range(NODES)]
    for node in nodes:
        wait_for(lambda n=node: keys_pushed(n), 10.0, "the fleet's ticket keys in HAProxy")
    return nodes


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_sessions_resume_on_every_node_across_a_rotation_and_a_reload(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, version: ssl.TLSVersion
) -> None:
    host = "resume.fleet.test"
    redis_store.put([pki.bundle(host)])
    nodes = fleet(make_stack, redis_store.url)
    generation = nodes[0].status()["tickets"]["generation"]
    assert {n.status()["tickets"]["generation"] for n in nodes} == {generation}
    events: list[str] = []

    def between(i: int) -> None:
        if i == 333:  # an operator rotates on node 0: every node follows
            rotated = nodes[0].cli("tls-keys", "rotate")
            assert rotated.returncode == 0, rotated.stderr
            wait_for(
                lambda: all(n.status()["tickets"]["generation"] == generation + 1 for n in nodes)
                or None,
                5.0,
                "every node on the new ring",
            )
            events.append(f"rotated at #{i}: {rotated.stdout.strip()}")
        if i == 666:  # node 1's HAProxy reloads: its new worker reads the keys file
            nodes[1].reload_haproxy()
            events.append(f"reloaded node 1 at #{i}")

    client = ResumingClient([n.port for n in nodes], host, str(pki.cafile), version)
    report = client.run(1000, between)
    print(
        json.dumps(
            {
                "tls": version.name,
                "connections": report.connections,
                "resumed": report.resumed,
                "ratio": round(report.ratio, 4),
                "full_handshakes": report.full,
                "errors": report.errors[:5],
                "events": events,
            }
        )
    )
    assert not report.errors
    assert report.connections == 1000
    assert report.ratio >= 0.99, report.full
    for node in nodes:
        assert node.status()["tickets"]["generation"] == generation + 1


@pytest.mark.parametrize("any_store", STORE_KINDS, indirect=True)
def test_an_upload_through_any_node_is_served_by_every_node_within_a_second(
    make_stack: StackFactory, any_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "fleet")
    ids: list[str] = []
    binds = [f"127.0.0.1:{free_port()}" for _ in range(NODES)]
    nodes = [
        make_stack(
            any_store.url,
            env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": bind},
        )
        for bind in binds
    ]
    for i, bind in enumerate(binds):
        host = f"upload{i}.fleet.test"
        chain, key = pki.chain_and_key(host)
        request = urllib.request.Request(
            f"http://{bind}/v1/certificates",
            data=chain + key,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-pem-file"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 201
            body = reply.read()
        uploaded = time.monotonic()
        served: dict[int, float] = {}
        while len(served) < NODES and time.monotonic() - uploaded < 3.0:
            for n, node in enumerate(nodes):
                if n not in served and node.hello(host.encode()) != node.default_der:
                    served[n] = time.monotonic() - uploaded
        print(f"{any_store.url.split(':')[0]}: upload via node {i}: served after {served}")
        assert len(served) == NODES, served
        assert max(served.values()) <= 1.0, served
        for node in nodes:
            assert node.handshake(host).san == (host,)
        ids.append(json.loads(body)["id"])

    # every node has the hosts loaded now: a rotation and a delete reach them through the
    # store's change feed (on a cluster: the {global} stream, read with XREAD)
    host = "upload0.fleet.test"
    chain, key = pki.chain_and_key(host)
    old_serial = nodes[0].handshake(host).serial
    call(binds[1], token, "PUT", f"/v1/certificates/{ids[0]}", chain + key, 200)
    changed = time.monotonic()
    wait_for(
        lambda: all(n.handshake(host).serial != old_serial for n in nodes) or None,
        1.0,
        "every node to serve the rotated certificate",
    )
    rotated_after = time.monotonic() - changed
    call(binds[2], token, "DELETE", f"/v1/certificates/{ids[0]}", b"", 204)
    changed = time.monotonic()
    wait_for(
        lambda: all(n.hello(host.encode()) == n.default_der for n in nodes) or None,
        1.0,
        "every node to unload the deleted certificate",
    )
    print(
        f"{any_store.url.split(':')[0]}: rotated on every node after {rotated_after:.3f}s,"
        f" deleted after {time.monotonic() - changed:.3f}s"
    )


def call(bind: str, token: str, method: str, path: str, data: bytes, status: int) -> bytes:
    request = urllib.request.Request(
        f"http://{bind}{path}",
        data=data or None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-pem-file"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == status
        return bytes(reply.read())


def test_a_store_restarted_empty_unloads_nothing(
    make_stack: StackFactory, key_file: Path, pki: PKI, tmp_path: Path
) -> None:
    redis = RedisProcess(tmp_path / "redis").start()
    try:
        store = RedisFixture(redis.url, key_file)
        loaded = [f"kept{i}.empty.test" for i in range(20)]
        later = [f"later{i}.empty.test" for i in range(5)]
        bundles = {h: pki.bundle(h) for h in [*loaded, *later]}
        store.put(bundles.values())
        nodes = [make_stack(redis.url) for _ in range(2)]
        for node in nodes:
            for host in loaded:
                assert node.handshake(host).san == (host,)

        port = redis.port
        redis.stop()
        redis.start(port=port)  # no persistence: empty
        # the agents notice (change feed errors, then a lost position) and check every slot
        wait_for(
            lambda: all(n.status()["live"]["orphans"] == len(loaded) for n in nodes) or None,
            20.0,
            "every node to find its loaded certificates missing from the store",
        )
        deadline = time.monotonic() + 5.0
        rounds = 0
        while time.monotonic() < deadline:
            for node in nodes:
                for host in loaded:
                    assert node.hello(host.encode()) != node.default_der, host
            rounds += 1
        for node in nodes:
            st = node.status()
            assert st["live"]["unloaded"] == 0 and st["slots_used"] == len(loaded)
            assert node.hello(later[0].encode()) == node.default_der  # the store lacks it
            assert "not in the store" in node.agent_log()

        store.put(bundles.values())  # re-import: everything is back
        for node in nodes:
            wait_for(lambda n=node: n.status()["live"]["orphans"] == 0 or None, 10.0, "no orphan")
            for host in [*loaded, *later]:
                assert node.handshake(host).san == (host,)
        print(f"{rounds} rounds of {len(loaded)} loaded hosts on {len(nodes)} nodes, no fallback")
    finally:
        redis.stop()


def test_a_node_with_its_own_data_key_refuses_to_start_then_joins_with_the_fleets(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    redis_store.put([pki.bundle("joined.fleet.test")])
    fleet_node = make_stack(redis_store.url)
    assert fleet_node.handshake("joined.fleet.test").san == ("joined.fleet.test",)

    # `certagent init` of its own: a new data key, not the fleet's
    loner = Stack.create(tmp_path / "loner", store=redis_store.url, cafile=pki.cafile)
    try:
        loner.start_haproxy()
        agent = loner.start_agent(wait=False)
        assert agent.wait(timeout=30) == 1
        log = loner.agent_log()
        own_kid = (loner.directory / "data.key").read_text().split(":", 1)[0]
        shared_kid = Path(redis_store.key_file).read_text().split(":", 1)[0]
        assert f"data key {shared_kid}" in log, log[-2000:]
        assert own_kid in log and "--data-key" in log
    finally:
        loner.close()

    joined = Stack.create(
        tmp_path / "joined",
        store=redis_store.url,
        cafile=pki.cafile,
        init_args=("--data-key", str(redis_store.key_file)),
    )
    try:
        joined.start_haproxy()
        joined.start_agent()
        assert joined.handshake("joined.fleet.test").san == ("joined.fleet.test",)
    finally:
        joined.close()
