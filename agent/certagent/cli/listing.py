"""``certagent cert ls``: page through the store and print each page as it comes.

Memory is one page (:data:`PAGE` records), whatever the store's size: nothing
is held once printed, and the first rows appear after the first page's read.
``--limit N`` stops after N records and ``--after CURSOR`` starts after a
cursor: the REST API's ``limit`` and ``cursor`` (``GET /v1/certificates``),
with the same cursors, so ``cert ls --limit 100`` prints what one
``?limit=100`` page holds and the cursor it prints is that page's
``next_cursor``.  The cursor to go on with goes to stderr (``more: --after
CURSOR``), beside the count.

``--json`` prints one JSON array, written as it goes: ``[``, each record (the
REST API's record, ``indent=2``) as it is read, ``]``: the same bytes as the
whole list printed at once, so ``json.load`` and ``jq`` read it as before.
Cost: O(records printed) time, O(PAGE) memory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

from certagent.cli.backends import Backend, Record

__all__ = ["PAGE", "JsonArrayPrinter", "Listing", "TablePrinter", "pages", "print_listing"]

PAGE = 500  # records per read: the REST API's largest limit


@dataclass(frozen=True)
class Listing:
    """What to list: the REST API's query, ``limit`` counting every page (None: all)."""

    name: str | None = None
    expiring_before: datetime | None = None
    after: str | None = None
    limit: int | None = None


async def pages(
    backend: Backend, listing: Listing, page: int = PAGE
) -> AsyncIterator[tuple[list[Record], str | None]]:
    """Each page of records and the cursor after it (None after the last record).

    Each read asks for at most ``page`` records, and no more than ``listing.limit``
    still allows; once the limit is reached, the cursor of the last read is the
    one to go on from.
    """
    cursor = listing.after
    left = listing.limit
    while left is None or left > 0:
        want = page if left is None else min(page, left)
        records, cursor = await backend.page(
            listing.name, listing.expiring_before, cursor, limit=want
        )
        if left is not None:
            left -= len(records)
        yield records, cursor
        if cursor is None:
            return


class TablePrinter:
    """One row per record under a header; columns of fixed width, so rows print at once."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def start(self) -> None:
        print(
            f"{'ID':<32}  {'NOT AFTER':<20}  {'VER':>3}  {'KEY':<10}  {'MANAGED':<7}  NAMES",
            file=self.out,
        )

    def records(self, records: list[Record]) -> None:
        for r in records:
            print(
                f"{r['id']:<32}  {r['not_after']:<20}  {r['version']:>3}  {r['key_type']:<10}"
                f"  {r.get('managed') or '-':<7}  {' '.join(r['names'])}",
                file=self.out,
            )

    def end(self) -> None:
        pass


class JsonArrayPrinter:
    """A JSON array written element by element: the bytes of ``json.dumps(list, indent=2)``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.count = 0

    def start(self) -> None:
        self.out.write("[")

    def records(self, records: list[Record]) -> None:
        for r in records:
            element = json.dumps(r, indent=2).replace("\n", "\n  ")
            self.out.write(("," if self.count else "") + "\n  " + element)
            self.count += 1

    def end(self) -> None:
        self.out.write("\n]\n" if self.count else "]\n")


async def print_listing(
    backend: Backend, listing: Listing, as_json: bool, out: TextIO | None = None
) -> None:
    """Print every record ``listing`` selects, a page at a time; count and cursor on stderr."""
    out = sys.stdout if out is None else out
    printer: TablePrinter | JsonArrayPrinter = (
        JsonArrayPrinter(out) if as_json else TablePrinter(out)
    )
    count, started = 0, False
    more: str | None = None
    async for records, cursor in pages(backend, listing):
        if not started:
            printer.start()  # after the first read: a refused cursor prints nothing
            started = True
        printer.records(records)
        out.flush()
        count += len(records)
        more = cursor
    printer.end()
    out.flush()
    if not as_json:
        print(f"{count} certificate{'s' if count != 1 else ''}", file=sys.stderr)
    if more is not None:
        print(f"more: --after {more}", file=sys.stderr)
