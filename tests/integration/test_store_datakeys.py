"""The Redis store's data-key roles on one Redis, a Sentinel set and a cluster.

Announcements (``{prefix}datakeys``): who holds which keys, lapsing by Redis's
clock, withdrawn at once; lookups that meet a record they cannot decrypt leave
it out and name it in :meth:`~certagent.store.redis.RedisStore.unreadable`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.testing import PKI, RedisFixture
from tests.integration.conftest import STORE_KINDS

pytestmark = pytest.mark.integration


async def _until(probe: object, timeout: float = 5.0) -> None:
    assert callable(probe)
    deadline = asyncio.get_running_loop().time() + timeout
    while not await probe():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("any_store", STORE_KINDS, indirect=True)
async def test_data_key_announcements_lapse_by_redis_clock_and_withdraw_at_once(
    any_store: RedisFixture,
) -> None:
    store = any_store.open()
    try:
        assert await store.fleet_key_ids() == {}
        await store.announce("web1", ["kaaa", "k1=kbbb"], 60)
        await store.announce("web2", ["kaaa"], 0.3)
        assert await store.fleet_key_ids() == {
            "web1": frozenset({"kaaa", "k1=kbbb"}),
            "web2": frozenset({"kaaa"}),
        }

        async def web2_lapsed() -> bool:
            return "web2" not in await store.fleet_key_ids()

        await _until(web2_lapsed)
        await store.announce("web1", ["kccc"], 60)  # a new announcement replaces the old
        assert await store.fleet_key_ids() == {"web1": frozenset({"kccc"})}
        if any_store.url.startswith("redis://"):  # and drops the lapsed ones
            with redis.Redis.from_url(any_store.url, socket_timeout=5) as client:
                assert client.hkeys(store.keys.data_key_holders()) == [b"web1"]
        await store.withdraw("web1")
        assert await store.fleet_key_ids() == {}
        with pytest.raises(ValueError, match="node name"):
            await store.announce("web 1", ["kaaa"], 60)
        with pytest.raises(ValueError, match="key ids"):
            await store.announce("web1", [], 60)
    finally:
        await store.close()


@pytest.mark.parametrize("any_store", STORE_KINDS, indirect=True)
async def test_a_lookup_names_the_records_it_cannot_decrypt(
    any_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    other = tmp_path / "other.key"
    other.write_text(generate_key_line() + "\n")
    other_kid = KeyRing.from_file(other).current
    writer = RedisFixture(any_store.url, other).open()
    store = any_store.open()
    try:
        foreign = await writer.put(pki.bundle("foreign.store-keys.test"))
        assert await store.lookup_all("foreign.store-keys.test") == ()
        [seen] = store.unreadable().records()
        assert (seen.cert_id, seen.name, seen.key_id) == (
            foreign,
            "foreign.store-keys.test",
            other_kid,
        )
        assert store.unreadable().by_key_id == {other_kid: 1}
        # the same key added to the reader's file: the record decrypts, and leaves the list
        both = tmp_path / "both.key"
        both.write_text(any_store.key_file.read_text() + other.read_text())
        await store.close()
        store = RedisFixture(any_store.url, both).open()
        store.unreadable().note(foreign, "foreign.store-keys.test", other_kid, "earlier")
        [found] = await store.lookup_all("foreign.store-keys.test")
        assert found.id == foreign and store.unreadable().records() == ()
    finally:
        await writer.close()
        await store.close()


async def test_data_key_announcements_work_for_a_user_who_may_not_run_scripts(
    redis_store: RedisFixture, caplog: pytest.LogCaptureFixture
) -> None:
    with redis.Redis.from_url(redis_store.url, socket_timeout=5) as admin:
        admin.acl_setuser(
            "noscript-keys", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-@scripting"],
        )  # fmt: skip
        try:
            url = redis_store.url.replace("redis://", "redis://noscript-keys:pw@", 1)
            store = RedisFixture(url, redis_store.key_file).open()
            try:
                await store.announce("web1", ["kaaa"], 60)
                await store.announce("web2", ["kbbb"], 0.2)
                assert set(await store.fleet_key_ids()) == {"web1", "web2"}

                async def web2_lapsed() -> bool:
                    return set(await store.fleet_key_ids()) == {"web1"}

                await _until(web2_lapsed)
                await store.announce("web1", ["kaaa"], 60)  # drops the lapsed one
                assert admin.hkeys(store.keys.data_key_holders()) == [b"web1"]
                assert caplog.text.count("scripts are not allowed") == 1
                assert "pw@" not in caplog.text
            finally:
                await store.close()
        finally:
            admin.acl_deluser("noscript-keys")
