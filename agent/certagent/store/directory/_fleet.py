"""The directory store's format (:mod:`certagent.store.formats`): one format, no board.

A directory holds PEM files in the layout every release has read (format 1 of its
kind).  ``<root>/.certagent/format``, if present, names the format a later release
moved the directory to: a release that does not know it refuses the directory rather
than misread it.  A directory is one node's store, so its board lists nobody and a
beat writes nothing; there is nothing to finalize.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from certagent.errors import StoreError
from certagent.store.directory._files import read_regular
from certagent.store.directory._state import STATE_DIR
from certagent.store.formats import FormatState, Migration, NodeInfo, NodeSeen, StoreFormatError

__all__ = ["FORMAT_FILE", "READS", "DirectoryFleet", "read_format"]

#: The formats of a directory store this release reads: the one there is.
READS = frozenset({1})
FORMAT_FILE = "format"


def read_format(root: Path) -> FormatState:
    """The directory's format: ``.certagent/format`` if present, else 1 (unmarked).

    Blocking (one small file).  StoreFormatError if the file does not hold a number.
    """
    path = root / STATE_DIR / FORMAT_FILE
    try:
        data, _ = read_regular(path, str(path), 64)
    except (FileNotFoundError, NotADirectoryError):
        return FormatState(1, marked=False, note="the one format of a directory store")
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the store's format: {exc}") from exc
    raw = data.decode("ascii", "replace").split()
    if not raw or not raw[0].isdigit():
        raise StoreFormatError(f"{path} does not hold a format number")
    return FormatState(int(raw[0]), True, raw[1] if len(raw) > 1 else "")


class DirectoryFleet:
    """:class:`~certagent.store.base.FleetBoard` of a directory (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        shown: str,
        run: Callable[[str, Callable[[], FormatState]], Awaitable[FormatState]],
    ) -> None:
        self._root = root
        self._uri = shown
        self._run = run

    def describe(self) -> str:
        return self._uri

    @property
    def newest(self) -> int:
        return max(READS)

    async def state(self, *, node: str = "") -> FormatState:
        return await self._run("read the store's format", lambda: read_format(self._root))

    async def beat(self, node: str, info: NodeInfo, ttl: float) -> FormatState:
        """Nothing to tell the fleet: a directory is one node's store."""
        return await self.state()

    async def leave(self, node: str, info: NodeInfo) -> None:
        return None

    async def nodes(self) -> tuple[NodeSeen, ...]:
        return ()

    async def finalize(self, target: int, node: str) -> FormatState:
        state = await self.state()
        if target > self.newest:
            raise StoreError(
                f"{self._uri}: a directory store has one format ({self.newest}); nothing to"
                f" move to format {target}"
            )
        return state

    async def migrate(self, progress: Callable[[Migration], None] | None = None) -> Migration:
        return Migration()
