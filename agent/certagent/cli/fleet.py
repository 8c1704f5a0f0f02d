"""``certagent fleet status|finalize``: the nodes sharing a store, and its format.

Reads (and for ``finalize`` writes) the store of ``--config`` directly, like ``cert``
and ``domain``: the fleet's board is in the store, so any machine with the fleet's
configuration and key file can ask.  docs/operations.md, "Upgrading a fleet".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from certagent import __version__, config
from certagent.errors import AgentError
from certagent.service.fleet import FinalizeRefused, finalize, operator_node
from certagent.store import open_configured
from certagent.store.base import FleetBoard
from certagent.store.formats import (
    READS,
    FormatState,
    Migration,
    NodeSeen,
    check_known,
    describe_formats,
    holding_back,
)

__all__ = ["FLEET_COMMAND", "add_fleet_commands", "run_fleet_command"]

FLEET_COMMAND = "fleet"


def add_fleet_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fleet`` (status, finalize) to ``certagent``'s parser."""
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="certagent.toml: its store"
    )
    where.add_argument("--json", action="store_true", help="one JSON object")
    pf = subparsers.add_parser(
        FLEET_COMMAND,
        help="the nodes sharing the store and its format: status, finalize",
        description="Every node beats its certagent version and the store formats it reads"
        " on the fleet's board, in the store. During a rolling upgrade the store keeps the"
        " format every node reads; `fleet finalize` moves it to the newest once all nodes"
        " run a release that reads it. docs/operations.md, Upgrading a fleet.",
    )
    fleet = pf.add_subparsers(dest="fleet_command", required=True, metavar="SUBCOMMAND")
    fleet.add_parser(
        "status",
        parents=[where],
        help="each node seen in the last 10 minutes: version, formats, last seen",
    )
    p = fleet.add_parser(
        "finalize",
        parents=[where],
        help="move the store to the newest format every node reads, and rewrite its records",
        description="Refused, naming them, while nodes that may not read the newest format"
        " are on the board (running, or stopped less than 10 minutes ago). The records"
        " are rewritten online, in batches, while the fleet serves. Running it again"
        " rewrites what a racing writer left in the older format.",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="finalize even with such nodes on the board (nodes known to be gone for good)",
    )


def run_fleet_command(args: argparse.Namespace) -> int:
    """Run a ``fleet`` command; its exit status (errors go to stderr)."""
    try:
        return asyncio.run(_run(args))
    except FinalizeRefused as exc:
        if args.json:
            print(json.dumps({"finalized": False, "error": str(exc),
                              "holding_back": [_node(n) for n in exc.nodes]}))  # fmt: skip
        print(f"certagent: {exc}", file=sys.stderr)
        return 1
    except AgentError as exc:
        print(f"certagent: error: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace) -> int:
    store = open_configured(config.load(args.config))
    try:
        board = store.fleet()
        if args.fleet_command == "status":
            return await _status(board, args.json)
        return await _finalize(board, args.force, args.json)
    finally:
        await store.close()


async def _status(board: FleetBoard, as_json: bool) -> int:
    state = await board.state(node=operator_node())
    nodes = await board.nodes()
    blockers = [n.node for n in holding_back(nodes, board.newest)]
    held_back = blockers if state.number < board.newest else []
    report = {
        "store": board.describe(),
        "format": _format(state),
        "newest": board.newest,
        "finalized": state.number >= board.newest,
        "holding_back": held_back,
        "nodes": [_node(n) for n in nodes],
        "this_cli": {"version": __version__, "reads": sorted(READS)},
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"store   {board.describe()}")
    print(f"format  {state.describe()}")
    if report["finalized"]:
        print(f"        finalized: every writer writes format {state.number}, the newest")
    else:
        held = ", ".join(held_back) or "nothing: `certagent fleet finalize` may run"
        print(f"        writers write format {state.number}; format {board.newest} is held back by"
              f" {held}")  # fmt: skip
    print()
    if not nodes:
        print("no node on the fleet's board (none has run in the last 10 minutes)")
        return 0
    rows = [("NODE", "VERSION", "READS", "WRITES", "STATE", "RENEWALS/MIN", "LAST SEEN")]
    for n in nodes:
        info = n.info
        rows.append(
            (
                n.node,
                n.version if info else f"{n.version}?",
                describe_formats(info.reads) if info else "1-2",
                str(info.writes or "-") if info else "2",
                "running" if n.live else "stopped",
                _per_minute(info.renew_pace if info else None),
                _ago(n.seen),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if any(n.info is None for n in nodes):
        print("\n0.2.0?: announces its data key but no version: certagent 0.2.0, which reads")
        print("formats 1 and 2 and writes 2. Releases before 0.2.0 do not announce themselves")
        print("at all and are not listed: docs/operations.md, Upgrading a fleet.")
    return 0


async def _finalize(board: FleetBoard, force: bool, as_json: bool) -> int:
    def progress(report: Migration) -> None:
        if not as_json:
            print(f"  migrating: {report.scanned} records read, {report.rewritten} rewritten",
                  file=sys.stderr)  # fmt: skip

    state = await board.state(node=operator_node())
    check_known(state, board.describe(), __version__)
    done = await finalize(board, node=operator_node(), force=force, progress=progress)
    migration = done.migration
    if as_json:
        print(
            json.dumps(
                {
                    "finalized": True,
                    "before": _format(done.before),
                    "after": _format(done.after),
                    "migration": {
                        "scanned": migration.scanned,
                        "rewritten": migration.rewritten,
                        "left": migration.left,
                        "problems": migration.problems,
                    },
                }
            )
        )
    else:
        moved = done.before.number != done.after.number
        print(
            f"{board.describe()}: {'moved to' if moved else 'already at'} format"
            f" {done.after.number}; {migration.scanned} records read, {migration.rewritten}"
            f" rewritten, {migration.left} left in an older format"
        )
        for problem in migration.problems:
            print(f"  left: {problem}")
    return 0 if migration.left == 0 else 1


def _format(state: FormatState) -> dict[str, Any]:
    return {
        "number": state.number,
        "marked": state.marked,
        "version": state.version,
        "node": state.node,
        "at": state.at,
    }


def _node(n: NodeSeen) -> dict[str, Any]:
    return {
        "node": n.node,
        "version": n.version,
        # False: a 0.2.0 node, which announces its data key but no version (0.2.0 is inferred)
        "version_announced": n.info is not None,
        "reads": list(n.info.reads) if n.info else None,
        "writes": n.info.writes if n.info else None,
        "haproxy": n.info.haproxy if n.info else None,
        # renewals a second over its last five minutes; None: it does not renew (or say)
        "renew_pace": n.info.renew_pace if n.info else None,
        "running": n.live,
        "last_seen": datetime.fromtimestamp(n.seen, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _per_minute(pace: float | None) -> str:
    return "-" if pace is None else f"{pace * 60:.1f}"


def _ago(seen: float) -> str:
    seconds = max(0, int(time.time() - seen))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"
