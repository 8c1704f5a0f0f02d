"""Records a store could not decrypt: bounded, by key id; the announcements' reply (no servers)."""

from __future__ import annotations

from certagent.store.redis._fleetkeys import parse_holders
from certagent.store.unreadable import KEY_IDS, RECORDS, UnreadableRecords


def test_unreadable_records_are_listed_newest_first_and_leave_when_readable() -> None:
    now = [100.0]
    seen = UnreadableRecords(clock=lambda: now[0])
    assert not seen
    seen.note("id1", "a.test", "kabc", "not in the key ring")
    now[0] = 101.0
    seen.note("id2", "b.test", None, "not a token")
    assert seen
    snap = seen.snapshot()
    assert [r["id"] for r in snap["records"]] == ["id2", "id1"]
    assert snap["records"][0] == {
        "id": "id2", "name": "b.test", "key_id": "none", "reason": "not a token", "seen_at": 101,
    }  # fmt: skip
    assert snap["by_key_id"] == {"kabc": 1, "none": 1}
    seen.readable("id1")
    assert [r.cert_id for r in seen.records()] == ["id2"]
    assert seen.by_key_id == {"kabc": 1, "none": 1}  # a counter: it never goes down


def test_unreadable_records_and_key_id_labels_stay_bounded() -> None:
    seen = UnreadableRecords()
    for i in range(RECORDS + 30):
        seen.note(f"id{i}", f"h{i}.test", f"k{i}", "x")
    assert len(seen.records()) == RECORDS
    assert seen.records()[-1].cert_id == f"id{RECORDS + 29}"
    assert len(seen.by_key_id) == KEY_IDS + 1
    assert seen.by_key_id["other"] == RECORDS + 30 - KEY_IDS
    seen.note("id0", "h0.test", "k0", "again")  # a known key id keeps its own label
    assert seen.by_key_id["k0"] == 2


def test_the_announcements_reply_drops_lapsed_and_malformed_entries() -> None:
    reply = [
        b"1000",
        b"web1", b"2000 kaaa k1=kbbb",
        b"web2", b"999 kaaa",  # lapsed
        b"web3", b"oops kaaa",  # malformed
        b"web4", b"5000",  # no key ids
    ]  # fmt: skip
    assert parse_holders(reply) == {"web1": frozenset({"kaaa", "k1=kbbb"})}
    assert parse_holders([]) == {}
    assert parse_holders(None) == {}
    assert parse_holders([b"x", b"web1", b"2000 kaaa"]) == {}
