"""The loader's command sequences and failure handling, against a scripted runtime API.

The replies are the ones HAProxy 2.6.12 gives (recorded in the protocol tests and
in the design facts).  Real-HAProxy behaviour is covered by tests/integration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from agent.errors import AgentError
from agent.loader import HAProxyNames, Loader
from agent.pem import parse_bundle
from agent.pool import SlotPool, SlotState
from agent.runtime.client import Command, Identity
from agent.store.base import StoredCertificate
from tests.certs import issue as issue_cert_pair
from tests.certs import make_ca

LIST = "/etc/haproxy/certagent.crtlist"
MAP = "/etc/haproxy/loaded.map"
NAMES = HAProxyNames(LIST, MAP, "fe_sni", 3_600_000)

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
    if args[:2] in (("add", "map"), ("del", "map"), ("clear", "table")):
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

    async def execute_cert(self, *args: str, payload: bytes | None = None) -> str:
        self.round_trips.append([args])
        return self.respond(args)

    async def execute(self, *args: str) -> str:
        self.round_trips.append([args])
        return self.respond(args)

    async def close(self) -> None:
        self.connected = False


def stored(host: str) -> StoredCertificate:
    chain, key = issue_cert_pair(CA, host)
    return StoredCertificate(id=f"id-{host}", bundle=parse_bundle(chain, key))


CA = make_ca()


def loader_with(runtime: ScriptedRuntime, pool: SlotPool) -> Loader:
    return Loader(runtime, pool, NAMES)  # type: ignore[arg-type]


def test_a_growth_load_is_one_round_trip_then_the_map() -> None:
    runtime = ScriptedRuntime()
    pool = SlotPool(10, "/certagent/slot-")
    loader = loader_with(runtime, pool)
    slots = asyncio.run(loader.install("a.example.test", [stored("a.example.test")], 1.0))
    slot = "/certagent/slot-00001.pem"
    assert [s.name for s in slots] == [slot]
    assert [[" ".join(c[:3]) for c in trip] for trip in runtime.round_trips] == [
        ["new ssl cert", "set ssl cert", "commit ssl cert", "abort ssl cert", "add ssl crt-list"],
        ["add map " + MAP],
    ]
    assert runtime.round_trips[1] == [("add", "map", MAP, "a.example.test", slot)]
    assert pool.for_host("a.example.test") == slots


def test_a_failed_commit_into_a_new_slot_lists_nothing_and_maps_nothing() -> None:
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
    assert len(runtime.round_trips) == 1  # no map write, no placeholder
    assert not pool.is_mapped("a.example.test")
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
    first, *placeholder = runtime.round_trips
    assert [c[:3] for c in first] == [
        ("set", "ssl", "cert"), ("commit", "ssl", "cert"), ("abort", "ssl", "cert"),
        ("add", "ssl", "crt-list"),
    ]  # fmt: skip
    assert placeholder == [[("set", "ssl", "cert", spare)], [("commit", "ssl", "cert", spare)]]
    assert pool.free_slots == (spare,)
    assert pool.growth(2) == [  # the leftover name is offered once, as a listed slot
        (spare, SlotState.LISTED),
        ("/certagent/slot-00002.pem", SlotState.NEW),
    ]
    assert not pool.is_mapped("a.example.test")


def test_recycling_takes_the_old_hosts_out_of_the_map_and_the_usage_table_first() -> None:
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
        ("del", "map", MAP), ("clear", "table", "fe_sni"),
        ("set", "ssl", "cert"), ("commit", "ssl", "cert"), ("abort", "ssl", "cert"),
    ]  # fmt: skip
    assert load[1] == ("clear", "table", "fe_sni", "key", "a.example.test")
    assert runtime.round_trips[-1] == [("add", "map", MAP, "b.example.test", slot)]
    assert not pool.is_mapped("a.example.test")
    assert loader.counters.recycles == 1
