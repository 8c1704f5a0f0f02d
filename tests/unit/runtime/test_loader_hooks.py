"""The loader's constructor hooks, against a fake HAProxy behind a runtime socket.

``on_session`` runs on every new HAProxy session, after adoption; ``on_reload``
gets the hosts to re-warm after a reload the loader asked for through
``master_socket``.  Command sequences of loads are in tests/unit/runtime/test_loader.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from certagent.errors import CommandFailed
from certagent.runtime.client import RuntimeClient
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.loader import Loader
from certagent.runtime.pool import SlotPool
from tests.unit.runtime.fakehaproxy import FakeRuntimeSocket, HAProxyModel
from tests.unit.runtime.test_recover_master import FakeMaster

NAMES = HAProxyNames("/etc/certagent/certagent.crtlist", "fe_sni", 3_600_000)
SLOT = "/certagent/slot-00001.pem"


async def test_each_new_session_runs_the_session_hook_after_adoption(sockdir: Path) -> None:
    model = HAProxyModel()
    sessions: list[int] = []

    async def session(client: RuntimeClient) -> None:
        sessions.append(client.identity.pid if client.identity else 0)
        assert ("show", "table", "fe_sni", "data.gpt0", "gt", "0") in model.log  # adopted

    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        loader = Loader(client, SlotPool(10, "/certagent/slot-"), NAMES, on_session=session)
        identity = await loader.sync()
        assert sessions == [identity.pid]
        await loader.sync()  # the same session: no second call
        await loader.reset("test")
        await loader.sync()
        assert sessions == [identity.pid, identity.pid]
        await loader.close()


async def test_a_failing_session_hook_is_logged_not_raised(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def refused(client: RuntimeClient) -> None:
        raise CommandFailed("set ssl tls-key /k <key>", "Wrong ticket key size")

    async with FakeRuntimeSocket(sockdir / "admin.sock", HAProxyModel()) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        loader = Loader(client, SlotPool(10, "/certagent/slot-"), NAMES, on_session=refused)
        await loader.sync()
        assert client.connected
        await loader.close()
    assert "setting up the new HAProxy session" in caplog.text


async def test_a_stray_transaction_reloads_through_the_master_and_rewarms(sockdir: Path) -> None:
    old = HAProxyModel(pid=100, certs={SLOT: b"x"}, listed=[SLOT], transaction=(SLOT, None))
    old.marks["hot.test"] = 1
    new = HAProxyModel(pid=200)
    current = [old]
    rewarmed: list[list[str]] = []

    async with (
        FakeRuntimeSocket(sockdir / "admin.sock", lambda a, p: current[0](a, p)) as runtime,
        FakeMaster(sockdir / "master.sock", lambda: current.__setitem__(0, new)) as master,
    ):
        client = RuntimeClient(str(runtime.path), timeout=1.0)
        loader = Loader(
            client,
            SlotPool(10, "/certagent/slot-"),
            NAMES,
            master_socket=str(master.path),
            on_reload=rewarmed.append,
        )
        identity = await asyncio.wait_for(loader.sync(), 10)
        await loader.close()
    assert master.lines == [b"reload\n"]
    assert identity.pid == 200
    assert rewarmed == [["hot.test"]]
    assert loader.counters.recoveries == 1
