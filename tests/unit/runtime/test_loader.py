"""The loader's command sequences and failure handling, against a scripted runtime API.

The replies are the ones HAProxy 2.6.12 gives (recorded in the protocol tests and
in the design facts).  Real-HAProxy behaviour is covered by tests/integration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from certagent.certs.pem import parse_bundle
from certagent.errors import AgentError, Busy
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.loader import Loader
from certagent.runtime.loadqueue import Priority
from certagent.runtime.pool import SlotPool, SlotState
from certagent.runtime.protocol import Command, Identity
from certagent.runtime.recycles import RecycleLog
from certagent.store.base import StoredCertificate
from certagent.testing.certs import issue as issue_cert_pair
from certagent.testing.certs import make_ca

LIST = "/etc/haproxy/certagent.crtlist"
NAMES = HAProxyNames(LIST, "fe_sni", 3_600_000)

Responder = Callable[[tuple[str, ...]], str]


def haproxy_2_6(args: tuple[str, ...]) -> str:
    """What HAProxy answers when everything works."""
    verb, name = " ".join(args[:3]), args[-1]
    if verb == "new ssl cert":
        return f"New empty certificate store '{name}'!"
    if verb == "set ssl cert":
        return f"Transaction created for certificate {name}!"
    if verb == "commit ssl cert":
        return f"Committing {name}\nSuccess!"
    if verb == "abort ssl cert":
        return "No ongoing transaction!"
    if verb == "add ssl crt-list":
        return f"Inserting certificate '{name}' in crt-list '{LIST}'.\nSuccess!"
    if args[:2] in (("set", "table"), ("clear", "table")):
        return ""
    if args[:2] == ("show", "table"):
        return f"# table: {args[2]}, type: string, size:2000, used:0"
    raise AssertionError(f"unexpected command {args}")


class ScriptedRuntime:
    """Records every round trip; answers each command with ``respond``."""

    def __init__(self, respond: Responder = haproxy_2_6) -> None:
        self.respond = respond
        self.round_trips: list[list[tuple[str, ...]]] = []
        self.identity: Identity | None = Identity(1, 1, "2.6.12")
        self.connected = True
        self.path = "/nonexistent"
        self.timeout = 1.0

    async def pipeline(self, commands: Sequence[Command]) -> list[str]:
        if not commands:
            return []
        self.round_trips.append([c.args for c in commands])
        return [self.respond(c.args) for c in commands]

    async def execute(self, command: Command) -> str:
        self.round_trips.append([command.args])
        return self.respond(command.args)

    async def close(self) -> None:
        self.connected = False


def stored(host: str) -> StoredCertificate:
    chain, key = issue_cert_pair(CA, host)
    return StoredCertificate(id=f"id-{host}", bundle=parse_bundle(chain, key))


CA = make_ca()


def loader_with(runtime: ScriptedRuntime, pool: SlotPool) -> Loader:
    return Loader(runtime, pool, NAMES)  # type: ignore[arg-type]


def test_a_growth_load_and_its_mark_are_one_round_trip() -> None:
    runtime = ScriptedRuntime()
    pool = SlotPool(10, "/certagent/slot-")
    loader = loader_with(runtime, pool)
    slots = asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    slot = "/certagent/slot-00001.pem"
    assert [s.name for s in slots] == [slot]
    assert [[" ".join(c[:3]) for c in trip] for trip in runtime.round_trips] == [
        [
            "new ssl cert", "set ssl cert", "commit ssl cert", "abort ssl cert",
            "add ssl crt-list", "set table fe_sni",
        ],
    ]  # fmt: skip
    assert runtime.round_trips[0][-1] == (
        "set", "table", "fe_sni", "key", "a.example.test", "data.gpt0", "1"
    )  # fmt: skip
    assert pool.for_host("a.example.test") == slots


def test_a_failed_commit_into_a_new_slot_lists_nothing_and_leaves_no_mark() -> None:
    def refuse(args: tuple[str, ...]) -> str:
        name = args[-1]
        if args[0] == "commit":
            return f"Committing {name}\ninconsistencies between private key and certificate"
        if args[:3] == ("add", "ssl", "crt-list"):
            return f"Can't edit the crt-list: certificate '{name}' is empty!"
        return haproxy_2_6(args)

    runtime = ScriptedRuntime(refuse)
    pool = SlotPool(10, "/certagent/slot-")
    loader = loader_with(runtime, pool)
    with pytest.raises(AgentError, match="inconsistencies"):
        asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    # the mark rode in the load's write; the failed commit takes it back at once
    assert len(runtime.round_trips) == 2
    assert runtime.round_trips[1] == [
        ("set", "table", "fe_sni", "key", "a.example.test", "data.gpt0", "0"),
        ("clear", "table", "fe_sni", "key", "a.example.test"),
    ]
    assert not pool.is_marked("a.example.test")
    assert len(pool) == 0
    # the name HAProxy now knows is reused (no `new`) by the next load
    assert pool.growth(1) == [("/certagent/slot-00001.pem", SlotState.KNOWN)]
    assert loader.counters.failures == 1


def test_a_spare_store_listed_after_a_failed_commit_gets_the_placeholder() -> None:
    """A spare name from an earlier agent may hold a certificate; if our commit fails
    but the crt-list line goes in, that leftover must not be served."""
    spare = "/certagent/slot-00001.pem"

    refused: list[str] = []

    def refuse_commit_once(args: tuple[str, ...]) -> str:
        if args[0] == "commit" and not refused:
            refused.append(args[-1])
            return f"Committing {args[-1]}\nunable to load certificate\nCan't commit {args[-1]}!"
        return haproxy_2_6(args)

    runtime = ScriptedRuntime(refuse_commit_once)
    pool = SlotPool(10, "/certagent/slot-")
    pool.add_spare(spare)
    loader = loader_with(runtime, pool)
    with pytest.raises(AgentError, match="Can't commit"):
        asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    first, *placeholder, unmark = runtime.round_trips
    assert [c[:3] for c in first] == [
        ("set", "ssl", "cert"), ("commit", "ssl", "cert"), ("abort", "ssl", "cert"),
        ("add", "ssl", "crt-list"), ("set", "table", "fe_sni"),
    ]  # fmt: skip
    # the placeholder goes in by the batch's own transaction: one write, abort included
    assert placeholder == [
        [("set", "ssl", "cert", spare), ("commit", "ssl", "cert", spare),
         ("abort", "ssl", "cert", spare)],
    ]  # fmt: skip
    assert [c[:3] for c in unmark] == [("set", "table", "fe_sni"), ("clear", "table", "fe_sni")]
    assert pool.free_slots == (spare,)
    assert pool.growth(2) == [  # the leftover name is offered once, as a listed slot
        (spare, SlotState.LISTED),
        ("/certagent/slot-00002.pem", SlotState.NEW),
    ]
    assert not pool.is_marked("a.example.test")


def test_recycling_unmarks_the_old_hosts_first_and_marks_the_new_one_after() -> None:
    runtime = ScriptedRuntime()
    pool = SlotPool(1, "/certagent/slot-")
    loader = loader_with(runtime, pool)
    asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    runtime.round_trips.clear()
    slots = asyncio.run(loader.install("b.example.test", [stored("b.example.test")], 1.0))
    slot = "/certagent/slot-00001.pem"
    assert [s.name for s in slots] == [slot]
    load = next(trip for trip in runtime.round_trips if ("commit", "ssl", "cert", slot) in trip)
    assert [c[:3] for c in load] == [
        ("set", "table", "fe_sni"), ("clear", "table", "fe_sni"),
        ("set", "ssl", "cert"), ("commit", "ssl", "cert"), ("abort", "ssl", "cert"),
        ("set", "table", "fe_sni"),
    ]  # fmt: skip
    assert load[0] == ("set", "table", "fe_sni", "key", "a.example.test", "data.gpt0", "0")
    assert load[1] == ("clear", "table", "fe_sni", "key", "a.example.test")
    assert load[-1] == ("set", "table", "fe_sni", "key", "b.example.test", "data.gpt0", "1")
    # the victim's usage was read in a round trip of its own, before
    assert ("show", "table", "fe_sni", "key", "a.example.test") in runtime.round_trips[0]
    assert runtime.round_trips[-1] is load
    assert not pool.is_marked("a.example.test")
    assert loader.counters.recycles == 1


def test_back_to_back_recycles_read_the_next_victims_usage_in_the_load_write() -> None:
    """While recycling, the load's write also reads the next candidates' usage; a recycle
    within AHEAD_TTL uses it (one round trip), a later one reads afresh (two)."""
    now = [100.0]
    runtime = ScriptedRuntime()
    pool = SlotPool(8, "/certagent/slot-")
    loader = Loader(runtime, pool, NAMES, clock=lambda: now[0])  # type: ignore[arg-type]

    def install(host: str) -> list[list[tuple[str, ...]]]:
        runtime.round_trips.clear()
        asyncio.run(loader.install(host, [stored(host)], 1.0))
        return list(runtime.round_trips)

    for i in range(8):
        install(f"a{i}.example.test")
    first = install("b0.example.test")  # nothing read ahead yet: usage, then the load
    assert len(first) == 2 and {c[:3] for c in first[0]} == {("show", "table", "fe_sni")}
    reads = [c for c in first[1] if c[:2] == ("show", "table")]
    assert reads and first[1][-len(reads) :] == reads  # the read-ahead rides at the end
    assert all(c[4].startswith("a") for c in reads)  # never the host just loaded
    now[0] += 0.1
    second = install("b1.example.test")
    assert len(second) == 1  # chosen from the read-ahead: no round trip of its own
    victim = next(c[4] for c in second[0] if c[:2] == ("clear", "table"))
    assert ("show", "table", "fe_sni", "key", victim) in reads
    now[0] += 5.0  # older than AHEAD_TTL: read afresh
    third = install("b2.example.test")
    assert len(third) == 2 and third[0][0][:2] == ("show", "table")
    assert loader.counters.recycles == 3 and len(pool) == 8


def test_an_entry_in_use_does_not_fail_the_load() -> None:
    """``clear table`` is refused while a live connection tracks the old host: that host is
    already unmarked (gpt0 0), so the load goes on."""

    def in_use(args: tuple[str, ...]) -> str:
        if args[:2] == ("clear", "table"):
            return "Entry currently in use, cannot remove"
        return haproxy_2_6(args)

    runtime = ScriptedRuntime(in_use)
    pool = SlotPool(1, "/certagent/slot-")
    loader = loader_with(runtime, pool)
    asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    slots = asyncio.run(loader.install("b.example.test", [stored("b.example.test")], 1.0))
    assert [s.name for s in slots] == ["/certagent/slot-00001.pem"]
    assert pool.is_marked("b.example.test") and not pool.is_marked("a.example.test")
    assert loader.counters.failures == 0 and loader.counters.recycles == 1


def test_a_load_not_done_within_its_hold_is_busy_and_leaves_the_queue() -> None:
    gate = asyncio.Event()

    class SlowRuntime(ScriptedRuntime):
        async def pipeline(self, commands: Sequence[Command]) -> list[str]:
            await gate.wait()
            return await super().pipeline(commands)

    async def main() -> None:
        runtime = SlowRuntime()
        pool = SlotPool(10, "/certagent/slot-")
        loader = Loader(runtime, pool, NAMES, batch=1)  # type: ignore[arg-type]
        first = asyncio.create_task(loader.install("a.example.test", [stored("a.example.test")], 5))
        await asyncio.sleep(0)
        with pytest.raises(Busy, match="hold"):
            await loader.install("b.example.test", [stored("b.example.test")], 0.05)
        assert loader.waiting() == 0  # b left the queue; a is being written
        gate.set()
        assert [s.name for s in await first] == ["/certagent/slot-00001.pem"]
        assert not pool.is_marked("b.example.test")
        assert loader.counters.busy == 1

    asyncio.run(main())


def test_clients_go_before_rewarming() -> None:
    async def main() -> None:
        runtime = ScriptedRuntime()
        pool = SlotPool(10, "/certagent/slot-")
        loader = Loader(runtime, pool, NAMES, batch=1)  # type: ignore[arg-type]
        rewarm = [
            asyncio.create_task(
                loader.install(h, [stored(h)], 5, priority=Priority.REWARM)
            )
            for h in ("r1.example.test", "r2.example.test")
        ]
        c = stored("c.example.test")
        client = asyncio.create_task(loader.install("c.example.test", [c], 5))
        await asyncio.gather(*rewarm, client)
        marked = [c[4] for trip in runtime.round_trips for c in trip if c[:2] == ("set", "table")]
        # queued before the writer woke up: the client's load jumps both re-warm loads
        assert marked == ["c.example.test", "r1.example.test", "r2.example.test"]

    asyncio.run(main())


def test_max_waiting_answers_busy_at_once() -> None:
    gate = asyncio.Event()

    class SlowRuntime(ScriptedRuntime):
        async def pipeline(self, commands: Sequence[Command]) -> list[str]:
            await gate.wait()
            return await super().pipeline(commands)

    async def main() -> None:
        pool = SlotPool(10, "/certagent/slot-")
        runtime = SlowRuntime()
        loader = Loader(runtime, pool, NAMES, max_waiting=1, batch=1)  # type: ignore[arg-type]
        a, b = (stored(h) for h in ("a.example.test", "b.example.test"))
        writing = asyncio.create_task(loader.install("a.example.test", [a], 5))
        await asyncio.sleep(0.01)  # a is being written: the queue is empty again
        waiting = asyncio.create_task(loader.install("b.example.test", [b], 5))
        await asyncio.sleep(0.01)
        assert loader.waiting() == 1
        with pytest.raises(Busy, match="already waiting"):
            await loader.install("c.example.test", [stored("c.example.test")], 5)
        gate.set()
        await asyncio.gather(writing, waiting)

    asyncio.run(main())


def test_rewarm_loads_alone_go_out_in_bigger_batches_and_clients_still_first() -> None:
    async def main() -> None:
        runtime = ScriptedRuntime()
        pool = SlotPool(100, "/certagent/slot-")
        loader = Loader(runtime, pool, NAMES, batch=2)  # type: ignore[arg-type]
        hosts = [f"r{i}.example.test" for i in range(40)]
        c = stored("c.example.test")
        client = asyncio.create_task(loader.install("c.example.test", [c], 5))
        rewarm = [
            asyncio.create_task(loader.install(h, [stored(h)], 5, priority=Priority.REWARM))
            for h in hosts
        ]
        await asyncio.gather(client, *rewarm)
        marks = [
            [c[4] for c in trip if c[:2] == ("set", "table")] for trip in runtime.round_trips
        ]
        # the client's load goes with the loader's own batch size (2: one re-warm joins it);
        # re-warm loads alone then go 32 at a time, not 2
        assert [len(m) for m in marks] == [2, 32, 7]
        assert marks[0] == ["c.example.test", "r0.example.test"]

    asyncio.run(main())


def test_a_recycled_host_loaded_again_within_the_window_counts_as_a_return() -> None:
    """HTTP/3: the loader tells its RecycleLog which hosts lost their slot, and when."""
    runtime = ScriptedRuntime()
    pool = SlotPool(1, "/certagent/slot-")
    now = [100.0]
    log = RecycleLog(window=60.0)
    loader = Loader(runtime, pool, NAMES, recycles=log, clock=lambda: now[0])  # type: ignore[arg-type]
    for host, at in (("a.example.test", 100.0), ("b.example.test", 130.0)):
        now[0] = at
        asyncio.run(loader.install(host, [stored(host)], 1.0))
    # a was loaded at 100 and never used again: idle 30 s when b took its slot
    assert log.status()["recycled_idle_s"] == {
        "recycles": 1, "min": 30.0, "p10": 30.0, "median": 30.0
    }  # fmt: skip
    now[0] = 150.0  # a comes back 20 s after losing its slot: a return
    asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    assert log.returns == 1
    now[0] = 300.0  # b comes back 150 s after: outside the window
    asyncio.run(loader.install("b.example.test", [stored("b.example.test")], 1.0))
    assert log.returns == 1
    assert loader.counters.recycles == 3
