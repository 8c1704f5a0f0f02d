"""Reloading through HAProxy's master CLI (asyncio, the loop never blocks), and re-adopting."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from certagent.errors import HAProxyError, StrayTransaction
from certagent.runtime.client import RuntimeClient
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import SlotPool
from certagent.runtime.protocol import Identity
from certagent.runtime.recover import (
    graceful_reload,
    reload_and_adopt,
    reload_through_master_socket,
)
from tests.unit.runtime.fakehaproxy import FakeRuntimeSocket, HAProxyModel

NAMES = HAProxyNames("/etc/certagent/certagent.crtlist", "fe_sni", 3_600_000)
SLOT = "/certagent/slot-00001.pem"


class FakeMaster:
    """HAProxy's master CLI: takes ``reload``, waits ``delay``, then closes."""

    def __init__(self, path: Path, on_reload: Callable[[], None] = lambda: None) -> None:
        self.path = path
        self.on_reload = on_reload
        self.delay = 0.0
        self.lines: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._closing = asyncio.Event()
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakeMaster:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        self._closing.set()  # Python 3.11's wait_closed does not wait for the connections
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        try:
            self.lines.append(await reader.readline())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.delay)
            self.on_reload()
        finally:
            writer.close()


async def test_reload_is_asked_on_the_master_cli(sockdir: Path) -> None:
    async with FakeMaster(sockdir / "master.sock") as master:
        assert await graceful_reload(12345, str(master.path)) == 0
    assert master.lines == [b"reload\n"]


async def test_the_event_loop_runs_while_the_master_takes_its_time(sockdir: Path) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with FakeMaster(sockdir / "master.sock") as master:
        master.delay = 0.3
        ticker = asyncio.create_task(tick())
        await reload_through_master_socket(str(master.path))
        ticker.cancel()
    assert ticks >= 10  # a blocking call would have let none run


async def test_a_master_that_never_answers_is_an_error_within_the_timeout(sockdir: Path) -> None:
    async with FakeMaster(sockdir / "master.sock") as master:
        master.delay = 5.0
        started = time.monotonic()
        with pytest.raises(HAProxyError, match=r"no answer within 0s.*master CLI"):
            await reload_through_master_socket(str(master.path), timeout=0.2)
        assert time.monotonic() - started < 2.0


async def test_no_master_socket_says_what_it_must_be(sockdir: Path) -> None:
    with pytest.raises(HAProxyError, match=r"haproxy -S"):
        await reload_through_master_socket(str(sockdir / "absent.sock"))


async def test_a_stray_transaction_is_left_to_a_reload_and_the_new_worker_adopted(
    sockdir: Path,
) -> None:
    old = HAProxyModel(pid=100, certs={SLOT: b"x"}, listed=[SLOT], transaction=(SLOT, None))
    old.marks.update({"hot.test": 1, "cold.test": 1})
    new = HAProxyModel(pid=200)
    current = [old]

    async with (
        FakeRuntimeSocket(sockdir / "admin.sock", lambda a, p: current[0](a, p)) as runtime,
        FakeMaster(sockdir / "master.sock", lambda: current.__setitem__(0, new)) as master,
    ):
        client = RuntimeClient(str(runtime.path), timeout=1.0)
        await client.connect()
        pool = SlotPool(10, "/certagent/slot-")
        identity, hosts = await reload_and_adopt(
            client, pool, NAMES, StrayTransaction(SLOT), time.monotonic, str(master.path)
        )
        await client.close()
    assert identity == Identity(200, 1, "2.6.12")
    assert sorted(hosts) == ["cold.test", "hot.test"]  # the old worker's, to re-warm
    assert len(pool) == 0
    assert old.transaction == (SLOT, None)  # never touched
    assert not any(args[0] in ("abort", "commit", "set") for args in old.log)
