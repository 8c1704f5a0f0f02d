"""Running the REST API app in tests: a TestServer on loopback, a token, the store behind it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner

from certagent.api import (
    ApiServer,
    LoadedSlot,
    TokenFile,
    add_token,
    make_app,
    openapi_document,
    start_api,
)
from certagent.api.guard import RateLimiter
from certagent.api.server import ProblemRunner
from certagent.certs.validate import UploadPolicy
from certagent.config import Settings
from certagent.store import open_configured
from certagent.store.base import CertRecord, Store
from certagent.store.renewals import Managed

Client = TestClient[web.Request, web.Application]


@dataclass
class Api:
    client: Client
    token: str
    store: Store
    tokens_file: Path
    slots: list[LoadedSlot] = field(default_factory=list)
    haproxy_up: bool = True

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def records(self) -> list[CertRecord]:
        """Every record in the store, through the Protocol (to compare before and after)."""
        found: list[CertRecord] = []
        cursor: str | None = None
        while True:
            page = await self.store.list(cursor=cursor, limit=500)
            found.extend(page.records)
            if page.cursor is None:
                return found
            cursor = page.cursor


class ProblemTestServer(TestServer):
    """aiohttp's TestServer, serving the app the way :func:`certagent.api.start_api` does."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return ProblemRunner(self.app, **kwargs)


@dataclass
class Listening:
    """The agent's own API listener (``start_api``) on loopback, over a Redis store."""

    server: ApiServer
    token: str
    settings: Settings
    store: Store


@asynccontextmanager
async def listening_api(
    store_url: str,
    key_file: Path,
    tmp_path: Path,
    *,
    manage: Callable[[Store], Callable[[str], Awaitable[Managed]]] | None = None,
) -> AsyncIterator[Listening]:
    """``start_api`` on a free loopback port with one token; no HAProxy (nothing loaded).

    ``manage``: given the store, what ``PUT /v1/renewals/{name}`` calls (None: renewal off).
    """
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "tests")
    settings = Settings(
        store=store_url,
        key_file=str(key_file),
        api_bind="127.0.0.1:0",
        api_tokens_file=str(tokens),
    )
    store = open_configured(settings)

    async def nothing_loaded() -> list[LoadedSlot]:
        return []

    server = await start_api(
        settings,
        store,
        loaded=nothing_loaded,
        ready=lambda: True,
        manage=manage(store) if manage is not None else None,
    )
    assert server is not None
    try:
        yield Listening(server, token, settings, store)
    finally:
        await server.close()
        await store.close()


@asynccontextmanager
async def running_api(
    store: Store,
    tmp_path: Path,
    *,
    policy: UploadPolicy | None = None,
    now: Callable[[], datetime] | None = None,
    manage: Callable[[str], Awaitable[Managed]] | None = None,
    limiter: RateLimiter | None = None,
) -> AsyncIterator[Api]:
    """The app in a TestServer, with one admin token ("tests"); add others to ``tokens_file``."""
    tokens_file = tmp_path / "api-tokens"
    token = add_token(tokens_file, "tests")
    holder: list[Api] = []

    async def loaded() -> Sequence[LoadedSlot]:
        return holder[0].slots

    app = make_app(
        store,
        tokens=TokenFile.load(tokens_file),
        policy=policy or UploadPolicy(),
        loaded=loaded,
        ready=lambda: holder[0].haproxy_up,
        now=now or (lambda: datetime.now(UTC)),
        manage=manage,
        limiter=limiter,
    )
    async with TestClient(ProblemTestServer(app, host="127.0.0.1")) as client:
        api = Api(client, token, store, tokens_file)
        holder.append(api)
        yield api


# --- OpenAPI response checks ------------------------------------------------------------------


@cache
def openapi() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(openapi_document())
    return doc


def response_schema(path: str, method: str, status: int, content_type: str) -> dict[str, Any]:
    """The schema the document gives for this response (a KeyError if it documents none)."""
    operation = openapi()["paths"][path][method.lower()]
    response = operation["responses"][str(status)]
    if "$ref" in response:
        response = resolve(response["$ref"])
    schema: dict[str, Any] = response["content"][content_type]["schema"]
    return schema


def resolve(ref: str) -> dict[str, Any]:
    node: Any = openapi()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    assert isinstance(node, dict)
    return node


def check_response(path: str, method: str, status: int, content_type: str, body: object) -> None:
    """Validate ``body`` against the document's schema for that response (JSON Schema 2020-12)."""
    schema = {**response_schema(path, method, status, content_type)}
    schema["components"] = openapi()["components"]
    jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    ).validate(body)


STORE_KINDS = ("memory", "directory")


def make_store(kind: str, tmp_path: Path) -> Store:
    """A fresh empty store: the in-memory fake, or a real DirectoryStore in ``tmp_path``."""
    import pytest

    from certagent.store import DirectoryStore
    from tests.memstore import MemoryStore

    if kind == "memory":
        return MemoryStore()
    if not hasattr(DirectoryStore, "add"):
        pytest.skip("DirectoryStore does not implement add/replace/delete/get/list yet")
    root = tmp_path / "certs"
    root.mkdir()
    store: Store = DirectoryStore(root)
    return store
