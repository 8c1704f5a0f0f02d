"""No write the fleet cannot read: data keys announced, foreign ones refused, unreadable ones named.

Real agents on a real Redis: each announces the data keys its key file holds;
``certagent cert add --config`` and an upload through an agent's REST API are
refused (exit 1 / 409 ``foreign-data-key``, naming both keys, nothing written)
when a running agent lacks the writer's key; a record written behind the
agents' backs with another key (or altered) is named, with its data key, in the
agent's log, ``certagent status`` and ``/metrics``.  A directory store keeps
plaintext keys: nothing to check there.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from certagent.api import add_token
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.store.redis._packed import unpack
from certagent.testing import PKI, RedisFixture, Stack, free_port, wait_for
from certagent.testing.processes import certagent_argv
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

HOLDERS = "certagent:datakeys"


def new_key_file(path: Path, *, then: Path | None = None) -> tuple[Path, str]:
    """A key file whose current key is new (a fingerprint kid), ``then``'s keys after it."""
    line = generate_key_line()
    path.write_text(line + "\n" + (then.read_text() if then is not None else ""))
    path.chmod(0o600)
    return path, line.partition(":")[0]


def announced(url: str) -> dict[bytes, bytes]:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        found: dict[bytes, bytes] = client.hgetall(HOLDERS)
        return found


def store_dump(url: str) -> dict[bytes, Any]:
    """Every key but the announcements (they beat), with its value: to prove nothing was written."""
    found: dict[bytes, Any] = {}
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        for key in client.scan_iter():
            if key == HOLDERS.encode():
                continue
            kind = client.type(key)
            if kind == b"hash":
                found[key] = client.hgetall(key)
            elif kind == b"set":
                found[key] = client.smembers(key)
            elif kind == b"zset":
                found[key] = client.zrange(key, 0, -1, withscores=True)
            elif kind == b"string":
                found[key] = client.get(key)
            elif kind == b"stream":
                found[key] = client.xlen(key)
            else:
                found[key] = kind
    return found


def record_ids(url: str, host: str) -> list[str]:
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        return sorted(m.decode() for m in client.smembers(f"certagent:name:{host}"))


