"""The data key and the fleet: which writes are refused, what an agent announces (no servers)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from certagent.api.problems import problem_for
from certagent.certs.keycrypt import KeyRing, generate_key_line, held_ids, key_fingerprint
from certagent.certs.pem import CertBundle, parse_bundle
from certagent.certs.validate import UploadPolicy
from certagent.cli.backends import StoreBackend
from certagent.cli.importer import import_certificates
from certagent.cli.statustext import _print_data_keys
from certagent.errors import ConfigError, ForeignDataKey, StoreUnavailable
from certagent.service import datakey
from certagent.service.datakey import Announcer, FleetKeys, foreign_key, key_checked
from certagent.service.metrics import render
from certagent.store.base import Store
from certagent.store.unreadable import UnreadableRecords
from certagent.testing.certs import combined, issue, make_ca, shared_key
from tests.memstore import MemoryStore
from tests.unit.service.test_metrics_text import snapshot


def ring(*lines: str) -> KeyRing:
    return KeyRing.from_text("\n".join(lines))


FLEET = generate_key_line()
OTHER = generate_key_line()
FLEET_KID, OTHER_KID = FLEET.partition(":")[0], OTHER.partition(":")[0]


# --- foreign_key: pure --------------------------------------------------------------------------


def test_a_writer_with_a_key_every_agent_holds_is_not_refused() -> None:
    holders = {"a": frozenset({FLEET_KID}), "b": frozenset({FLEET_KID, OTHER_KID})}
    assert foreign_key(ring(FLEET), "/k", holders) is None


def test_a_writer_whose_key_one_agent_lacks_is_refused_naming_both_keys_and_the_agent() -> None:
    holders = {"a": frozenset({FLEET_KID}), "b": frozenset({FLEET_KID, OTHER_KID})}
    refusal = foreign_key(ring(OTHER, FLEET), "/root/stale.key", holders)
    assert isinstance(refusal, ForeignDataKey) and isinstance(refusal, ConfigError)
    assert (refusal.key_id, refusal.fleet) == (OTHER_KID, (FLEET_KID,))
    text = str(refusal)
    assert f"/root/stale.key encrypts with data key {OTHER_KID}," in text
    assert "1 of the fleet's 2 running agents (a)" in text
    assert f"they hold data key {FLEET_KID}," in text
    assert "CERTAGENT_KEY_FILE" in text and "keys rotate" in text and "Nothing was stored" in text


def test_agents_that_share_no_key_are_said_to_share_none() -> None:
    third = generate_key_line().partition(":")[0]
    holders = {"a": frozenset({FLEET_KID}), "b": frozenset({third})}
    refusal = foreign_key(ring(OTHER), "", holders)
    assert refusal is not None and refusal.fleet == ()
    assert "this key file encrypts" in str(refusal)
    assert "no data key in common" in str(refusal)


def test_a_refusal_names_at_most_five_agents() -> None:
    holders = {f"node{i:02d}": frozenset({FLEET_KID}) for i in range(12)}
    text = str(foreign_key(ring(OTHER), "/k", holders))
    assert "node00, node01, node02, node03, node04 and 7 more" in text
    assert "node05" not in text


def test_two_different_keys_both_named_k1_do_not_pass_for_one() -> None:
    mine, theirs = ring(generate_key_line("k1")), ring(generate_key_line("k1"))
    refusal = foreign_key(mine, "/k", {"a": frozenset(held_ids(theirs))})
    assert refusal is not None
    assert f"data key k1 (fingerprint {key_fingerprint(mine.key('k1') or b'')})" in str(refusal)
    assert foreign_key(mine, "/k", {"a": frozenset(held_ids(mine))}) is None


def test_with_no_agent_running_the_stored_records_keys_stand_in() -> None:
    assert foreign_key(ring(FLEET), "/k", {}, used=()) is None  # an empty store
    assert foreign_key(ring(OTHER, FLEET), "/k", {}, used={FLEET_KID}) is None  # ahead: fine
    refusal = foreign_key(ring(OTHER), "/k", {}, used={FLEET_KID})
    assert refusal is not None and refusal.fleet == (FLEET_KID,)
    assert f"lacks data key {FLEET_KID}, which the stored records use" in str(refusal)


def test_held_ids_put_the_current_key_first_and_fingerprint_hand_named_ones() -> None:
    named = generate_key_line("k1")
    key = ring(named).key("k1")
    assert key is not None
    assert held_ids(ring(FLEET, named)) == (FLEET_KID, f"k1={key_fingerprint(key)}")
    assert held_ids(KeyRing(keys=ring(FLEET, named).keys, current="k1"))[0].startswith("k1=")


# --- the writers: FleetKeys, KeyCheckedWriter ---------------------------------------------------


class Keys:
    """A DataKeys role in memory: what agents announced, what records use, how often read."""

    def __init__(self, keyring: KeyRing | None, used: set[str] | None = None) -> None:
        self.keyring = keyring
        self.used = used or set()
        self.holders: dict[str, frozenset[str]] = {}
        self.reads = 0
        self.samples = 0
        self.records = UnreadableRecords()
        self.down = False

    async def key_ids_in_use(self, sample: int = 32) -> set[str]:
        self.samples += 1
        return self.used

    async def rotate_keys(self) -> int:
        return 0

    async def announce(self, node: str, key_ids: Sequence[str], ttl: float) -> None:
        if self.down:
            raise StoreUnavailable("redis://x: down")
        self.holders[node] = frozenset(key_ids)

    async def withdraw(self, node: str) -> None:
        self.holders.pop(node, None)

    async def fleet_key_ids(self) -> dict[str, frozenset[str]]:
        self.reads += 1
        return dict(self.holders)

    def unreadable(self) -> UnreadableRecords:
        return self.records


class Encrypting(MemoryStore):
    def __init__(self, keys: Keys) -> None:
        super().__init__()
        self.keys = keys

    def data_keys(self) -> Keys:  # type: ignore[override]
        return self.keys


def a_bundle(name: str) -> CertBundle:
    return parse_bundle(*issue(make_ca("datakey unit CA"), name, key=shared_key()))


async def test_the_api_store_refuses_a_write_the_fleet_cannot_read_and_writes_nothing() -> None:
    keys = Keys(ring(OTHER))
    keys.holders = {"a": frozenset({FLEET_KID})}
    store = Encrypting(keys)
    checked: Store = key_checked(store, "/etc/certagent/data.key")
    with pytest.raises(ForeignDataKey, match=OTHER_KID):
        await checked.add(a_bundle("refused.datakey.test"))
    assert store.records == {}
    keys.holders["a"] = frozenset({FLEET_KID, OTHER_KID})
    record = await checked.add(a_bundle("taken.datakey.test"))
    assert record.id in store.records
    assert keys.reads == 2 and keys.samples == 0  # one small read per write
    await checked.delete(record.id)  # a delete writes no key: nothing to check
    assert keys.reads == 2


def test_a_store_without_data_keys_is_not_wrapped() -> None:
    store = MemoryStore()
    assert key_checked(store, "") is store


async def test_the_records_sample_is_read_only_when_no_agent_announced() -> None:
    keys = Keys(ring(OTHER), used={FLEET_KID})
    with pytest.raises(ForeignDataKey, match="stored records use"):
        await FleetKeys(keys, "/k").check()
    assert (keys.reads, keys.samples) == (1, 1)
    await FleetKeys(Keys(None), "/k").check()  # no key ring: the store itself refuses to encrypt


# --- the agent: Announcer ----------------------------------------------------------------------


async def test_an_agent_announces_its_keys_until_it_stops_then_withdraws() -> None:
    keys = Keys(ring(FLEET, OTHER))
    announcer = Announcer(keys, "node-1")
    stop = asyncio.Event()
    task = asyncio.create_task(announcer.run(stop))
    for _ in range(100):
        if keys.holders:
            break
        await asyncio.sleep(0.01)
    assert keys.holders == {"node-1": frozenset({FLEET_KID, OTHER_KID})}
    stop.set()
    await asyncio.wait_for(task, 5)
    await announcer.withdraw()
    assert keys.holders == {}
    status = announcer.status()
    assert status["node"] == "node-1" and status["key_ids"] == [FLEET_KID, OTHER_KID]
    assert status["undecryptable"] == {"records": [], "by_key_id": {}}


async def test_an_announcement_the_store_refuses_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = Keys(ring(FLEET))
    keys.down = True
    assert await Announcer(keys, "node-1").announce() is False
    assert "cannot announce the data keys" in caplog.text


def test_an_announcement_outlives_two_missed_beats() -> None:
    assert datakey.TTL >= 3 * datakey.BEAT


# --- what the operator sees: metrics, the API's problem, `certagent status` ---------------------


def test_undecryptable_records_become_metrics_by_key_id() -> None:
    seen = UnreadableRecords()
    seen.note("id1", "a.test", OTHER_KID, "not in the key ring")
    seen.note("id1", "a.test", OTHER_KID, "not in the key ring")
    seen.note("id2", "b.test", None, "not a token")
    data_keys = {"node": "n", "key_ids": [FLEET_KID], "undecryptable": seen.snapshot()}
    text = render(snapshot(data_keys=data_keys)).decode()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    total = "certagent_undecryptable_records_total"
    assert found[(total, (("key_id", OTHER_KID),))] == 2
    assert found[(total, (("key_id", "none"),))] == 1
    assert found[("certagent_undecryptable_records_listed", ())] == 2
    assert "certagent_undecryptable" not in render(snapshot(data_keys=None)).decode()


def test_a_foreign_data_key_is_a_409_problem_naming_the_key() -> None:
    refusal = foreign_key(ring(OTHER), "/k", {"a": frozenset({FLEET_KID})})
    assert refusal is not None
    problem = problem_for(refusal)
    assert (problem.status, problem.code) == (409, "foreign-data-key")
    assert OTHER_KID in problem.detail and FLEET_KID in problem.detail


def test_status_lists_the_records_the_agent_cannot_decrypt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen = UnreadableRecords()
    for i in range(7):
        seen.note(f"id{i}", f"h{i}.test", OTHER_KID, "not in the key ring")
    _print_data_keys({"node": "web1", "key_ids": [FLEET_KID], "undecryptable": seen.snapshot()})
    out = capsys.readouterr().out
    assert f"data keys      {FLEET_KID} (the first is current), announced as web1" in out
    assert "UNDECRYPTABLE 7 record(s)" in out
    assert f"h6.test: record id6, data key {OTHER_KID}" in out  # newest first, five shown
    assert "h1.test" not in out
    _print_data_keys(None)
    assert capsys.readouterr().out == ""


# --- the CLI's writes: once per command ---------------------------------------------------------


async def test_the_cli_asks_the_fleet_once_per_command(tmp_path: Path) -> None:
    keys = Keys(ring(FLEET))
    keys.holders = {"a": frozenset({FLEET_KID})}
    store = Encrypting(keys)
    backend = StoreBackend(store, UploadPolicy(), fleet=FleetKeys(keys, "/k"))
    ca = make_ca("datakey cli CA")
    for name in ("one.datakey.test", "two.datakey.test"):
        await backend.add(*issue(ca, name, key=shared_key()))
    assert len(store.records) == 2 and keys.reads == 1


async def test_an_import_with_a_foreign_key_stops_before_writing_anything(tmp_path: Path) -> None:
    keys = Keys(ring(OTHER))
    keys.holders = {"a": frozenset({FLEET_KID})}
    store = Encrypting(keys)
    backend = StoreBackend(store, UploadPolicy(), fleet=FleetKeys(keys, "/k"))
    ca = make_ca("datakey import CA")
    for i in range(3):
        (tmp_path / f"i{i}.datakey.test.pem").write_bytes(
            combined(*issue(ca, f"i{i}.datakey.test", key=shared_key()))
        )
    with pytest.raises(ForeignDataKey, match=OTHER_KID):
        await import_certificates(backend, tmp_path, workers=0)
    assert store.records == {} and keys.reads == 1
