"""Store formats and the fleet's board: the rules and the parsing of what Redis holds (pure)."""

from __future__ import annotations

import pytest

from certagent.store.formats import (
    FORMATS,
    LEGACY,
    NEWEST,
    READS,
    FormatState,
    NodeInfo,
    NodeSeen,
    StoreFormatError,
    check_known,
    describe_formats,
    holding_back,
)
from certagent.store.redis._fleet import active_layout, parse_format, parse_nodes

NOW_MS = 1_800_000_000_000


def test_formats_are_listed_once_in_order_and_this_release_reads_them_all() -> None:
    numbers = [f.number for f in FORMATS]
    assert numbers == sorted(set(numbers)) == [1, 2]
    assert {1, 2} == READS and LEGACY == 1 and NEWEST == 2
    assert all(f.gates and f.since for f in FORMATS)


def test_an_unknown_format_is_refused_naming_it_and_who_set_it() -> None:
    check_known(FormatState(2), "redis://x", "0.3.0")
    state = FormatState(3, True, "0.9.0", "edge-7", "2027-03-01T00:00:00Z")
    with pytest.raises(StoreFormatError) as refused:
        check_known(state, "redis://x", "0.3.0")
    text = str(refused.value)
    for part in ("format 3", "certagent 0.9.0", "edge-7", "reads formats 1-2", "0.3.0"):
        assert part in text
    with pytest.raises(StoreFormatError, match="reads formats 1:"):
        check_known(FormatState(2), "file:///d", "0.3.0", frozenset({1}))


def test_format_hash_replies() -> None:
    assert parse_format([None, None, None, None]) == FormatState(LEGACY, marked=False)
    assert parse_format([b"2", b"0.3.0", b"n1", b"2026-12-07T00:00:00Z"]) == FormatState(
        2, True, "0.3.0", "n1", "2026-12-07T00:00:00Z"
    )
    for bad in (b"two", b"-1", b"0", b"9999999999"):
        with pytest.raises(StoreFormatError, match="not a format number"):
            parse_format([bad, None, None, None])
    assert active_layout(None, "r", "v") == 1 and active_layout(b"2", "r", "v") == 2
    with pytest.raises(StoreFormatError, match="format 7"):
        active_layout(b"7", "r", "v")


def test_node_info_round_trips_and_refuses_what_it_does_not_write() -> None:
    info = NodeInfo("0.3.0", (1, 2), 1, "3.0.11")
    assert NodeInfo.from_json(info.to_json()) == info
    assert '"renew_pace"' not in info.to_json()  # a node that does not renew says nothing
    renewing = NodeInfo("0.3.0", (1, 2), 2, "3.0.11", renew_pace=0.75)
    assert NodeInfo.from_json(renewing.to_json()) == renewing
    for bad in (
        '{"version": "1", "reads": [1], "renew_pace": -1}',
        '{"version": "1", "reads": [1], "renew_pace": "1"}',
        '{"version": "1", "reads": [1], "renew_pace": true}',
        '{"version": "1", "reads": [1], "renew_pace": NaN}',
        "[]",
        "{}",
        '{"version": "", "reads": [1]}',
        '{"version": "1", "reads": "12"}',
        '{"version": "1", "reads": [0]}',
        '{"version": "1", "reads": [1.5]}',
        '{"version": "1", "reads": [1], "writes": "2"}',
        '{"version": "' + "v" * 65 + '", "reads": [1]}',
        "not json",
    ):
        with pytest.raises(ValueError):
            NodeInfo.from_json(bad)


def _board(*entries: tuple[str, str]) -> list[bytes]:
    return [x.encode() for pair in entries for x in pair]


def test_the_board_lists_versioned_nodes_and_data_key_holders_without_a_version() -> None:
    info = NodeInfo("0.3.0", (1, 2), 1).to_json()
    board = _board(
        ("a", f"{NOW_MS + 60_000} {NOW_MS - 1_000} {info}"),  # running
        ("b", f"{NOW_MS - 5_000} {NOW_MS - 65_000} {info}"),  # stopped, still listed
        ("c", "garbage"),  # malformed: left out
        ("d", f"{NOW_MS + 60_000} {NOW_MS} {{broken json"),
    )
    holders = _board(
        ("a", f"{NOW_MS + 60_000} k1"),  # on the board already
        ("z", f"{NOW_MS + 40_000} k1"),  # 0.2.0: data keys only, live
        ("y", f"{NOW_MS - 1} k1"),  # lapsed: gone
    )
    nodes = parse_nodes([str(NOW_MS).encode(), board, holders])
    assert [(n.node, n.live, n.info is not None) for n in nodes] == [
        ("a", True, True),
        ("b", False, True),
        ("z", True, False),
    ]
    assert nodes[2].version == "0.2.0" and not nodes[2].reads(1)
    assert parse_nodes(None) == () and parse_nodes([b"x", [], []]) == ()


def test_holding_back_names_every_node_that_may_not_read_the_target() -> None:
    new = NodeSeen("new", NodeInfo("0.3.0", (1, 2)), 0, True)
    stopped_old = NodeSeen("old", NodeInfo("0.2.9", (1,)), 0, False)
    silent = NodeSeen("silent", None, 0, True)
    assert holding_back([new, stopped_old, silent], 2) == [stopped_old, silent]
    assert holding_back([new], 2) == []


def test_format_lists_are_said_shortly() -> None:
    assert describe_formats([1, 2]) == "1-2"
    assert describe_formats([1, 2, 3]) == "1-3"
    assert describe_formats([1, 3]) == "1, 3"
    assert describe_formats([2]) == "2"
    assert describe_formats([]) == "none"
