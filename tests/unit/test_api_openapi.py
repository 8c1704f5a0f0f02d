"""agent/api/openapi.json against the running app: same routes, valid schemas, every code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agent.api import make_app
from agent.api.auth import TokenFile, add_token
from agent.api.problems import TITLES
from agent.validate import UPLOAD_CODES, UploadPolicy
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
                assert {"400", "413", "415", "422"} <= statuses, (method, path)
                body = operation["requestBody"]["content"]
                assert {"application/json", "multipart/form-data", "application/x-pem-file"} <= set(
                    body
                )


def test_problem_codes_are_every_code_the_api_answers() -> None:
    enum = set(resolve("#/components/schemas/Problem")["properties"]["code"]["enum"])
    assert set(UPLOAD_CODES) <= enum
    assert enum == set(TITLES)


@pytest.mark.parametrize("name", ["CertificateMetadata", "LoadedSlot"])
def test_metadata_schemas_are_closed(name: str) -> None:
    """additionalProperties false: a key field added by mistake fails the response checks."""
    assert resolve(f"#/components/schemas/{name}")["additionalProperties"] is False
