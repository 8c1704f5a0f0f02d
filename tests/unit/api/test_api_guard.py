"""Scoped tokens in the app: scopes, name patterns, expiry, rate, the audit lines, /metrics.

The authorization matrix against the real agent is tests/integration/test_api_scopes.py;
these are the details that need a clock or a look at the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from certagent.api import LoadedSlot
from certagent.api.auth import add_token
from certagent.api.grants import make_grant
from certagent.api.guard import RateLimiter
from certagent.testing.certs import CA, issue, make_ca, shared_key
from tests.apihelp import Api, check_response, running_api
from tests.memstore import MemoryStore

CERTS = "/v1/certificates"


class Clock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = datetime.now(UTC).replace(microsecond=0)

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def api(tmp_path: Path, clock: Clock) -> AsyncIterator[Api]:
    store = MemoryStore()
    async with running_api(
        store, tmp_path, now=clock.now, limiter=RateLimiter(clock.monotonic)
    ) as api:
        yield api


def token(api: Api, name: str, clock: Clock, **grant: Any) -> dict[str, str]:
    secret = add_token(api.tokens_file, name, make_grant(now=clock.wall, **grant))
    return {"Authorization": f"Bearer {secret}"}


def upload(ca: CA, *names: str) -> dict[str, str]:
    chain, key = issue(ca, *names, key=shared_key())
    return {"chain": chain.decode(), "key": key.decode()}


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "certagent.audit"]


async def test_a_missing_scope_is_403_forbidden_naming_it(
    api: Api, ca: CA, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "certagent.audit")
    reader = token(api, "reader", clock, scopes=["read"])
    resp = await api.client.post(CERTS, json=upload(ca, "a.test.example"), headers=reader)
    body = await resp.json()
    assert (resp.status, body["code"], body["scope"]) == (403, "forbidden", "certificates")
    assert "'certificates'" in body["detail"] and "'reader' has read" in body["detail"]
    check_response(CERTS, "post", 403, resp.content_type, body)
    assert api.store is not None and await api.records() == []
    # every GET is a read; the token's list works
    resp = await api.client.get(CERTS, headers=reader)
    assert resp.status == 200
    [refused, listed] = audit_lines(caplog)
    assert {k: refused[k] for k in ("token", "method", "route", "outcome", "status", "code")} == {
        "token": "reader",
        "method": "POST",
        "route": CERTS,
        "outcome": "refused",
        "status": 403,
        "code": "forbidden",
    }
    assert (listed["outcome"], listed["status"], listed["code"]) == ("accepted", 200, None)


async def test_names_outside_the_patterns_are_missing_to_reads_and_forbidden_to_writes(
    api: Api, ca: CA, clock: Clock
) -> None:
    inside = await (
        await api.client.post(CERTS, json=upload(ca, "a.in.test"), headers=api.auth)
    ).json()
    both = await (
        await api.client.post(CERTS, json=upload(ca, "b.in.test", "b.out.test"), headers=api.auth)
    ).json()
    reader = token(api, "reader", clock, scopes=["read"], names=["*.in.test"])
    writer = token(api, "writer", clock, scopes=["certificates"], names=["*.in.test"])

    listed = await (await api.client.get(CERTS, headers=reader)).json()
    assert [item["id"] for item in listed["items"]] == [inside["id"]]  # not the mixed one
    assert (await api.client.get(f"{CERTS}/{inside['id']}", headers=reader)).status == 200
    hidden = await api.client.get(f"{CERTS}/{both['id']}", headers=reader)
    missing = await api.client.get(f"{CERTS}/{'0' * 32}", headers=reader)
    assert hidden.status == missing.status == 404
    hidden_body, missing_body = await hidden.json(), await missing.json()
    assert hidden_body["detail"] == missing_body["detail"].replace("0" * 32, both["id"])
    assert dict(hidden.headers).keys() == dict(missing.headers).keys()

    for method in ("PUT", "DELETE"):
        resp = await api.client.request(
            method, f"{CERTS}/{both['id']}", json=upload(ca, "b.in.test"), headers=writer
        )
        body = await resp.json()
        assert (resp.status, body["code"]) == (403, "forbidden-name"), body
        assert "b.out.test" not in body["detail"]  # a write learns nothing of the record
    resp = await api.client.post(CERTS, json=upload(ca, "c.in.test", "c.out.test"), headers=writer)
    assert (resp.status, (await resp.json())["code"]) == (403, "forbidden-name")
    resp = await api.client.put(
        f"{CERTS}/{inside['id']}", json=upload(ca, "a.in.test", "a.out.test"), headers=writer
    )
    assert resp.status == 403  # a rotation may not widen a certificate past the patterns
    resp = await api.client.put(
        f"{CERTS}/{inside['id']}", json=upload(ca, "a.in.test"), headers=writer
    )
    assert resp.status == 200
    assert (await api.client.delete(f"{CERTS}/{inside['id']}", headers=writer)).status == 204
    assert {r.id for r in await api.records()} == {both["id"]}


async def test_loaded_and_domains_are_filtered_too(api: Api, ca: CA, clock: Clock) -> None:
    api.slots = [
        LoadedSlot("/s-1.pem", "1", ("a.in.test",), None, 1),
        LoadedSlot("/s-2.pem", "2", ("a.in.test", "a.out.test"), None, 1),
        LoadedSlot("/s-3.pem", None, (), None, 0),
    ]
    reader = token(api, "reader", clock, scopes=["read"], names=[".in.test"])
    slots = await (await api.client.get("/v1/loaded", headers=reader)).json()
    assert [s["slot"] for s in slots["items"]] == ["/s-1.pem"]
    everything = await (await api.client.get("/v1/loaded", headers=api.auth)).json()
    assert len(everything["items"]) == 3

    registrar = token(api, "registrar", clock, scopes=["domains"], names=["*.in.test"])
    for name, status in (("a.in.test", 201), ("b.out.test", 403), ("x.a.in.test", 403)):
        resp = await api.client.post("/v1/domains", json={"name": name}, headers=registrar)
        assert resp.status == status, (name, await resp.text())
    await api.client.post("/v1/domains", json={"name": "b.out.test"}, headers=api.auth)
    listed = await (await api.client.get("/v1/domains", headers=reader)).json()
    assert [d["name"] for d in listed["items"]] == ["a.in.test"]
    assert (await api.client.get("/v1/domains/b.out.test", headers=reader)).status == 404
    resp = await api.client.delete("/v1/domains/b.out.test", headers=registrar)
    assert resp.status == 403


async def test_an_expired_token_is_401(api: Api, clock: Clock) -> None:
    brief = token(api, "brief", clock, expires_in="90s")
    assert (await api.client.get(CERTS, headers=brief)).status == 200
    clock.wall += timedelta(seconds=90)
    resp = await api.client.get(CERTS, headers=brief)
    body = await resp.json()
    assert (resp.status, body["code"]) == (401, "expired-token")
    assert 'error="invalid_token"' in resp.headers["WWW-Authenticate"]
    assert clock.wall.isoformat().replace("+00:00", "Z") in body["detail"]


async def test_a_token_over_its_rate_gets_429_with_retry_after(
    api: Api, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "certagent.audit")
    slow = token(api, "slow", clock, rate="2/m")  # one every 30 s, never more than one at once
    assert (await api.client.get(CERTS, headers=slow)).status == 200
    resp = await api.client.get(CERTS, headers=slow)
    body = await resp.json()
    assert (resp.status, body["code"], resp.headers["Retry-After"]) == (429, "rate-limited", "30")
    check_response(CERTS, "get", 429, resp.content_type, body)
    # the others are not held back
    assert (await api.client.get(CERTS, headers=api.auth)).status == 200
    clock.mono += 29.5
    assert (await api.client.get(CERTS, headers=slow)).headers["Retry-After"] == "1"
    clock.mono += 30.0
    assert (await api.client.get(CERTS, headers=slow)).status == 200
    outcomes = [(line["token"], line["status"]) for line in audit_lines(caplog)]
    assert outcomes == [("slow", 200), ("slow", 429), ("tests", 200), ("slow", 429), ("slow", 200)]


async def test_refusals_before_the_body_are_audited_once(
    api: Api, ca: CA, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Expect: 100-continue is answered before the middlewares: its refusals get one line."""
    caplog.set_level(logging.INFO, "certagent.audit")
    reader = token(api, "reader", clock, scopes=["read"])
    chain, key = issue(ca, "e.example.test", key=shared_key())
    body = chain + key
    for headers, status in (
        ({**reader}, 403),
        ({"Authorization": "Bearer cat_not-a-token-at-all"}, 403),
        ({}, 401),
        ({**api.auth}, 201),
    ):
        resp = await api.client.post(
            CERTS,
            data=body,
            headers={**headers, "Expect": "100-continue", "Content-Type": "application/x-pem-file"},
        )
        assert resp.status == status, await resp.text()
    lines = audit_lines(caplog)
    assert [(line["token"], line["status"], line["code"]) for line in lines] == [
        ("reader", 403, "forbidden"),
        (None, 403, "bad-token"),
        (None, 401, "missing-token"),
        ("tests", 201, None),
    ]
    assert lines[-1]["names"] == ["e.example.test"] and lines[-1]["target"]
    text = "\n".join(json.dumps(line) for line in lines)
    assert "cat_not-a-token" not in text and "PRIVATE KEY" not in text
    assert api.auth["Authorization"].split()[1] not in text


