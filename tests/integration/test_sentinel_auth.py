"""Password-protected Sentinel: ``?sentinel_auth=yes`` sends the store's credentials to the
sentinels too, ``store_sentinel_password_file`` gives them a password of their own; without
either the agent says so in one line."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import pytest

from certagent.errors import StoreUnavailable
from certagent.testing import PKI, RedisFixture
from certagent.testing.redisha import SentinelSet
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

PASSWORD = "sentinel-pw-7Qx"
DATA_PASSWORD = "data-pw-K2v"
WATCH_PASSWORD = "watch&pw=9Zr"  # characters a URL query must escape


async def ping(url: str, key_file: Path) -> str:
    """"ok", or why the store cannot be reached."""
    store = RedisFixture(url, key_file).open()
    try:
        await store.ping()
    except StoreUnavailable as exc:
        return str(exc)
    finally:
        await store.close()
    return "ok"


def test_password_protected_sentinels_serve_with_sentinel_auth_and_explain_without(
    make_stack: StackFactory, key_file: Path, pki: PKI, tmp_path: Path
) -> None:
    with SentinelSet(tmp_path / "sentinel", password=PASSWORD) as sentinels:
        assert sentinels.url.endswith("?sentinel_auth=yes")
        store = RedisFixture(sentinels.url, key_file, flusher=sentinels.flushall)
        assert store.put([pki.bundle("auth.sentinel.test")]) == 1

        # certagent init keeps the password out of certagent.toml; the agent serves
        stack = make_stack(sentinels.url)
        assert PASSWORD not in stack.config_path.read_text()
        assert stack.handshake("auth.sentinel.test").san == ("auth.sentinel.test",)
        assert PASSWORD not in stack.agent_log()

        without = asyncio.run(ping(sentinels.url.replace("?sentinel_auth=yes", ""), key_file))
        assert "add ?sentinel_auth=yes" in without and "3 x AuthenticationError" in without
        assert PASSWORD not in without and "Redis(" not in without


def test_sentinels_with_a_password_of_their_own_serve_from_its_file(
    make_stack: StackFactory, key_file: Path, pki: PKI, tmp_path: Path
) -> None:
    with SentinelSet(
        tmp_path / "sentinel", password=DATA_PASSWORD, sentinel_password=WATCH_PASSWORD
    ) as sentinels:
        assert "sentinel_password=" in sentinels.url and "sentinel_auth" not in sentinels.url
        store = RedisFixture(sentinels.url, key_file, flusher=sentinels.flushall)
        assert store.put([pki.bundle("own.sentinel.test")]) == 1

        # init moves each password into its own 0600 file; the agent reads both and serves
        stack = make_stack(sentinels.url)
        toml = stack.config_path.read_text()
        secret = stack.config_path.parent / "store-sentinel.password"
        assert f'store_sentinel_password_file = "{secret}"' in toml
        assert secret.read_text() == WATCH_PASSWORD + "\n"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert stack.handshake("own.sentinel.test").san == ("own.sentinel.test",)
        for text in (toml, stack.agent_log()):
            assert DATA_PASSWORD not in text and WATCH_PASSWORD not in text

        # the data nodes' password is not the sentinels': each mistake is named
        data_only = sentinels.url.partition("?")[0]
        for url, hint in (
            (data_only, "set store_sentinel_password_file"),
            (data_only + "?sentinel_auth=yes", "refused the store's user and password"),
            (data_only + "?sentinel_password=wrong", "refused their password"),
        ):
            started = time.monotonic()
            said = asyncio.run(ping(url, key_file))
            # each sentinel asked twice, without backoff (redis-py's default: about 7 s each)
            assert time.monotonic() - started < 3
            assert hint in said and "3 x AuthenticationError" in said, said
            assert DATA_PASSWORD not in said and WATCH_PASSWORD not in said

        # a sentinel that is down costs a refused connection, not a backoff
        sentinels.sentinels[0].kill()
        started = time.monotonic()
        assert asyncio.run(ping(sentinels.url, key_file)) == "ok"
        assert time.monotonic() - started < 3
