"""PUT /v1/renewals/{name}: an imported certificate opted into renewal, as `cert manage` does.

The route runs the real :func:`certagent.service.manage.manage_name` over the in-memory
store (its renewal schedule is the local one the directory store uses); every answer is
checked against the OpenAPI document.
"""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path

from certagent.certs.pem import parse_bundle
from certagent.service.manage import manage_name
from certagent.service.permission import Permission
from certagent.service.renewtime import RenewPolicy
from certagent.testing.certs import issue, make_ca
from tests.apihelp import check_response, running_api
from tests.memstore import MemoryStore

PATH = "/v1/renewals/{name}"


async def test_an_allowed_stored_name_is_scheduled_and_every_refusal_says_why(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    now = dt.datetime.now(dt.UTC)
    chain, key = issue(
        make_ca(),
        "shop.example.com",
        not_before=now - dt.timedelta(days=30),
        not_after=now + dt.timedelta(days=60),
    )
    record = await store.add(parse_bundle(chain, key))
    await store.add(parse_bundle(*issue(make_ca(), "other.example.net")))
    permission = Permission(suffixes=("example.com",))
    manage = functools.partial(manage_name, store, permission, RenewPolicy(jitter=0.0))
    async with running_api(store, tmp_path, manage=manage) as api:
        resp = await api.client.put("/v1/renewals/SHOP.example.com", headers=api.auth)
        body = await resp.json()
        assert resp.status == 200, body
        check_response(PATH, "PUT", 200, "application/json", body)
        # two thirds of 90 days from 30 days ago: 30 days from now
        renew_at = dt.datetime.fromisoformat(body["renew_at"])
        assert abs(renew_at - (now + dt.timedelta(days=30))) < dt.timedelta(minutes=5)
        assert (body["name"], body["certificate"]) == ("shop.example.com", record.id)
        issuance = store.issuance()
        entry = await issuance.renewals.entry("shop.example.com")
        assert entry is not None and abs(entry.renew_at - renew_at.timestamp()) < 1
        assert [r.managed for r in (await store.list()).records if r.id == record.id] == ["acme"]

        refusals = {
            "other.example.net": (403, "not-permitted"),  # stored, but no policy allows it
            "gone.example.com": (404, "not-found"),  # allowed, but nothing stored
            "bad_name.example.com": (400, "invalid-hostname"),
        }
        for name, (status, code) in refusals.items():
            resp = await api.client.put(f"/v1/renewals/{name}", headers=api.auth)
            problem = await resp.json()
            assert (resp.status, problem["code"]) == (status, code), problem
            check_response(PATH, "PUT", status, "application/problem+json", problem)
            if code != "invalid-hostname":
                assert await issuance.renewals.entry(name) is None
        assert (await api.client.put("/v1/renewals/shop.example.com")).status == 401


async def test_an_agent_without_an_acme_ca_says_it_renews_nothing(tmp_path: Path) -> None:
    async with running_api(MemoryStore(), tmp_path) as api:
        resp = await api.client.put("/v1/renewals/shop.example.com", headers=api.auth)
        problem = await resp.json()
        assert (resp.status, problem["code"]) == (409, "renewal-off")
        assert "acme_directory" in problem["detail"]
        check_response(PATH, "PUT", 409, "application/problem+json", problem)
