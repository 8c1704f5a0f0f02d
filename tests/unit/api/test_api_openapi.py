"""agent/api/openapi.json against the running app: same routes, valid schemas, every code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from certagent.api import make_app
from certagent.api.auth import TokenFile, add_token
from certagent.api.body import NOT_BLANK, PEM_TYPES
from certagent.api.problems import TITLES
from certagent.api.query import (
    CURSOR_MAX,
    EXPIRING_BEFORE_PATTERN,
    MAX_LIMIT,
    NAME_MAX,
    NAME_PATTERN,
)
from certagent.certs.validate import UPLOAD_CODES, UploadPolicy
from tests.apihelp import openapi, resolve
from tests.memstore import MemoryStore

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    add_token(tmp_path / "t", "x")

    async def loaded() -> list[Any]:
        return []

    app = make_app(
        MemoryStore(),
        tokens=TokenFile.load(tmp_path / "t"),
        policy=UploadPolicy(),
        loaded=loaded,
        ready=lambda: True,
    )
    routes = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        routes.add((route.method.lower(), str(path)))
    return routes


def test_every_app_route_is_documented_and_vice_versa(tmp_path: Path) -> None:
    documented = {
        (method, path)
        for path, item in openapi()["paths"].items()
        for method in item
        if method in METHODS
    }
    assert _app_routes(tmp_path) == documented


def test_document_is_valid_json_schema_and_refs_resolve() -> None:
    doc = openapi()
    assert doc["openapi"] == "3.1.0"
    for name, schema in doc["components"]["schemas"].items():
        jsonschema.Draft202012Validator.check_schema(schema), name

    def refs(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    yield value
                else:
                    yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    found = list(refs(doc))
    assert found
    for ref in found:
        assert resolve(ref), ref


def test_every_operation_documents_its_errors() -> None:
    for path, item in openapi()["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            assert operation.get("operationId"), (method, path)
            statuses = set(operation["responses"])
            if operation.get("security") != []:
                assert {"401", "403"} <= statuses, (method, path)
            if method in ("post", "put"):
                assert {"400", "413", "415"} <= statuses, (method, path)
                if path.startswith("/v1/renewals"):  # the path says it all: no body
                    assert "requestBody" not in operation
                    continue
                body = set(operation["requestBody"]["content"])
                if path.startswith("/v1/domains"):  # a registration: JSON, no certificate
                    assert body == {"application/json"}
                    continue
                assert "422" in statuses, (method, path)  # a refused certificate
                if path.endswith("/ocsp"):  # a DER OCSP response
                    assert body == {"application/ocsp-response", "application/octet-stream"}
                else:  # a certificate chain and key
                    pem = {"application/json", "multipart/form-data", "application/x-pem-file"}
                    assert pem <= body


def test_problem_codes_are_every_code_the_api_answers() -> None:
    enum = set(resolve("#/components/schemas/Problem")["properties"]["code"]["enum"])
    assert set(UPLOAD_CODES) <= enum
    assert enum == set(TITLES)


@pytest.mark.parametrize("name", ["CertificateMetadata", "LoadedSlot"])
def test_metadata_schemas_are_closed(name: str) -> None:
    """additionalProperties false: a key field added by mistake fails the response checks."""
    assert resolve(f"#/components/schemas/{name}")["additionalProperties"] is False


# --- the document says exactly what the API accepts --------------------------------------------


def _list_param(name: str) -> dict[str, Any]:
    params = openapi()["paths"]["/v1/certificates"]["get"]["parameters"]
    [param] = [p for p in params if p["name"] == name]
    schema: dict[str, Any] = param["schema"]
    return schema


def _valid(schema: dict[str, Any], value: object) -> bool:
    full = {**schema, "components": openapi()["components"]}
    return jsonschema.Draft202012Validator(full).is_valid(value)


def test_patterns_are_the_ones_the_api_matches() -> None:
    """One source for each pattern: the regexes the API checks with (a drift fails here)."""
    assert _list_param("name")["pattern"] == NAME_PATTERN
    assert _list_param("name")["maxLength"] == NAME_MAX
    assert _list_param("expiring_before")["pattern"] == EXPIRING_BEFORE_PATTERN
    assert _list_param("cursor")["maxLength"] == CURSOR_MAX
    assert _list_param("limit")["maximum"] == MAX_LIMIT
    schemas = openapi()["components"]["schemas"]
    for pem in (
        schemas["UploadJson"]["properties"]["chain"],
        schemas["UploadForm"]["properties"]["chain"],
        schemas["CombinedPem"],
    ):
        assert (pem["pattern"], pem["minLength"]) == (NOT_BLANK, 1)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ("#/expiring_before", ""),
        ("#/expiring_before", "next week"),
        ("#/name", ""),
        ("#/name", " a.example.test"),
        ("#/components/schemas/CombinedPem", ""),
        ("#/components/schemas/CombinedPem", " \r\n\t"),
        ("#/components/schemas/UploadJson", {"chain": ""}),
        ("#/components/schemas/UploadJson", {"chain": "\n\n"}),
        ("#/components/schemas/UploadJson", {"key": "x"}),
        ("#/components/schemas/UploadForm", {"chain": ""}),
        ("#/components/schemas/UploadForm", {"chain": "x", "extra": "y"}),
    ],
)
def test_document_refuses_what_the_api_refuses(schema: str, value: object) -> None:
    """The hostile tester's finds: an empty expiring_before, an empty PEM, {"chain": ""}."""
    if schema.startswith("#/components"):
        resolved = {"$ref": schema}
    else:
        resolved = _list_param(schema.removeprefix("#/"))
    assert not _valid(resolved, value)


