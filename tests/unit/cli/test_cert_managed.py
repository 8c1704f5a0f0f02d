"""``certagent cert ls | show`` and the API's records say which certificates the agent obtained."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from certagent.api.views import record_json
from certagent.certs.pem import parse_bundle
from certagent.store import DirectoryStore
from certagent.store.base import CertRecord
from certagent.testing.certs import CA, issue, shared_key
from tests.apihelp import openapi
from tests.unit.cli.test_cert_commands import Setup, api_url, ca, run, setup, where

__all__ = ["api_url", "ca", "setup"]  # fixtures used here


def issued(setup: Setup, ca: CA, name: str) -> CertRecord:
    """A certificate stored the way on-demand issuance stores it (``add_issued``)."""

    async def main() -> CertRecord:
        store = DirectoryStore(setup.root)
        try:
            locks = store.issuance().locks
            lease = await locks.acquire(name, "node-1", 30)
            assert lease is not None
            return await locks.add_issued(parse_bundle(*issue(ca, name, key=shared_key())), lease)
        finally:
            await store.close()

    return asyncio.run(main())


@pytest.mark.parametrize("via_api", [False, True])
def test_ls_and_show_have_a_managed_column(
    setup: Setup,
    ca: CA,
    via_api: bool,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = request.getfixturevalue("api_url") if via_api else None
    opts = where(setup, api)
    record = issued(setup, ca, "acme.example.test")
    cert, key = setup.write_cert(ca, "up.example.test")
    assert run(["cert", "add", *opts, "--cert", str(cert), "--key", str(key), "--json"]) == 0
    uploaded = json.loads(capsys.readouterr().out)
    assert uploaded["managed"] == ""

    assert run(["cert", "ls", *opts]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "NOT", "AFTER", "VER", "KEY", "MANAGED", "NAMES"]
    assert {row.split()[0]: row.split()[-2:] for row in rows} == {
        record.id: ["acme", "acme.example.test"],
        uploaded["id"]: ["-", "up.example.test"],
    }
    assert run(["cert", "ls", *opts, "--json"]) == 0
    listed = {r["id"]: r["managed"] for r in json.loads(capsys.readouterr().out)}
    assert listed == {record.id: "acme", uploaded["id"]: ""}
    assert run(["cert", "show", *opts, record.id]) == 0
    assert "managed      acme" in capsys.readouterr().out.splitlines()
    assert run(["cert", "show", *opts, uploaded["id"]]) == 0
    assert "managed      -" in capsys.readouterr().out.splitlines()


def test_the_record_json_holds_managed_as_the_openapi_document_says(ca: CA) -> None:
    import jsonschema

    bundle = parse_bundle(*issue(ca, "j.example.test", key=shared_key()))
    now = datetime(2030, 1, 1, tzinfo=UTC)
    schema = {
        "$ref": "#/components/schemas/CertificateMetadata",
        "components": openapi()["components"],
    }
    for managed in ("", "acme"):
        record = CertRecord(
            "r1",
            bundle.names,
            bundle.not_before,
            bundle.not_after,
            bundle.fingerprint_sha256,
            "AB",
            bundle.key_type,
            1,
            now,
            managed,
        )
        body = record_json(record)
        assert body["managed"] == managed
        jsonschema.Draft202012Validator(schema).validate(body)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate({**body, "managed": "other"})
