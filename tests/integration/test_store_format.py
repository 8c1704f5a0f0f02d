"""The store's format on a real Redis: refused when unknown, held back by the board, forced.

(issue 28: "refuse, don't guess"; ``fleet status`` and ``fleet finalize``.)  The mixed
fleet of two releases is tests/integration/test_rolling_upgrade.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redis

from certagent.store.formats import NodeInfo
from certagent.testing import PKI, RedisFixture, wait_for
from certagent.testing.layout1 import add_layout1
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration


def snapshot(url: str) -> dict[bytes, bytes | None]:
    """Every key of the store with its serialized value."""
    client = redis.Redis.from_url(url)
    try:
        return {key: client.dump(key) for key in client.scan_iter()}
    finally:
        client.close()


def test_a_node_refuses_a_store_at_a_format_it_does_not_know_and_writes_nothing(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    redis_store.put([pki.bundle("known.format.test")])
    client = redis.Redis.from_url(redis_store.url)
    client.hset(
        "certagent:format",
        mapping={"format": 3, "version": "0.9.0", "node": "edge-7", "at": "2027-03-01T00:00:00Z"},
    )
    before = snapshot(redis_store.url)
    stack = make_stack(redis_store.url, start=False)
    stack.start_haproxy()
    agent = stack.start_agent(wait=False)
    wait_for(lambda: agent.poll() is not None or None, 30, "the agent to refuse the store")
    log = stack.agent_log()
    print(log[-2000:])
    assert agent.returncode != 0
    assert "format 3" in log and "certagent 0.9.0" in log and "edge-7" in log
    assert "reads formats 1-2" in log
    # the CLI refuses to write there too
    pem = tmp_path / "new.pem"
    pem.write_bytes(b"".join(pki.chain_and_key("new.format.test")))
    added = stack.command("cert", "add", "--cert", str(pem))
    assert added.returncode == 1 and "format 3" in added.stderr, added.stderr
    assert snapshot(redis_store.url) == before  # nothing was written, by either


@pytest.mark.no_haproxy
def test_finalize_is_refused_while_an_older_node_is_on_the_board_then_forced(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    # a store of an earlier release (records, no format number), and on its board a node
    # of a release that reads format 1 only

    async def setup() -> None:
        store = redis_store.open()
        try:
            assert store.keyring is not None
            bundle = pki.bundle("old.format.test")
            await add_layout1(store._client, store.keys, store.keyring, bundle)
            await store.fleet().beat("old-node", NodeInfo("0.2.9", (1,), 1), 60)
        finally:
            await store.close()

    asyncio.run(setup())
    stack = make_stack(redis_store.url, start=False)
    status = json.loads(stack.command("fleet", "status", "--json").stdout)
    assert status["format"]["number"] == 1 and status["format"]["marked"] is False
    assert status["holding_back"] == ["old-node"]
    old = next(n for n in status["nodes"] if n["node"] == "old-node")
    assert (old["version"], old["reads"], old["running"]) == ("0.2.9", [1], True)
    text = stack.command("fleet", "status").stdout
    assert "old-node" in text and "0.2.9" in text and "held back by old-node" in text

    refused = stack.command("fleet", "finalize")
    assert refused.returncode == 1
    assert "old-node" in refused.stderr and "--force" in refused.stderr
    assert redis.Redis.from_url(redis_store.url).exists("certagent:format") == 0

    forced = stack.command("fleet", "finalize", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    report = json.loads(forced.stdout)
    assert report["after"]["number"] == 2
    assert report["migration"] == {"scanned": 1, "rewritten": 1, "left": 0, "problems": []}
    again = json.loads(stack.command("fleet", "status", "--json").stdout)
    assert again["finalized"] is True and again["holding_back"] == []
