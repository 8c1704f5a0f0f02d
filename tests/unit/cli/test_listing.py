"""``cert ls``'s paging and printing (cli/listing.py) against a stand-in backend."""

from __future__ import annotations

import io
import json
from datetime import datetime
from typing import Any

import pytest

from certagent.cli.backends import Record
from certagent.cli.commands import _parser
from certagent.cli.listing import Listing, pages, print_listing
from certagent.errors import InvalidCursor


def _record(i: int) -> Record:
    return {
        "id": f"id{i:05d}",
        "names": [f"h{i}.example.test"],
        "not_after": "2030-01-01T00:00:00Z",
        "version": 1,
        "key_type": "ECDSA-P256",
        "managed": None,
    }


class Paged:
    """The store's paging contract: id order, cursor = the last id of a full page."""

    def __init__(self, count: int, out: io.StringIO | None = None) -> None:
        self.records = [_record(i) for i in range(count)]
        self.asked: list[tuple[str | None, int]] = []
        self.printed_when_asked: list[str] = []
        self.out = out

    async def page(
        self,
        name: str | None,
        expiring_before: datetime | None,
        cursor: str | None,
        limit: int = 500,
    ) -> tuple[list[Record], str | None]:
        if cursor is not None and not cursor.startswith("after:"):
            raise InvalidCursor("the cursor is not one this store handed out; list from the start")
        self.asked.append((cursor, limit))
        if self.out is not None:
            self.printed_when_asked.append(self.out.getvalue())
        start = 0 if cursor is None else int(cursor.removeprefix("after:id")) + 1
        found = self.records[start : start + limit]
        more = start + limit < len(self.records)
        return found, f"after:{found[-1]['id']}" if more else None

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"listing used {name}")


async def _all(backend: Paged, listing: Listing) -> list[tuple[list[Record], str | None]]:
    return [p async for p in pages(backend, listing)]  # type: ignore[arg-type]


async def test_a_limit_within_a_page_is_one_read_and_its_cursor() -> None:
    backend = Paged(1_200)
    got = await _all(backend, Listing(limit=7))
    assert backend.asked == [(None, 7)]
    assert [len(p) for p, _ in got] == [7] and got[-1][1] == "after:id00006"


async def test_a_limit_over_a_page_reads_pages_of_500_then_the_rest() -> None:
    backend = Paged(1_200)
    got = await _all(backend, Listing(after="after:id00006", limit=700))
    assert backend.asked == [("after:id00006", 500), ("after:id00506", 200)]
    assert [r["id"] for p, _ in got for r in p][:1] == ["id00007"]
    assert got[-1][1] == "after:id00706"


async def test_no_limit_reads_to_the_end_and_no_cursor_is_left() -> None:
    backend = Paged(1_200)
    got = await _all(backend, Listing())
    assert [c for c, _ in backend.asked] == [None, "after:id00499", "after:id00999"]
    assert sum(len(p) for p, _ in got) == 1_200 and got[-1][1] is None


@pytest.mark.parametrize("count", [0, 1, 3, 1_001])
async def test_the_json_stream_is_the_bytes_of_the_whole_list(
    count: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    await print_listing(Paged(count), Listing(), as_json=True, out=out)  # type: ignore[arg-type]
    expected = [_record(i) for i in range(count)]
    assert out.getvalue() == json.dumps(expected, indent=2) + "\n"
    assert capsys.readouterr().err == ""


async def test_each_page_is_printed_before_the_next_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    backend = Paged(1_200, out)
    await print_listing(backend, Listing(), as_json=False, out=out)  # type: ignore[arg-type]
    before_second, before_third = backend.printed_when_asked[1:]
    assert before_second.count("\n") == 1 + 500 and "id00499" in before_second
    assert before_third.count("\n") == 1 + 1_000 and "id00500" not in before_second
    assert out.getvalue().count("\n") == 1 + 1_200
    assert capsys.readouterr().err == "1200 certificates\n"


async def test_a_stop_before_the_end_names_the_cursor_to_go_on_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    await print_listing(Paged(50), Listing(limit=10), as_json=False, out=out)  # type: ignore[arg-type]
    assert capsys.readouterr().err == "10 certificates\nmore: --after after:id00009\n"


async def test_a_refused_cursor_prints_nothing() -> None:
    out = io.StringIO()
    with pytest.raises(InvalidCursor, match="list from the start"):
        await print_listing(Paged(5), Listing(after="bogus"), as_json=True, out=out)  # type: ignore[arg-type]
    assert out.getvalue() == ""


@pytest.mark.parametrize("value", ["0", "-3", "x", "1.5"])
def test_limit_must_be_a_whole_number_of_at_least_one(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["cert", "ls", "--config", "c.toml", "--limit", value])
    assert exited.value.code == 2
    assert "at least 1" in capsys.readouterr().err