async def test_metrics_count_requests_by_token_and_outcome(api: Api, clock: Clock) -> None:
    reader = token(api, "reader", clock, scopes=["read"])
    await api.client.get(CERTS, headers=reader)
    await api.client.post("/v1/domains", json={"name": "a.test.example"}, headers=reader)
    await api.client.get(CERTS, headers={"Authorization": "Bearer nope-nope-nope-nope"})
    await api.client.get("/healthz")  # needs no token: not counted
    text = await (await api.client.get("/metrics")).text()
    assert 'certagent_api_requests_total{outcome="accepted",token="reader"} 1.0' in text
    assert 'certagent_api_requests_total{outcome="refused",token="reader"} 1.0' in text
    assert 'certagent_api_requests_total{outcome="refused",token="(none)"} 1.0' in text
    assert "nope-nope" not in text


async def test_a_token_without_scopes_in_an_old_file_still_does_everything(
    api: Api, ca: CA
) -> None:
    """The fixture's token is written as before scopes (name:sha256): admin."""
    line = api.tokens_file.read_text().splitlines()[-1]
    assert line.count(" ") == 0 and line.startswith("tests:")
    resp = await api.client.post(CERTS, json=upload(ca, "old.example.test"), headers=api.auth)
    assert resp.status == 201
    record = await resp.json()
    for method, path, status in (
        ("GET", f"{CERTS}/{record['id']}", 200),
        ("PUT", "/v1/renewals/old.example.test", 409),  # renewal-off: no ACME CA here
        ("DELETE", f"{CERTS}/{record['id']}", 204),
    ):
        assert (await api.client.request(method, path, headers=api.auth)).status == status


async def test_each_request_of_a_kept_alive_connection_is_admitted_on_its_own(
    api: Api, clock: Clock
) -> None:
    """An admin request, then requests without a token or with a read token, on one
    connection: nothing of the first carries over."""
    reader = token(api, "reader", clock, scopes=["read"])
    made: list[object] = []
    trace = aiohttp.TraceConfig()

    async def connected(*args: object) -> None:
        made.append(args)

    trace.on_connection_create_end.append(connected)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace]
    ) as session:
        url = str(api.client.make_url(CERTS))
        for headers, status in ((api.auth, 200), ({}, 401), (reader, 200), (api.auth, 200)):
            async with session.get(url, headers=headers) as resp:
                assert resp.status == status
        async with session.post(url, headers=reader, json={"chain": "x"}) as resp:
            assert (resp.status, (await resp.json())["code"]) == (403, "forbidden")
    assert len(made) == 1  # one connection, kept alive
