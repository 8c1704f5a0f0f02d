"""This node among the fleet's: its release on the board, the store's format, finalize.

:mod:`certagent.store.formats` has the rules.  Here:

* :func:`check_store_format`, at start: an agent refuses a store at a format it does not
  know (exits non-zero naming the format and who set it) before it writes anything;
* :class:`Presence`: while it runs, the agent beats on the fleet's board every
  :data:`BEAT` seconds (its release, the formats it reads, the one it writes) and stops
  itself if the store moves to a format it does not know (only ``fleet finalize
  --force`` can do that under a running node);
* :func:`finalize`: ``certagent fleet finalize``: the newest format every node listed
  reads, refused while a node holds it back (named), then the migration.

A beat is one round trip of O(nodes), every 20 s per node: nothing grows with K or N.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from certagent import __version__
from certagent.errors import AgentError
from certagent.store.base import FleetBoard, Store
from certagent.store.formats import (
    READS,
    FormatState,
    Migration,
    NodeInfo,
    NodeSeen,
    StoreFormatError,
    check_known,
    describe_formats,
    holding_back,
)

__all__ = [
    "BEAT",
    "TTL",
    "FinalizeRefused",
    "Finalized",
    "Presence",
    "check_store_format",
    "finalize",
    "operator_node",
]

log = logging.getLogger(__name__)

#: Seconds between two beats of an agent on the fleet's board.
BEAT = 20.0
#: Seconds a beat lasts: a stopped agent shows as stopped at once, a killed one after this.
TTL = 3 * BEAT


class FinalizeRefused(AgentError):
    """``fleet finalize``: nodes that do not read the new format are on the board."""

    def __init__(self, message: str, nodes: list[NodeSeen]) -> None:
        super().__init__(message)
        self.nodes = nodes


def operator_node() -> str:
    """Who runs a command by hand, for the store's record of it: ``cli@<host name>``."""
    return f"cli@{socket.gethostname()}"[:128]


async def check_store_format(store: Store, node: str) -> FormatState | None:
    """The store's format, which this release must know: StoreFormatError (the agent does
    not start; nothing was written) if not.  A new store is marked at the newest format.

    A store that cannot be reached now (None) is only logged, as for the data key: the
    agent starts to serve what HAProxy holds, and :class:`Presence` checks at each beat.
    """
    board = store.fleet()
    try:
        state = await board.state(node=node)
    except StoreFormatError:
        raise  # not a store that is down: this release cannot use it
    except AgentError as exc:
        log.warning("cannot read the format of %s yet: %s", store.describe(), exc)
        return None
    check_known(state, board.describe(), __version__, _reads(board))
    log.info("store %s is at %s", board.describe(), state.describe())
    return state


def _reads(board: FleetBoard) -> frozenset[int]:
    """The formats this release reads of the board's kind of store."""
    return frozenset(n for n in READS if n <= board.newest)


class Presence:
    """This agent on the fleet's board (see the module docstring)."""

    def __init__(
        self,
        board: FleetBoard,
        node: str,
        haproxy: Callable[[], str] = lambda: "",
        renew_pace: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.board = board
        self.node = node
        self._haproxy = haproxy
        self._renew_pace = renew_pace
        self.state: FormatState | None = None

    def info(self) -> NodeInfo:
        writes = self.state.number if self.state is not None else 0
        reads = tuple(sorted(_reads(self.board)))
        return NodeInfo(__version__, reads, writes, self._haproxy(), self._renew_pace())

    async def fleet_pace(self) -> tuple[float, int]:
        """The renewals a second of every running node that renews, as they last beat
        (20 s ago at most), and how many such nodes.  One O(nodes) read."""
        pace, renewing = 0.0, 0
        for seen in await self.board.nodes():
            if seen.live and seen.info is not None and seen.info.renew_pace is not None:
                pace += seen.info.renew_pace
                renewing += 1
        return pace, renewing

    async def beat(self) -> bool:
        """One beat; False (and a warning) if the store did not take it.

        StoreFormatError if the store is now at a format this release does not know.
        """
        try:
            state = await self.board.beat(self.node, self.info(), TTL)
        except StoreFormatError:
            raise
        except (AgentError, ValueError) as exc:
            log.warning("cannot beat on the fleet's board of %s: %s", self.board.describe(), exc)
            return False
        check_known(state, self.board.describe(), __version__, _reads(self.board))
        if self.state is not None and state.number != self.state.number:
            log.info("store %s moved to %s", self.board.describe(), state.describe())
        self.state = state
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Beat until ``stop``; a store at a format this release does not know sets ``stop``."""
        while not stop.is_set():
            try:
                await self.beat()
            except StoreFormatError as exc:
                log.critical("%s; stopping the agent", exc)
                stop.set()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), BEAT)

    async def leave(self) -> None:
        """This agent stops: the board shows it stopped (a killed one's lapses in :data:`TTL`)."""
        try:
            await self.board.leave(self.node, self.info())
        except (AgentError, ValueError) as exc:
            log.warning("cannot leave the fleet's board (it lapses within %.0f s): %s", TTL, exc)

    def status(self) -> dict[str, Any]:
        """``certagent status``: this node, its release, and the store's format as last seen."""
        info = self.info()
        return {
            "node": self.node,
            "version": info.version,
            "reads": list(info.reads),
            "store_format": None if self.state is None else self.state.number,
        }


@dataclass(frozen=True)
class Finalized:
    """What ``fleet finalize`` did: the format before and after, and the migration."""

    before: FormatState
    after: FormatState
    migration: Migration


async def finalize(
    board: FleetBoard,
    *,
    node: str,
    force: bool = False,
    progress: Callable[[Migration], None] | None = None,
) -> Finalized:
    """Move the store to the newest format every node on the board reads, then migrate.

    FinalizeRefused naming the nodes that hold it back (each node listed, running or
    stopped for less than ten minutes, that does not say it reads the target); ``force``
    goes on regardless (for nodes known to be gone).  On a store already at the target,
    the migration runs again (records a racing writer left behind).
    """
    before = await board.state(node=node)
    check_known(before, board.describe(), __version__, _reads(board))
    target = board.newest
    blockers = holding_back(await board.nodes(), target)
    if blockers and not force and before.number < target:
        named = "; ".join(_blocker(n) for n in blockers)
        raise FinalizeRefused(
            f"not finalizing {board.describe()} to format {target}: {len(blockers)} node(s)"
            f" on the fleet's board may not read it: {named}. Upgrade them to certagent"
            f" {__version__} or later (`certagent fleet status` shows each node's version),"
            " or, for nodes known to be gone for good, run again with --force.",
            blockers,
        )
    if blockers and force:
        names = ", ".join(n.node for n in blockers)
        log.warning("finalizing %s with --force despite %s", board.describe(), names)
    after = await board.finalize(target, node)
    migration = await board.migrate(progress)
    return Finalized(before, after, migration)


def _blocker(node: NodeSeen) -> str:
    state = "running" if node.live else "stopped recently"
    if node.info is None:
        return f"{node.node} ({state}, announces no version: 0.2.0)"
    return (
        f"{node.node} ({state}, certagent {node.info.version}, reads formats"
        f" {describe_formats(node.info.reads)})"
    )
