"""The Redis store's change feed: the ``events`` stream, read with a loss check.

:meth:`StreamFeed.changes` reads the stream and XINFO STREAM in one MULTI/EXEC
(on a cluster: XREAD, then XINFO STREAM, which errs on the side of a resync)
and raises ChangesLost if events after the caller's position may have been
trimmed (see :func:`entries_lost`).  When there is
nothing to read it waits in ``XREAD BLOCK`` on a client of its own, whose
socket timeout exceeds the longest block (:data:`MAX_BLOCK`), then reads again.
Each call costs O(events read), whatever the number of records.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio
import redis.exceptions

from certagent.errors import ChangesLost, StoreError
from certagent.store.base import Change
from certagent.store.redis._connection import close_client
from certagent.store.redis._layout import ZERO, Keys, to_text
from certagent.store.redis._records import decode_change

__all__ = ["MAX_BLOCK", "StreamFeed", "StreamId", "StreamInfo", "entries_lost", "parse_stream_id"]

log = logging.getLogger(__name__)

#: The longest one :meth:`StreamFeed.changes` call blocks in Redis, in seconds.
MAX_BLOCK = 30.0
_CHANGES_BATCH = 1000
_CLOSE_WAIT_S = 1.0  # how long close() waits for abandoned blocking reads
_STREAM_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})\Z")

StreamId = tuple[int, int]


class StreamFeed:
    """Reads the events stream; redis-py errors escape (the store translates them)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        blocking: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        *,
        cluster: bool = False,
    ) -> None:
        self._cluster = cluster
        self._client = client
        self._blocking = blocking
        self._keys = keys
        self._url = shown
        self._reads: set[asyncio.Future[Any]] = set()

    async def close(self) -> None:
        for read in self._reads:
            read.cancel()
        if self._reads:
            await asyncio.wait(self._reads, timeout=_CLOSE_WAIT_S)
        await close_client(self._blocking)

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        stream = self._keys.events()
        if after is None:
            try:
                info = await self._client.xinfo_stream(stream)
            except redis.exceptions.ResponseError as exc:
                if "no such key" not in str(exc).lower():
                    raise
                return (), ZERO
            return (), to_text(info["last-generated-id"])
        position = parse_stream_id(after)
        if position is None:
            raise ChangesLost(f"{self._url}: {after[:40]!r} is not a change-feed position")
        found = await self._read_after(after, position)
        block = min(timeout, MAX_BLOCK)
        if found[0] or block <= 0:
            return found
        woken = await self._wait(stream, after, block)
        if not woken:
            return (), after
        # The blocking read only wakes us: read again with the loss check, atomically.
        return await self._read_after(after, position)

    async def _wait(self, stream: str, after: str, block: float) -> Any:
        """XREAD BLOCK in a task of its own, so that the caller's cancel ends the wait at once.

        redis-py's Cluster client has let a cancel pass (twice in many CI runs) and gone on
        blocking for the rest of the block; such an abandoned read ends by itself within
        ``block`` on its own connection, and :meth:`close` collects it.
        """
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError  # asked for during the read before and let pass there
        read = asyncio.ensure_future(
            self._blocking.xread({stream: after}, count=1, block=max(1, int(block * 1000)))
        )
        self._reads.add(read)
        read.add_done_callback(self._read_done)
        try:
            return await asyncio.shield(read)
        except asyncio.CancelledError:
            read.cancel()
            raise

    def _read_done(self, read: asyncio.Future[Any]) -> None:
        self._reads.discard(read)
        if not read.cancelled() and (error := read.exception()) is not None:
            log.debug("%s: a change-feed wait ended with %r", self._url, error)

    async def _read_after(self, after: str, position: StreamId) -> tuple[tuple[Change, ...], str]:
        """The events after ``after`` (one batch) and the stream's state, in one MULTI/EXEC."""
        stream = self._keys.events()
        if self._cluster:
            # redis-py cannot pipeline XREAD in a cluster transaction: read, then ask
            # for the stream's state; trimmed in between only makes the check stricter
            raw_entries: Any = await self._client.xread({stream: after}, count=_CHANGES_BATCH)
            try:
                raw_info: object = await self._client.xinfo_stream(stream)
            except redis.exceptions.ResponseError as exc:
                raw_info = exc
        else:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xinfo_stream(stream)
                pipe.xread({stream: after}, count=_CHANGES_BATCH)
                raw_info, raw_entries = await pipe.execute(raise_on_error=False)
        if isinstance(raw_entries, Exception):
            raise raw_entries
        info = self._stream_info(raw_info)
        if entries_lost(position, info):
            raise ChangesLost(
                f"{self._url}: the change feed no longer holds the events after {after}"
            )
        entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]] = (
            raw_entries[0][1] if raw_entries else ()
        )
        if not entries:
            return (), after
        changes = [c for c in (self._change(i, f) for i, f in entries) if c is not None]
        return tuple(changes), to_text(entries[-1][0])

    def _change(self, entry_id: bytes, fields: Mapping[bytes, bytes]) -> Change | None:
        change = decode_change(fields)
        if change is None:
            log.warning("ignoring event %s in %s: not a change", to_text(entry_id), self._url)
        return change

    def _stream_info(self, raw: object) -> StreamInfo | None:
        """A pipelined XINFO STREAM reply; None if the stream does not exist."""
        if isinstance(raw, redis.exceptions.ResponseError):
            if "no such key" in str(raw).lower():
                return None
            raise raw
        if not isinstance(raw, dict):
            raise StoreError(f"{self._url}: unexpected XINFO STREAM reply {type(raw).__name__}")
        return StreamInfo.from_reply(raw)


