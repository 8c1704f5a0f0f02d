"""Password-protected Sentinel: ``?sentinel_auth=yes`` sends the store's credentials to the
sentinels too; without it the agent says so in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from certagent.errors import StoreUnavailable
from certagent.testing import PKI, RedisFixture
from certagent.testing.redisha import SentinelSet
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

PASSWORD = "sentinel-pw-7Qx"


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

        async def ping(url: str) -> str:
            s = RedisFixture(url, key_file).open()
            try:
                await s.ping()
            except StoreUnavailable as exc:
                return str(exc)
            finally:
                await s.close()
            return "ok"

        without = asyncio.run(ping(sentinels.url.replace("?sentinel_auth=yes", "")))
        assert "add ?sentinel_auth=yes" in without and "3 x AuthenticationError" in without
        assert PASSWORD not in without and "Redis(" not in without
