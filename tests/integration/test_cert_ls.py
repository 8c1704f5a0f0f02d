"""``certagent cert ls`` over a few thousand records in Redis: printed as it is read.

* A reader that stops reading stalls the listing after a page or two: the
  command has read only what it printed (it holds no more than a page), and the
  rest comes once the reader goes on.
* ``--limit`` and ``--after`` are the REST API's ``limit`` and ``cursor``: the
  same records, and the cursor the command prints is the API's ``next_cursor``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from bench._certs import Leaves
from certagent.certs.pem import CertBundle
from certagent.config import Settings, to_toml
from certagent.store.base import CertRecord
from certagent.testing import PKI, certagent_argv
from tests.apihelp import listening_api
from tests.integration.conftest import RedisFixture

pytestmark = pytest.mark.integration

RECORDS = 3_000


@pytest.fixture(scope="module")
def filled(
    redis_server: str, key_file: Path, pki: PKI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RedisFixture, Path]]:
    """3,000 records in the session's Redis, and a certagent.toml for it (module-wide)."""
    store = RedisFixture(redis_server, key_file)
    store.flushall()
    leaves = Leaves(pki)  # one CA signature a record, the key checked once
    asyncio.run(add_in_bulk(store, [leaves.bundle(f"l{i:04d}.ls.test") for i in range(RECORDS)]))
    cfg = tmp_path_factory.mktemp("ls") / "certagent.toml"
    cfg.write_text(to_toml(Settings(store=redis_server, key_file=str(key_file))))
    yield store, cfg
    store.flushall()


async def add_in_bulk(store: RedisFixture, bundles: list[CertBundle]) -> None:
    """500 records a round trip (what cert import does): few commands, even on a busy host."""
    redis_store = store.open()
    try:
        bulk = redis_store.bulk()
        assert bulk is not None
        for start in range(0, len(bundles), 500):
            added = await bulk.add_many(bundles[start : start + 500])
            assert all(isinstance(a, CertRecord) for a in added), added[:3]
    finally:
        await redis_store.close()


def _ls(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*certagent_argv(), "cert", "ls", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _records_read(client: redis.Redis) -> int:
    """Records whose metadata Redis has served since the last CONFIG RESETSTAT (a GET for
    a record of layout 2, an HMGET for one of layout 1)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("get", "hmget"))


def test_a_stalled_reader_stalls_the_listing_after_a_page(
    filled: tuple[RedisFixture, Path],
) -> None:
    store, cfg = filled
    client = redis.Redis.from_url(store.url)
    client.config_resetstat()
    started = time.monotonic()
    with subprocess.Popen(
        [*certagent_argv(), "cert", "ls", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            header = proc.stdout.readline()
            first = proc.stdout.readline()
            first_row_s = time.monotonic() - started
            assert header.startswith("ID ") and ".ls.test" in first, (header, first)
            # The pipe (64 KiB, ≈600 rows) fills and the command blocks writing: wait until
            # its reads stop growing, then count them. Holding the store would be all 3,000.
            seen, steady_since = _records_read(client), time.monotonic()
            while time.monotonic() - steady_since < 1.0:
                time.sleep(0.1)
                now = _records_read(client)
                if now != seen:
                    seen, steady_since = now, time.monotonic()
                assert time.monotonic() - started < 30, f"reads never settled: {now}"
            assert proc.poll() is None, "the command ended although nobody read its output"
            assert 500 <= seen <= 1_500, seen  # one to three pages of 500, not the whole store
            rest = proc.stdout.read()
            err = proc.stderr.read()
            assert proc.wait(timeout=30) == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
            client.close()
    rows = [first, *rest.splitlines()]
    assert len(rows) == RECORDS and len({r.split()[0] for r in rows}) == RECORDS
    assert f"{RECORDS} certificates" in err
    print(f"cert ls: first row after {first_row_s:.2f} s; {seen} records read while stalled")


async def _api_pages(
    url: str, token: str, limits: list[int], cursor: str | None, **query: str
) -> tuple[list[dict[str, Any]], str | None]:
    """GET /v1/certificates once per limit in ``limits``, following next_cursor."""
    items: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        for limit in limits:
            params = {"limit": str(limit), **query, **({"cursor": cursor} if cursor else {})}
            async with session.get(url + "/v1/certificates", params=params) as resp:
                assert resp.status == 200, await resp.text()
                body = await resp.json()
            items += body["items"]
            cursor = body["next_cursor"]
            if cursor is None:
                break
    return items, cursor


def _more(err: str) -> str | None:
    found = [line.split("--after ", 1)[1] for line in err.splitlines() if "--after" in line]
    return found[0] if found else None


def test_limit_and_after_are_the_apis_limit_and_cursor(
    filled: tuple[RedisFixture, Path], tmp_path: Path
) -> None:
    store, cfg = filled

    async def compare() -> None:
        async with listening_api(store.url, store.key_file, tmp_path) as api:
            url, token = api.server.url, api.token
            first = _ls(cfg, "--json", "--limit", "7")
            assert first.returncode == 0, first.stderr
            items, cursor = await _api_pages(url, token, [7], None)
            assert json.loads(first.stdout) == items
            assert _more(first.stderr) == cursor is not None

            # over a page: the command reads 500 then 200; the API's pages say the same
            more = _ls(cfg, "--json", "--after", cursor, "--limit", "700")
            assert more.returncode == 0, more.stderr
            items, after_700 = await _api_pages(url, token, [500, 200], cursor)
            assert json.loads(more.stdout) == items and len(items) == 700
            assert _more(more.stderr) == after_700 is not None

            # to the end: no cursor to go on with
            tail = _ls(cfg, "--json", "--after", after_700)
            assert tail.returncode == 0, tail.stderr
            items, end = await _api_pages(url, token, [500] * 10, after_700)
            assert json.loads(tail.stdout) == items and len(items) == RECORDS - 707
            assert end is None and _more(tail.stderr) is None

            # a filter pages the same way
            soon = "2000-01-01"
            none = _ls(cfg, "--json", "--expiring-before", soon, "--limit", "5")
            items, _ = await _api_pages(url, token, [5] * 10, None, expiring_before=soon)
            assert json.loads(none.stdout) == items == []
            late = "2999-01-01"
            some = _ls(cfg, "--json", "--expiring-before", late, "--limit", "3")
            items, cursor = await _api_pages(url, token, [3], None, expiring_before=late)
            assert json.loads(some.stdout) == items and len(items) == 3
            assert _more(some.stderr) == cursor

    asyncio.run(compare())
