"""The REST API against a store: every route, the body formats, auth, health and readiness."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from certagent.api import LoadedSlot, loaded_slots
from certagent.certs.pem import parse_bundle
from certagent.runtime.pool import Slot
from certagent.store import DirectoryStore
from certagent.store.base import Store
from certagent.testing.certs import CA, combined, issue, make_ca, shared_key
from tests.apihelp import STORE_KINDS, Api, check_response, make_store, running_api
from tests.memstore import MemoryStore

CERTS = "/v1/certificates"


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path)


@pytest.fixture
async def api(store: Store, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path) as api:
        yield api


async def post_json(api: Api, chain: bytes, key: bytes | None) -> aiohttp.ClientResponse:
    body = {"chain": chain.decode(), **({"key": key.decode()} if key is not None else {})}
    return await api.client.post(CERTS, json=body, headers=api.auth)


# --- uploads: the three body formats ---------------------------------------------------------


async def test_post_json_stores_and_answers_metadata(api: Api, ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", "*.a.example.test")
    resp = await post_json(api, chain, key)
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    check_response(CERTS, "post", 201, "application/json", body)
    bundle = parse_bundle(chain, key)
    assert body["names"] == ["a.example.test", "*.a.example.test"]
    assert body["fingerprint_sha256"] == bundle.fingerprint_sha256
    assert body["serial"] == f"{bundle.serial:X}"
    assert body["key_type"] == "ECDSA-P256"
    assert body["version"] == 1
    assert datetime.fromisoformat(body["not_after"]) == bundle.not_after
    assert resp.headers["Location"] == f"{CERTS}/{body['id']}"
    assert "PRIVATE" not in await resp.text()
    stored = await api.store.lookup("a.example.test")
    assert stored is not None and stored.id == body["id"]
    assert stored.bundle.pem == bundle.pem


async def test_post_combined_pem_body(api: Api, ca: CA) -> None:
    pem = combined(*issue(ca, "pem.example.test", key=shared_key()))
    for ctype in ("application/x-pem-file", "text/plain", "application/pem-certificate-chain"):
        await api.store.delete((await api.records())[0].id) if await api.records() else None
        resp = await api.client.post(CERTS, data=pem, headers={**api.auth, "Content-Type": ctype})
        assert resp.status == 201, (ctype, await resp.text())
        assert (await resp.json())["names"] == ["pem.example.test"]


async def test_post_json_combined_pem_without_key_field(api: Api, ca: CA) -> None:
    chain, key = issue(ca, "comb.example.test", key=shared_key())
    resp = await post_json(api, chain + key, None)
    assert resp.status == 201, await resp.text()


@pytest.mark.parametrize("kind", ["files", "fields", "urlencoded"])
async def test_post_form_fields_or_files(api: Api, ca: CA, kind: str) -> None:
    chain, key = issue(ca, "form.example.test", key=shared_key())
    form = aiohttp.FormData(default_to_multipart=kind != "urlencoded")
    if kind == "files":
        form.add_field("chain", chain, filename="fullchain.pem", content_type="text/plain")
        form.add_field("key", key, filename="privkey.pem", content_type="text/plain")
    else:
        form.add_field("chain", chain.decode())
        form.add_field("key", key.decode())
    resp = await api.client.post(CERTS, data=form, headers=api.auth)
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["names"] == ["form.example.test"]


async def test_same_certificate_again_is_409(api: Api, ca: CA) -> None:
    chain, key = issue(ca, "dup.example.test", key=shared_key())
    assert (await post_json(api, chain, key)).status == 201
    before = await api.records()
    resp = await post_json(api, chain, key)
    assert resp.status == 409
    body = await resp.json()
    check_response(CERTS, "post", 409, "application/problem+json", body)
    assert body["code"] == "duplicate-certificate"
    assert await api.records() == before


# --- read, list, rotate, delete ------------------------------------------------------------


async def test_get_put_delete_cycle(api: Api, ca: CA) -> None:
    chain, key = issue(ca, "rot.example.test", key=shared_key())
    created = await (await post_json(api, chain, key)).json()
    url = f"{CERTS}/{created['id']}"

    resp = await api.client.get(url, headers=api.auth)
    assert resp.status == 200
    assert await resp.json() == created
    check_response(f"{CERTS}/{{id}}", "get", 200, "application/json", created)

    chain2, key2 = issue(ca, "rot.example.test", "www.rot.example.test")
    resp = await api.client.put(
        url, json={"chain": chain2.decode(), "key": key2.decode()}, headers=api.auth
    )
    assert resp.status == 200, await resp.text()
    rotated = await resp.json()
    check_response(f"{CERTS}/{{id}}", "put", 200, "application/json", rotated)
    assert rotated["id"] == created["id"]
    # a directory keeps no history: its version stays 1
    assert rotated["version"] == (1 if isinstance(api.store, DirectoryStore) else 2)
    assert rotated["names"] == ["rot.example.test", "www.rot.example.test"]
    assert rotated["fingerprint_sha256"] == parse_bundle(chain2, key2).fingerprint_sha256

    resp = await api.client.delete(url, headers=api.auth)
    assert resp.status == 204
    assert await api.records() == []
    for method in ("GET", "DELETE"):
        resp = await api.client.request(method, url, headers=api.auth)
        assert resp.status == 404
        body = await resp.json()
        assert body["code"] == "not-found"
        check_response(f"{CERTS}/{{id}}", method, 404, "application/problem+json", body)


async def test_put_unknown_id_is_404_and_stores_nothing(api: Api, ca: CA) -> None:
    chain, key = issue(ca, "nobody.example.test", key=shared_key())
    resp = await api.client.put(
        f"{CERTS}/0123456789abcdef",
        json={"chain": chain.decode(), "key": key.decode()},
        headers=api.auth,
    )
    assert resp.status == 404
    assert (await resp.json())["code"] == "not-found"
    assert await api.records() == []


async def test_list_filters_and_pages(api: Api, ca: CA) -> None:
    soon = datetime.now(UTC) + timedelta(days=10)
    ids = []
    for i in range(5):
        chain, key = issue(
            ca,
            f"h{i}.example.test",
            key=shared_key(),
            not_after=soon if i % 2 else None,
        )
        ids.append((await (await post_json(api, chain, key)).json())["id"])

    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        resp = await api.client.get(CERTS, params=params, headers=api.auth)
        assert resp.status == 200
        body = await resp.json()
        check_response(CERTS, "get", 200, "application/json", body)
        assert len(body["items"]) <= 2
        seen += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))

    resp = await api.client.get(CERTS, params={"name": "H3.example.test"}, headers=api.auth)
    assert [i["names"] for i in (await resp.json())["items"]] == [["h3.example.test"]]

    limit = (soon + timedelta(days=1)).isoformat()
    resp = await api.client.get(CERTS, params={"expiring_before": limit}, headers=api.auth)
    names = sorted(i["names"][0] for i in (await resp.json())["items"])
    assert names == ["h1.example.test", "h3.example.test"]
    resp = await api.client.get(
        CERTS,
        params={"expiring_before": (soon + timedelta(days=1)).date().isoformat()},
        headers=api.auth,
    )
    assert len((await resp.json())["items"]) == 2


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"limit": "0"}, "bad-request"),
        ({"limit": "501"}, "bad-request"),
        ({"limit": "ten"}, "bad-request"),
        ({"expiring_before": "next week"}, "bad-request"),
        ({"expires_before": "2030-01-01"}, "bad-request"),
        ({"name": "not a host"}, "invalid-hostname"),
    ],
)
async def test_list_bad_query_is_400(api: Api, params: dict[str, str], code: str) -> None:
    resp = await api.client.get(CERTS, params=params, headers=api.auth)
    assert resp.status == 400
    body = await resp.json()
    check_response(CERTS, "get", 400, "application/problem+json", body)
    assert body["code"] == code
    assert body["detail"]


# --- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", CERTS),
        ("POST", CERTS),
        ("GET", f"{CERTS}/x"),
        ("PUT", f"{CERTS}/x"),
        ("DELETE", f"{CERTS}/x"),
        ("GET", "/v1/loaded"),
    ],
)
async def test_every_v1_route_needs_a_token(api: Api, method: str, path: str) -> None:
    resp = await api.client.request(method, path)
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert resp.content_type == "application/problem+json"
    body = await resp.json()
    assert body["code"] == "missing-token"
    check_response(
        path if "{" not in path and not path.endswith("/x") else f"{CERTS}/{{id}}",
        method,
        401,
        "application/problem+json",
        body,
    )

    for header in ("Bearer cat_wrong", "Bearer " + api.token + "x"):
        resp = await api.client.request(method, path, headers={"Authorization": header})
        assert resp.status == 403
        assert (await resp.json())["code"] == "bad-token"
    for header in ("Basic dXNlcjpwYXNz", "Bearer", api.token):
        resp = await api.client.request(method, path, headers={"Authorization": header})
        assert resp.status == 401


async def test_public_routes_need_no_token(api: Api) -> None:
    resp = await api.client.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}
    resp = await api.client.get("/readyz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ready", "checks": {"store": "ok", "haproxy": "ok"}}
    resp = await api.client.get("/v1/openapi.json")
    assert resp.status == 200
    assert (await resp.json())["openapi"].startswith("3.1")


async def test_revoked_token_is_refused_without_restart(api: Api, ca: CA) -> None:
    assert (await api.client.get(CERTS, headers=api.auth)).status == 200
    from certagent.api import add_token

    other = add_token(api.tokens_file, "other")
    assert (await api.client.get(CERTS, headers={"Authorization": f"Bearer {other}"})).status == 200
    text = api.tokens_file.read_text()
    api.tokens_file.write_text(
        "".join(ln for ln in text.splitlines(True) if not ln.startswith("tests:"))
    )
    assert (await api.client.get(CERTS, headers=api.auth)).status == 403
    assert (await api.client.get(CERTS, headers={"Authorization": f"Bearer {other}"})).status == 200


# --- health, readiness, loaded ---------------------------------------------------------------


async def test_readyz_is_503_when_store_or_haproxy_is_down(tmp_path: Path) -> None:
    store = MemoryStore()
    async with running_api(store, tmp_path) as api:
        api.haproxy_up = False
        resp = await api.client.get("/readyz")
        assert resp.status == 503
        body = await resp.json()
        check_response("/readyz", "get", 503, "application/problem+json", body)
        assert body["code"] == "not-ready"
        assert body["checks"]["store"] == "ok"
        assert body["checks"]["haproxy"] != "ok"

        api.haproxy_up = True
        store.available = False
        resp = await api.client.get("/readyz")
        assert resp.status == 503
        assert "switched off" in (await resp.json())["checks"]["store"]
        assert (await api.client.get("/healthz")).status == 200


async def test_store_unavailable_is_503(tmp_path: Path, ca: CA) -> None:
    store = MemoryStore(available=False)
    async with running_api(store, tmp_path) as api:
        resp = await api.client.get(CERTS, headers=api.auth)
        assert resp.status == 503
        body = await resp.json()
        check_response(CERTS, "get", 503, "application/problem+json", body)
        assert body["code"] == "store-unavailable"
        chain, key = issue(ca, "down.example.test", key=shared_key())
        resp = await post_json(api, chain, key)
        assert resp.status == 503


async def test_loaded_reports_slots(api: Api) -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    slots = [
        Slot("/certagent/slot-00002.pem", "AB", "id2", {"b.example.test"}, loaded_at=90.0),
        Slot("/certagent/slot-00001.pem", "CD", None, {"x.test", "a.x.test"}, loaded_at=0.0),
    ]
    api.slots = loaded_slots(
        slots, {"b.example.test": 7, "x.test": 1, "a.x.test": 2}, now=now, monotonic_now=100.0
    )
    resp = await api.client.get("/v1/loaded", headers=api.auth)
    assert resp.status == 200
    body = await resp.json()
    check_response("/v1/loaded", "get", 200, "application/json", body)
    assert body == {
        "items": [
            {
                "slot": "/certagent/slot-00001.pem",
                "certificate_id": None,
                "hosts": ["a.x.test", "x.test"],
                "loaded_since": None,
                "hits": 3,
            },
            {
                "slot": "/certagent/slot-00002.pem",
                "certificate_id": "id2",
                "hosts": ["b.example.test"],
                "loaded_since": "2029-12-31T23:59:50Z",
                "hits": 7,
            },
        ]
    }
    assert isinstance(api.slots[0], LoadedSlot)


async def test_unknown_route_and_method_are_problems(api: Api) -> None:
    resp = await api.client.get("/v1/nothing", headers=api.auth)
    assert resp.status == 404
    assert resp.content_type == "application/problem+json"
    assert (await resp.json())["code"] == "not-found"
    resp = await api.client.patch(CERTS, headers=api.auth)
    assert resp.status == 405
    assert (await resp.json())["code"] == "method-not-allowed"
    assert "POST" in resp.headers["Allow"]


async def test_unexpected_error_is_a_500_problem_without_details(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(MemoryStore):
        async def get(self, cert_id: str) -> None:
            raise RuntimeError("secret internals")

    async with running_api(Broken(), tmp_path) as api:
        resp = await api.client.get(f"{CERTS}/x", headers=api.auth)
        assert resp.status == 500
        body = await resp.json()
        assert body["code"] == "internal-error"
        assert "secret" not in json.dumps(body)
    assert "secret internals" in caplog.text


# --- start_api: the real server ---------------------------------------------------------------


async def _no_slots() -> list[LoadedSlot]:
    return []


async def test_start_api_off_without_tokens_file(tmp_path: Path) -> None:
    from certagent.api import start_api
    from certagent.config import Settings

    settings = Settings(api_bind="127.0.0.1:0")
    assert await start_api(settings, MemoryStore(), loaded=_no_slots, ready=lambda: True) is None


async def test_start_api_serves_and_closes(tmp_path: Path) -> None:
    from certagent.api import add_token, start_api
    from certagent.config import Settings
    from certagent.errors import ConfigError

    tokens = tmp_path / "tokens"
    settings = Settings(api_bind="127.0.0.1:0", api_tokens_file=str(tokens))
    with pytest.raises(ConfigError, match="does not exist"):
        await start_api(settings, MemoryStore(), loaded=_no_slots, ready=lambda: True)
    token = add_token(tokens, "t")
    server = await start_api(settings, MemoryStore(), loaded=_no_slots, ready=lambda: True)
    assert server is not None
    try:
        assert server.url.startswith("http://127.0.0.1:")
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                server.url + "/v1/loaded", headers={"Authorization": f"Bearer {token}"}
            ) as resp,
        ):
            assert resp.status == 200
            assert await resp.json() == {"items": []}
        port = int(server.url.rsplit(":", 1)[1])
        taken = Settings(api_bind=f"127.0.0.1:{port}", api_tokens_file=str(tokens))
        with pytest.raises(ConfigError, match="cannot serve the REST API"):
            await start_api(taken, MemoryStore(), loaded=_no_slots, ready=lambda: True)
    finally:
        await server.close()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(server.url + "/healthz")
