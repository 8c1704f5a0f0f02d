"""The REST API and ``certagent cert``/``keys`` against a RedisStore on a real redis-server."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from certagent.certs.keycrypt import generate_key_line
from certagent.certs.pem import parse_bundle
from certagent.cli.cert import add_cert_commands, run_cert_command
from certagent.config import Settings, to_toml
from certagent.store.base import Store
from certagent.store.redis._packed import unpack
from certagent.testing.certs import (
    CA,
    any_key_pem,
    cert_pem,
    combined,
    issue,
    issue_odd,
    key_pem,
    make_ca,
    make_key,
    make_odd_key,
    shared_key,
)
from tests.apihelp import check_response, listening_api
from tests.integration.conftest import RedisFixture

pytestmark = pytest.mark.integration

CERTS = "/v1/certificates"


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca("api integration CA")


@dataclass
class Running:
    url: str
    token: str
    settings: Settings
    store: Store
    session: aiohttp.ClientSession
    raw: redis.asyncio.Redis

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, str, Any]:
        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        async with self.session.request(method, self.url + path, headers=headers, **kwargs) as r:
            text = await r.text()
            return r.status, r.content_type, json.loads(text) if text else None

    async def keys(self) -> dict[bytes, Any]:
        """Every Redis key with its value (to prove a refused upload wrote nothing)."""
        found: dict[bytes, Any] = {}
        async for key in self.raw.scan_iter():
            kind = await self.raw.type(key)
            if kind == b"hash":
                found[key] = await self.raw.hgetall(key)
            elif kind == b"set":
                found[key] = await self.raw.smembers(key)
            elif kind == b"zset":
                found[key] = await self.raw.zrange(key, 0, -1, withscores=True)
            elif kind == b"string":
                found[key] = await self.raw.get(key)
            else:
                found[key] = kind
        return found


@pytest.fixture
async def running(redis_store: RedisFixture, tmp_path: Path) -> AsyncIterator[Running]:
    async with listening_api(redis_store.url, redis_store.key_file, tmp_path) as api:
        raw = redis.asyncio.Redis.from_url(redis_store.url)
        try:
            async with aiohttp.ClientSession() as session:
                yield Running(api.server.url, api.token, api.settings, api.store, session, raw)
        finally:
            await raw.aclose()


def _upload(chain: bytes, key: bytes | None) -> dict[str, str]:
    return {"chain": chain.decode(), **({"key": key.decode()} if key else {})}


async def test_upload_read_rotate_delete_on_redis(running: Running, ca: CA) -> None:
    chain, key = issue(ca, "api.example.test", "*.api.example.test")
    status, ctype, body = await running.call("POST", CERTS, json=_upload(chain, key))
    assert status == 201, body
    check_response(CERTS, "post", status, ctype, body)
    cert_id = body["id"]

    stored = await running.store.lookup("x.api.example.test")
    assert stored is not None and stored.id == cert_id
    assert stored.bundle.pem == parse_bundle(chain, key).pem
    raw_key = unpack(await running.raw.get(f"certagent:cert:{cert_id}")).key_token
    assert raw_key.startswith(b"cak2:k1:")  # encrypted at rest

    status, _, again = await running.call("POST", CERTS, json=_upload(chain, key))
    assert (status, again["code"]) == (409, "duplicate-certificate")

    status, ctype, got = await running.call("GET", f"{CERTS}/{cert_id}")
    assert status == 200 and got == body
    check_response(f"{CERTS}/{{id}}", "get", status, ctype, got)

    chain2, key2 = issue(ca, "api.example.test")
    status, ctype, rotated = await running.call(
        "PUT", f"{CERTS}/{cert_id}", json=_upload(chain2, key2)
    )
    assert status == 200, rotated
    check_response(f"{CERTS}/{{id}}", "put", status, ctype, rotated)
    assert (rotated["id"], rotated["version"], rotated["names"]) == (
        cert_id,
        2,
        ["api.example.test"],
    )
    assert await running.store.lookup("x.api.example.test") is None

    status, _, _ = await running.call("DELETE", f"{CERTS}/{cert_id}")
    assert status == 204
    for method in ("GET", "PUT", "DELETE"):
        status, ctype, problem = await running.call(
            method, f"{CERTS}/{cert_id}", json=_upload(chain2, key2)
        )
        assert (status, problem["code"]) == (404, "not-found")
        check_response(f"{CERTS}/{{id}}", method, status, ctype, problem)


async def test_list_pages_and_filters_on_redis(running: Running, ca: CA) -> None:
    soon = datetime.now(UTC) + timedelta(days=5)
    ids = set()
    for i in range(7):
        chain, key = issue(
            ca, f"l{i}.example.test", key=shared_key(), not_after=soon if i < 3 else None
        )
        status, _, body = await running.call("POST", CERTS, json=_upload(chain, key))
        assert status == 201
        ids.add(body["id"])
    seen: list[str] = []
    params: dict[str, str] = {"limit": "3"}
    while True:
        status, ctype, page = await running.call("GET", CERTS, params=params)
        assert status == 200
        check_response(CERTS, "get", status, ctype, page)
        seen += [item["id"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert sorted(seen) == sorted(ids)
    limit = (soon + timedelta(hours=1)).isoformat()
    _, _, page = await running.call("GET", CERTS, params={"expiring_before": limit})
    assert sorted(i["names"][0] for i in page["items"]) == [f"l{i}.example.test" for i in range(3)]
    _, _, page = await running.call("GET", CERTS, params={"name": "l5.example.test"})
    assert [i["names"] for i in page["items"]] == [["l5.example.test"]]
    status, _, problem = await running.call("GET", CERTS, params={"cursor": "garbage!"})
    assert (status, problem["code"]) == (400, "invalid-cursor")


async def test_refused_uploads_write_nothing_to_redis(running: Running, ca: CA) -> None:
    chain, key = issue(ca, "keep.example.test", key=shared_key())
    assert (await running.call("POST", CERTS, json=_upload(chain, key)))[0] == 201
    before = await running.keys()
    weak = make_odd_key("rsa1024")
    now = datetime.now(UTC)
    cases = [
        ((b"garbage\n", None), 400, "bad-pem"),
        ((issue(ca, "k.example.test")[0], key_pem(make_key())), 422, "key-mismatch"),
        ((issue(ca, "nokey.example.test")[0], None), 422, "missing-key"),
        (
            issue(
                ca,
                "old.example.test",
                not_before=now - timedelta(days=9),
                not_after=now - timedelta(days=1),
            ),
            422,
            "expired",
        ),
        (
            (cert_pem(issue_odd(ca, "weak.example.test", key=weak)), any_key_pem(weak)),
            422,
            "weak-key",
        ),
    ]
    for (c, k), want_status, want_code in cases:
        status, ctype, problem = await running.call("POST", CERTS, json=_upload(c, k))
        assert (status, problem["code"]) == (want_status, want_code), problem
        check_response(CERTS, "post", status, ctype, problem)
    huge = b"x" * (running.settings.max_upload_bytes * 2)
    status, _, problem = await running.call(
        "POST", CERTS, data=huge, headers={"Content-Type": "application/x-pem-file"}
    )
    assert (status, problem["code"]) == (413, "too-large")
    status, _, problem = await running.call(
        "POST", CERTS, json=_upload(chain, key), headers={"Authorization": "Bearer nope"}
    )
    assert (status, problem["code"]) == (403, "bad-token")
    assert await running.keys() == before


async def test_readyz_pings_redis(running: Running) -> None:
    async with running.session.get(running.url + "/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json())["checks"] == {"store": "ok", "haproxy": "ok"}


# --- the CLI against Redis ----------------------------------------------------------------------


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="certagent")
    add_cert_commands(parser.add_subparsers(dest="command", required=True))
    return run_cert_command(parser.parse_args(list(argv)))


def test_cli_import_and_key_rotation_on_redis(
    redis_store: RedisFixture, ca: CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(redis_store.key_file.read_text())
    cfg = tmp_path / "certagent.toml"
    cfg.write_text(to_toml(Settings(store=redis_store.url, key_file=str(keys))))
    source = tmp_path / "import"
    source.mkdir()
    for i in range(300):
        path = source / f"i{i:03d}.example.test.pem"
        if i == 137:
            path.write_bytes(b"-----BEGIN CERTIFICATE-----\ntruncated")
        else:
            path.write_bytes(combined(*issue(ca, f"i{i:03d}.example.test", key=shared_key())))

    assert _cli("cert", "import", "--config", str(cfg), str(source)) == 1
    out = capsys.readouterr()
    assert "299 added, 0 already stored, 1 failed" in out.out
    assert "skipped i137.example.test.pem: bad-pem" in out.err

    async def tokens() -> list[bytes]:
        client = redis.asyncio.Redis.from_url(redis_store.url)
        try:
            found = [
                await client.get(key) async for key in client.scan_iter("certagent:cert:*")
            ]
            return [unpack(raw).key_token for raw in found if isinstance(raw, bytes)]
        finally:
            await client.aclose()

    found = asyncio.run(tokens())
    assert len(found) == 299 and all(t.startswith(b"cak2:k1:") for t in found)

    keys.write_text(generate_key_line("k2") + "\n" + keys.read_text())
    assert _cli("keys", "rotate", "--config", str(cfg)) == 0
    assert "299" in capsys.readouterr().out
    assert all(t.startswith(b"cak2:k2:") for t in asyncio.run(tokens()))

    assert _cli("cert", "ls", "--config", str(cfg), "--name", "i042.example.test", "--json") == 0
    [record] = json.loads(capsys.readouterr().out)
    assert record["names"] == ["i042.example.test"]
    assert _cli("cert", "rm", "--config", str(cfg), record["id"]) == 0
