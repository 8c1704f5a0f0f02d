"""The ticket keeper: ring of record, HAProxy's keys file, pushes, rotation, a lost ring."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from certagent.certs.ticketkeys import fresh_key, keys_file
from certagent.errors import RotationInProgress, StoreCorrupt
from certagent.runtime.client import Command
from certagent.service import tickets
from certagent.service.tickets import TicketKeeper
from certagent.store.directory import LocalRing


class FakeHAProxy:
    """HAProxy's ticket-key ring as ``show tls-keys`` / ``set ssl tls-key`` see it."""

    def __init__(self, path: str, has_file: bool = True) -> None:
        self.path = path
        self.keys = [fresh_key() for _ in range(3)] if has_file else None
        self.sets = 0

    async def execute(self, command: Command) -> str:
        assert command.args == ("show", "tls-keys", self.path)
        if self.keys is None:
            return "'show tls-keys' unable to locate referenced filename"
        rows = [f"0.{i} {k}" for i, k in enumerate(self.keys)]
        return "\n".join(["# id secret", f"# 0 ({self.path})", *rows])

    async def pipeline(self, commands: Sequence[Command]) -> list[str]:
        replies = []
        for c in commands:
            assert c.args[:4] == ("set", "ssl", "tls-key", self.path) and self.keys is not None
            self.keys = [*self.keys[1:], c.args[4]]
            self.sets += 1
            replies.append("TLS ticket key updated!")
        return replies


class FakeLoader:
    def __init__(self, haproxy: FakeHAProxy) -> None:
        self.haproxy = haproxy

    async def exclusive(
        self, work: Callable[[Any], Awaitable[None]], deadline: float, what: str
    ) -> None:
        await work(self.haproxy)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, has_file: bool = True) -> tuple[TicketKeeper, FakeHAProxy, Clock]:
    keys_path = tmp_path / "tickets" / "tls-ticket.keys"
    keys_path.parent.mkdir()
    haproxy = FakeHAProxy(str(keys_path), has_file)
    clock = Clock()
    keeper = TicketKeeper(
        LocalRing(tmp_path / "tickets" / "ring.json"),
        keys_path,
        3600.0,
        FakeLoader(haproxy),  # type: ignore[arg-type]
        clock=clock,
    )
    return keeper, haproxy, clock


async def test_start_makes_a_ring_writes_haproxys_file_and_a_session_gets_it(
    tmp_path: Path,
) -> None:
    keeper, haproxy, _ = make(tmp_path)
    await keeper.start()
    ring = keeper.ring
    assert ring is not None and keeper.counters.rotations == 1
    assert keeper.keys_path.read_bytes() == keys_file(ring)
    assert oct(keeper.keys_path.stat().st_mode & 0o777) == "0o600"
    await keeper.sync(haproxy)  # type: ignore[arg-type]
    assert haproxy.keys == list(ring.keys) and haproxy.sets == 3
    await keeper.sync(haproxy)  # type: ignore[arg-type]
    assert haproxy.sets == 3 and keeper.in_haproxy is True


async def test_a_restart_keeps_the_ring_until_it_is_due(tmp_path: Path) -> None:
    keeper, _, clock = make(tmp_path)
    await keeper.start()
    first = keeper.ring
    restarted = TicketKeeper(keeper.store, keeper.keys_path, 3600.0, keeper.loader, clock=clock)
    clock.now += 3599
    await restarted.start()
    assert restarted.ring == first and restarted.counters.rotations == 0
    clock.now += 2
    later = TicketKeeper(keeper.store, keeper.keys_path, 3600.0, keeper.loader, clock=clock)
    await later.start()
    assert later.ring is not None and first is not None
    assert later.ring.generation == first.generation + 1
    assert later.ring.keys[:2] == first.keys[1:]


async def test_rotate_now_pushes_one_key(tmp_path: Path) -> None:
    keeper, haproxy, clock = make(tmp_path)
    await keeper.start()
    await keeper.sync(haproxy)  # type: ignore[arg-type]
    clock.now += 10
    ring = await keeper.rotate_now()
    assert haproxy.keys == list(ring.keys) and haproxy.sets == 4  # 3, then 1
    assert keeper.keys_path.read_bytes() == keys_file(ring)
    assert keeper.status()["next_rotation"] == round(clock.now + 3600)


async def test_an_haproxy_without_the_keys_file_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keeper, haproxy, _ = make(tmp_path, has_file=False)
    await keeper.start()
    with caplog.at_level(logging.WARNING):
        await keeper.sync(haproxy)  # type: ignore[arg-type]
        await keeper.sync(haproxy)  # type: ignore[arg-type]
    assert keeper.in_haproxy is False
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "tls-ticket-keys" in caplog.records[0].message
    assert all(k not in caplog.text for k in keeper.ring.keys)  # type: ignore[union-attr]


async def test_a_store_that_lost_the_ring_gets_ours_back(tmp_path: Path) -> None:
    keeper, _, _ = make(tmp_path)
    await keeper.start()
    ring = keeper.ring
    (tmp_path / "tickets" / "ring.json").unlink()
    await keeper.refresh()
    assert keeper.ring == ring
    assert await keeper.store.load() == ring


async def test_a_corrupt_local_ring_says_what_to_do(tmp_path: Path) -> None:
    keeper, _, _ = make(tmp_path)
    (tmp_path / "tickets" / "ring.json").write_text('{"generation": 2, "keys": ["x"]}')
    with pytest.raises(StoreCorrupt, match="delete it"):
        await keeper.start()


class BusyRing(LocalRing):
    """A store whose rotation lock another agent holds for ``busy`` attempts, then its ring."""

    def __init__(self, path: Path, other: TicketKeeper, busy: int) -> None:
        super().__init__(path)
        self.other, self.busy, self.refused = other, busy, 0

    async def rotate(self, expected: Any, make: Any) -> Any:
        if self.refused < self.busy:
            self.refused += 1
            if self.refused == self.busy:  # the other agent's rotation ends now
                await self.other.start()
            raise RotationInProgress("another agent is rotating the ticket keys")
        return await super().rotate(expected, make)


async def test_a_node_starting_with_another_takes_its_ring_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two nodes started together: one holds the rotation lock while it makes the ring; the
    # other must start with that ring, not with none for RETRY seconds (its HAProxy would
    # keep its own keys, and sessions from the first node would not resume there)
    monkeypatch.setattr(tickets, "BUSY_WAIT", 0.0)
    first, _, clock = make(tmp_path)
    store = BusyRing(tmp_path / "tickets" / "ring.json", first, busy=3)
    second = TicketKeeper(store, tmp_path / "second.keys", 3600.0, first.loader, clock=clock)
    await second.start_quietly()
    assert store.refused == 3 and second.counters.errors == 0
    assert second.ring is not None and second.ring == first.ring
    assert second.counters.rotations == 0


async def test_a_rotation_lock_held_past_the_bound_is_said_and_left_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tickets, "BUSY_WAIT", 0.0)
    first, _, clock = make(tmp_path)
    store = BusyRing(tmp_path / "tickets" / "ring.json", first, busy=10**6)
    second = TicketKeeper(store, tmp_path / "second.keys", 3600.0, first.loader, clock=clock)
    with caplog.at_level(logging.WARNING):
        await second.start_quietly()
    assert store.refused == tickets.BUSY_TRIES and second.ring is None
    assert second.counters.errors == 1 and "held the rotation lock" in caplog.text
