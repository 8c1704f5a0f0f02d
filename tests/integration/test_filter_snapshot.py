"""The name filter's snapshot in Redis: written by one agent, loaded by the next one.

Agent A builds the filter from the store and writes the snapshot; agent B,
started against the same Redis, loads it and replays the change feed from its
position instead of reading every name (no SCAN reaches Redis), and knows the
names written after the snapshot.  Once the feed no longer reaches back to the
snapshot's position, agent C rebuilds from the store.
"""

from __future__ import annotations

import re

import pytest
import redis

from certagent.service import bloom
from certagent.service.namefilter import NameFilter
from certagent.testing import PKI, RedisFixture, wait_for
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

KEY = "certagent:namefilter"


def scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def filter_source(stack: object) -> str | None:
    names = stack.status()["name_filter"]  # type: ignore[attr-defined]
    return str(names["source"]) if names["ready"] else None


@pytest.mark.timeout(120)
def test_the_next_agent_starts_from_the_snapshot_and_the_feed_not_from_every_name(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle(f"h{i}.snap.test") for i in range(20)])
    client = redis.Redis.from_url(redis_store.url, socket_timeout=5)
    a = make_stack(redis_store.url, capacity=20)
    source = wait_for(lambda: filter_source(a), 15.0, "agent A's name filter")
    assert source == "built from the store: 20 names"
    wait_for(lambda: client.exists(KEY) or None, 10.0, "the snapshot in Redis")
    a.stop_agent()
    # written after the snapshot: B gets them from the change feed
    redis_store.put([pki.bundle("late1.snap.test"), pki.bundle("late2.snap.test")])
    client.config_resetstat()
    b = make_stack(redis_store.url, capacity=20)
    source = wait_for(lambda: filter_source(b), 15.0, "agent B's name filter")
    assert re.fullmatch(r"loaded snapshot at \d+-\d+, replayed 2 changes", str(source)), source
    assert scans(client) == 0  # B never walked the name keys
    assert b.handshake("late2.snap.test", timeout=10).san == ("late2.snap.test",)
    assert b.handshake("h3.snap.test", timeout=10).san == ("h3.snap.test",)
    b.stop_agent()
    # the feed forgets the snapshot's position: the next agent rebuilds, and says so
    redis_store.put([pki.bundle("late3.snap.test")])
    client.xtrim("certagent:events", maxlen=1, approximate=False)
    c = make_stack(redis_store.url, capacity=20)
    source = wait_for(lambda: filter_source(c), 15.0, "agent C's name filter")
    assert source == "built from the store: 23 names"
    assert scans(client) > 0
    assert c.handshake("late3.snap.test", timeout=10).san == ("late3.snap.test",)
    client.close()


@pytest.mark.timeout(60)
def test_a_corrupt_snapshot_in_redis_is_rebuilt_and_replaced(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle(f"h{i}.corrupt.test") for i in range(5)])
    client = redis.Redis.from_url(redis_store.url, socket_timeout=5)
    client.set(KEY, b"CAGNFLT1" + b"\xff" * 300)
    stack = make_stack(redis_store.url, capacity=20)
    source = wait_for(lambda: filter_source(stack), 15.0, "the name filter")
    assert source == "built from the store: 5 names"
    wait_for(lambda: (client.strlen(KEY) or 0) > 1000 or None, 10.0, "a new snapshot")
    assert "ignoring the snapshot" in stack.agent_log_path.read_text()
    client.close()


@pytest.mark.parametrize("any_store", ["plain", "cluster"], indirect=True)
async def test_the_snapshot_is_one_key_loaded_and_replayed_on_a_single_node_and_a_cluster(
    any_store: RedisFixture, pki: PKI
) -> None:
    store = any_store.open()
    try:
        slot = store.filter_snapshot()
        assert await slot.read() is None and await slot.read(bloom.HEADER_SIZE) is None
        await store.add(pki.bundle("first.slot.test"))
        _, position = await store.changes(None, 0)
        big = bloom.BloomFilter(2_000_000)  # a store of a million names: 2.4 MB, one SET
        big.add("first.slot.test")
        data = bloom.encode(big, position, 1)
        await slot.write(data)
        assert await slot.read(bloom.HEADER_SIZE) == data[: bloom.HEADER_SIZE]
        assert await slot.read() == data
        await store.add(pki.bundle("after.slot.test"))  # written after the snapshot
        names = NameFilter()
        names.followed(position)
        assert await names.load(slot, store)
        assert names.source == f"loaded snapshot at {position}, replayed 1 changes"
        assert names.may_hold("after.slot.test") and names.may_hold("first.slot.test")
        assert not names.may_hold("stranger.slot.test")
    finally:
        await store.close()