@dataclass(frozen=True)
class StreamInfo:
    """What XINFO STREAM says about the events stream."""

    first: StreamId | None
    last: StreamId
    max_deleted: StreamId
    #: Entries trimmed or deleted since the stream was created; None before Redis 7.
    removed: int | None

    @classmethod
    def from_reply(cls, raw: Mapping[str, object]) -> StreamInfo:
        """From redis-py's parsed XINFO STREAM (keys decoded, values bytes)."""
        last = parse_stream_id(to_text(raw.get("last-generated-id"))) or (0, 0)
        first_entry = raw.get("first-entry")
        first = (
            parse_stream_id(to_text(first_entry[0]))
            if isinstance(first_entry, (tuple, list)) and first_entry
            else None
        )
        max_deleted = parse_stream_id(to_text(raw.get("max-deleted-entry-id"))) or (0, 0)
        added, length = raw.get("entries-added"), raw.get("length")
        removed = added - length if isinstance(added, int) and isinstance(length, int) else None
        return cls(first=first, last=last, max_deleted=max_deleted, removed=removed)


def parse_stream_id(raw: str) -> StreamId | None:
    match = _STREAM_ID.match(raw)
    return (int(match.group(1)), int(match.group(2))) if match else None


def entries_lost(after: StreamId, info: StreamInfo | None) -> bool:
    """Whether the stream may have dropped an event newer than position ``after``.

    Trimming removes the oldest entries, so if ``after`` is older than the first
    entry left, the events between them may be gone.  That errs on the safe
    side by one entry: when ``after`` was the very last entry trimmed, nothing
    newer was lost, but that cannot be told apart.  ``removed == 0`` (Redis 7)
    proves nothing was ever trimmed, which keeps ``0-0`` usable.  ``info`` is
    None when the stream does not exist.
    """
    if info is None:
        return after != (0, 0)  # the stream was deleted: whatever it held is gone
    if after > info.last or info.max_deleted > after:
        return True  # not a position in this stream, or an XDEL after it
    if info.removed == 0:
        return False
    if info.first is None:
        return after < info.last
    return after < info.first