def test_every_operation_documents_request_level_errors_as_problems() -> None:
    for path, item in openapi()["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            statuses = set(operation["responses"])
            assert {"400", "414", "415", "431", "500"} <= statuses, (method, path)
            for status, response in operation["responses"].items():
                if "$ref" in response:
                    response = resolve(response["$ref"])
                if int(status) < 400:
                    continue
                [(ctype, body)] = response["content"].items()
                assert ctype == "application/problem+json", (method, path, status)
                assert body["schema"]["$ref"] in (
                    "#/components/schemas/Problem",
                    "#/components/schemas/NotReadyProblem",
                ), (method, path, status)


def test_upload_media_types_are_the_ones_the_api_reads() -> None:
    for path, method in (("/v1/certificates", "post"), ("/v1/certificates/{id}", "put")):
        content = set(openapi()["paths"][path][method]["requestBody"]["content"])
        assert content == {
            "application/json",
            "multipart/form-data",
            "application/x-www-form-urlencoded",
            *PEM_TYPES,
        }


def test_docs_list_every_problem_code() -> None:
    """docs/api.md documents every code the API answers with, each with its status."""
    docs = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    rows = re.findall(r"^\| (\d{3}) \| (.+?) \|", docs, flags=re.MULTILINE)
    documented = {code for _, cell in rows for code in re.findall(r"`([a-z-]+)`", cell)}
    assert set(TITLES) <= documented, sorted(set(TITLES) - documented)


def test_every_operation_declares_the_scope_the_app_asks_for(tmp_path: Path) -> None:
    """``security`` names the scope (and ``x-certagent-scope``), as app.SCOPES checks it."""
    from certagent.api.app import SCOPES

    add_token(tmp_path / "t", "x")

    async def loaded() -> list[Any]:
        return []

    app = make_app(
        MemoryStore(),
        tokens=TokenFile.load(tmp_path / "t"),
        policy=UploadPolicy(),
        loaded=loaded,
        ready=lambda: True,
    )
    checked = 0
    for route in app.router.routes():
        assert route.resource is not None
        operation = openapi()["paths"][route.resource.canonical][route.method.lower()]
        scope = SCOPES.get((route.method, route.name or ""))
        if scope is None:
            assert operation["security"] == [], route
            continue
        assert operation["security"] == [{"bearer": [scope.value]}], route
        assert operation["x-certagent-scope"] == scope.value
        assert {"401", "403", "429"} <= set(operation["responses"]), route
        checked += 1
    assert checked == 12
