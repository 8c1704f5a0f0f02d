"""Which ids a page of ``RedisStore.list`` holds: read from the indexes, O(page) each.

Every listing is in id order and resumes after the id a cursor names:

* no filter: ``ZRANGEBYLEX`` on the ``ids`` set from the cursor, ``count`` ids
  (O(log N + page));
* ``name``: that name's set (``SMEMBERS``), the few records one name has;
* ``expiring_before`` alone, when at most :data:`SCAN_BUDGET` records match
  (``ZCOUNT``, the usual case: the agent's hourly expiry scan, ``cert ls
  --expiring 30d``): those ids from the ``expiry`` set (``ZRANGEBYSCORE``),
  sorted, the ones after the cursor kept: O(log N + matches) a page;
* ``expiring_before`` alone when more match: ``ids`` read in id order,
  :data:`SCAN_CHUNK` at a time, each chunk's expiry scores read at once
  (``ZMSCORE``) and the expiring ids kept, until ``count`` are found or
  SCAN_BUDGET ids have been read.  A page is then O(SCAN_BUDGET) at most, in
  time and memory, however many records expire; when the budget ends a page
  early, the page is short and its cursor is the last id read (the REST API's
  ``next_cursor`` is null only at the end).  The whole listing is O(N).

Either way a page holds at most SCAN_BUDGET ids in memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio

from certagent.store.redis._layout import Keys, to_text, valid_id

SCAN_CHUNK = 1_000
SCAN_BUDGET = 20_000


@dataclass(frozen=True)
class IdPage:
    """Up to ``count`` matching ids; ``read_to``: the last id read if the budget ended it."""

    ids: list[str]
    read_to: str | None = None


async def list_ids(
    client: redis.asyncio.Redis,
    keys: Keys,
    pattern: str | None,
    before: float | None,
    after: str | None,
    count: int,
) -> IdPage:
    """Up to ``count`` ids matching the filters, after ``after``, in id order."""
    if pattern is None and before is None:
        return IdPage(await _ids_after(client, keys, after, count))
    if pattern is None:
        assert before is not None
        return await _expiring(client, keys, before, after, count)
    members = await client.smembers(keys.name(pattern))
    ids = sorted(i for i in map(to_text, members) if valid_id(i) and (after is None or i > after))
    if before is not None and ids:
        scores = await client.zmscore(keys.expiry(), ids)
        ids = [i for i, s in zip(ids, scores, strict=True) if s is not None and s < before]
    return IdPage(ids[:count])


async def _ids_after(
    client: redis.asyncio.Redis, keys: Keys, after: str | None, count: int
) -> list[str]:
    low = f"({after}" if after is not None else "-"
    by_id = await client.zrangebylex(keys.ids(), low, "+", start=0, num=count)
    return [i for i in map(to_text, by_id) if valid_id(i)]


async def _expiring(
    client: redis.asyncio.Redis, keys: Keys, before: float, after: str | None, count: int
) -> IdPage:
    below = f"({before}"
    if await client.zcount(keys.expiry(), "-inf", below) <= SCAN_BUDGET:
        matching = await client.zrangebyscore(keys.expiry(), "-inf", below, 0, SCAN_BUDGET + 1)
        if len(matching) <= SCAN_BUDGET:  # else more expire since the count: scan instead
            ids = sorted(
                i for i in map(to_text, matching) if valid_id(i) and (after is None or i > after)
            )
            return IdPage(ids[:count])
    found: list[str] = []
    read = 0
    while read < SCAN_BUDGET:
        low = f"({after}" if after is not None else "-"
        raw = [to_text(i) for i in await client.zrangebylex(keys.ids(), low, "+", 0, SCAN_CHUNK)]
        chunk = [i for i in raw if valid_id(i)]
        read += len(raw)
        scores = await client.zmscore(keys.expiry(), chunk) if chunk else []
        for cert_id, score in zip(chunk, scores, strict=True):
            if score is not None and score < before:
                found.append(cert_id)
                if len(found) == count:
                    return IdPage(found)
        if len(raw) < SCAN_CHUNK:
            return IdPage(found)
        after = raw[-1]
    return IdPage(found, read_to=after)


async def every_id(
    client: redis.asyncio.Redis, keys: Keys, batch: int
) -> AsyncIterator[list[str]]:
    """Every stored id, in id order, ``batch`` at a time (invalid ones left out): the walk of
    the store's whole-store jobs (``keys rotate``, ``fleet finalize``'s migration).  O(N)
    ids in O(N / batch) round trips, O(batch) in memory."""
    low = "-"
    while True:
        raw = await client.zrangebylex(keys.ids(), low, "+", start=0, num=batch)
        if not raw:
            return
        ids = [to_text(i) for i in raw]
        low = f"({ids[-1]}"
        yield [i for i in ids if valid_id(i)]