def cert_add(
    node: Stack, pki: PKI, host: str, tmp_path: Path, key_file: Path | None
) -> subprocess.CompletedProcess[str]:
    """``certagent cert add --config <the node's>``, with ``CERTAGENT_KEY_FILE=key_file`` if set."""
    chain, key = pki.chain_and_key(host)
    (tmp_path / f"{host}.crt").write_bytes(chain)
    (tmp_path / f"{host}.key").write_bytes(key)
    env = {k: v for k, v in node.env.items() if k != "CERTAGENT_KEY_FILE"}
    if key_file is not None:
        env["CERTAGENT_KEY_FILE"] = str(key_file)
    return subprocess.run(
        [
            *certagent_argv(), "cert", "add", "--config", str(node.config_path),
            "--cert", str(tmp_path / f"{host}.crt"), "--key", str(tmp_path / f"{host}.key"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip


def upload(bind: str, token: str, pki: PKI, host: str) -> tuple[int, dict[str, Any]]:
    chain, key = pki.chain_and_key(host)
    request = urllib.request.Request(
        f"http://{bind}/v1/certificates",
        data=chain + key,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-pem-file"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"].startswith("application/problem+json")
        return exc.code, json.loads(exc.read())


def test_cert_add_with_a_key_file_the_fleet_lacks_is_refused_and_the_store_unchanged(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, key_file: Path, tmp_path: Path
) -> None:
    redis_store.put([pki.bundle("before.keys.test")])
    node = make_stack(redis_store.url)
    fleet_kid = KeyRing.from_file(key_file).current
    wait_for(lambda: announced(redis_store.url) or None, 10.0, "the agent's data keys announced")
    stale, stale_kid = new_key_file(tmp_path / "stale.key")
    host = "stale.keys.test"
    before = store_dump(redis_store.url)

    refused = cert_add(node, pki, host, tmp_path, stale)
    print(refused.stderr)
    assert refused.returncode == 1
    assert "refusing to store" in refused.stderr
    assert f"data key {stale_kid}," in refused.stderr  # the writer's
    assert f"they hold data key {fleet_kid} (fingerprint k" in refused.stderr  # the fleet's
    assert node.status()["data_keys"]["node"] in refused.stderr  # the agent lacking it
    assert "CERTAGENT_KEY_FILE" in refused.stderr and "keys rotate" in refused.stderr
    assert store_dump(redis_store.url) == before
    assert node.hello(host.encode()) == node.default_der

    # the configuration's own key file (`init --data-key` made it the agent's): stored, served
    added = cert_add(node, pki, host, tmp_path, None)
    assert added.returncode == 0, added.stderr
    assert node.handshake(host).san == (host,)

    # the agent stops and withdraws; the stored records still say which key the fleet uses
    node.stop_agent()
    assert announced(redis_store.url) == {}
    again = cert_add(node, pki, "stale2.keys.test", tmp_path, stale)
    assert again.returncode == 1
    assert f"lacks data key {fleet_kid}," in again.stderr, again.stderr
    assert record_ids(redis_store.url, "stale2.keys.test") == []


def test_an_upload_through_an_agent_whose_key_another_agent_lacks_gets_a_409(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, key_file: Path, tmp_path: Path
) -> None:
    """Half-way through a key change: node `new` has the new key first, node `old` only k1."""
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "keys")
    old_bind, new_bind = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    old = make_stack(
        redis_store.url,
        env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": old_bind},
    )
    rotated, new_kid = new_key_file(tmp_path / "rotated.key", then=key_file)
    new = Stack.create(
        tmp_path / "new",
        store=redis_store.url,
        cafile=pki.cafile,
        key_file=rotated,
        env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": new_bind},
    )
    try:
        new.start_haproxy()
        new.start_agent()
        wait_for(lambda: len(announced(redis_store.url)) == 2 or None, 10.0, "two agents")
        before = store_dump(redis_store.url)

        status, problem = upload(new_bind, token, pki, "new.keys.test")
        print(problem)
        assert (status, problem["code"]) == (409, "foreign-data-key")
        assert f"data key {new_kid}," in problem["detail"]
        assert "they hold data key k1 (fingerprint k" in problem["detail"]
        assert old.status()["data_keys"]["node"] in problem["detail"]
        assert store_dump(redis_store.url) == before
        assert "refusing to store" in new.agent_log()

        # the other way round: node `new` holds k1 too, so both serve what `old` stores
        status, record = upload(old_bind, token, pki, "old.keys.test")
        assert status == 201, record
        for node in (old, new):
            wait_for(
                lambda n=node: n.hello(b"old.keys.test") != n.default_der or None,
                5.0,
                "both nodes serve the upload",
            )
    finally:
        new.close()


def test_a_record_the_agent_cannot_decrypt_is_named_in_its_log_status_and_metrics(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    bind = f"127.0.0.1:{free_port()}"
    node = make_stack(redis_store.url, env={"CERTAGENT_METRICS_BIND": bind})
    other, other_kid = new_key_file(tmp_path / "other.key")
    # behind the agent's back: one record with a key it lacks, one altered after it was stored
    foreign, altered = "foreign.keys.test", "altered.keys.test"
    RedisFixture(redis_store.url, other).put([pki.bundle(foreign)])
    redis_store.put([pki.bundle(altered)])
    [foreign_id] = record_ids(redis_store.url, foreign)
    [altered_id] = record_ids(redis_store.url, altered)
    with redis.Redis.from_url(redis_store.url, socket_timeout=5) as client:
        packed = unpack(client.get(f"certagent:cert:{altered_id}"))
        token = packed.key_token
        middle = len(token) - 20
        flipped = bytes([token[middle] ^ 0x01])
        client.set(
            f"certagent:cert:{altered_id}",
            packed.with_fields(K=token[:middle] + flipped + token[middle + 1 :]),
        )
        foreign_token = unpack(client.get(f"certagent:cert:{foreign_id}")).key_token

    for host in (foreign, altered):
        assert node.hello(host.encode()) == node.default_der  # the fallback
    records = {r["id"]: r for r in node.status()["data_keys"]["undecryptable"]["records"]}
    assert records[foreign_id]["name"] == foreign
    assert records[foreign_id]["key_id"] == other_kid
    assert "not in the key ring" in records[foreign_id]["reason"]
    assert records[altered_id]["name"] == altered
    assert records[altered_id]["key_id"] == "k1"
    assert "cannot decrypt this record" in records[altered_id]["reason"]

    # the first one met (a warning that repeats is rate-limited: status lists every one)
    line = f"cannot decrypt store record {foreign_id} for {foreign} (data key {other_kid})"
    wait_for(lambda: line in node.agent_log() or None, 5.0, "the warning naming the record")
    log = node.agent_log()
    sealed = foreign_token.split(b":", 2)[-1]
    assert sealed.hex() not in log and repr(sealed)[2:40] not in log  # no key material

    shown = node.command("status")
    assert f"{foreign}: record {foreign_id}, data key {other_kid}" in shown.stdout, shown.stdout
    assert "UNDECRYPTABLE 2 record(s)" in shown.stdout

    with urllib.request.urlopen(f"http://{bind}/metrics", timeout=5) as reply:
        metrics = reply.read().decode()
    for kid in (other_kid, "k1"):
        found = re.search(
            rf'^certagent_undecryptable_records_total{{key_id="{kid}"}} (\S+)$', metrics, re.M
        )
        assert found is not None and float(found.group(1)) >= 1, metrics
    assert re.search(r"^certagent_undecryptable_records_listed 2\.0$", metrics, re.M)


def test_a_directory_store_keeps_plain_keys_so_no_data_key_is_checked(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    store = tmp_path / "certs"
    node = make_stack(f"file://{store}", capacity=10)
    assert node.status()["data_keys"] is None
    host = "dir.keys.test"
    added = cert_add(node, pki, host, tmp_path, None)
    assert added.returncode == 0, added.stderr
    assert node.handshake(host).san == (host,)
