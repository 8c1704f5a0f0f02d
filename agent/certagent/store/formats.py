"""The store's formats, in order, and what a fleet of mixed versions may write: pure, no I/O.

A fleet is upgraded one node at a time, so for minutes or days nodes of two versions
share one store.  Every format the store has had is listed here once, with what it
gates; code asks :func:`writes` which format to write now, never compares versions.
The rules (as CockroachDB's cluster version and Kubernetes' storage versions):

* the store keeps its **active format** (``{prefix}format`` on Redis); a store
  without one was written by a release that did not keep it: format 1 (:data:`LEGACY`);
* every writer writes the active format, and every reader reads every format it knows
  (:data:`READS`), so a node that has not been upgraded yet reads what the upgraded ones
  write;
* the active format moves up only by ``certagent fleet finalize``, once every node on the
  fleet's board reads the new one (:func:`holding_back`); it never moves down;
* a node that meets a store at a format it does not know refuses to use it
  (:func:`check_known`) instead of reading its records as "no certificate";
* a new, empty store starts at :data:`NEWEST`.

A format here is about what a *reader* must understand.  Adding one: append it to
:data:`FORMATS` with what it gates, teach every writer to write it when active, keep
reading the older ones, and give it its release's minor number at least (never a patch).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from certagent.errors import StoreError

__all__ = [
    "FORMATS",
    "LEGACY",
    "NEWEST",
    "READS",
    "Format",
    "FormatState",
    "Migration",
    "NodeInfo",
    "NodeSeen",
    "StoreFormatError",
    "check_known",
    "describe_formats",
    "holding_back",
]


@dataclass(frozen=True)
class Format:
    """One store format: its number, the first release that wrote it, what it gates."""

    number: int
    since: str
    gates: str


#: Every format, oldest first.  A release reads all of these and writes any of them.
FORMATS: tuple[Format, ...] = (
    Format(
        1,
        "0.1.0 (003bece)",
        "a record is a Redis hash: the PEM chain, its key as a base64 token (cak1), ISO dates;"
        " what every release reads",
    ),
    Format(
        2,
        "0.2.0",
        "a record is one packed string (leaf DER, binary key token, dates as integers) and"
        " its issuers' chain is a string shared by every record with that chain"
        " (``chain:{sha256}``): about 750 bytes a record instead of 2,600",
    ),
)
#: The formats this release reads (and can write).
READS: frozenset[int] = frozenset(f.number for f in FORMATS)
#: What a store that records no format holds (written by releases before the number).
LEGACY = 1
#: What a new store starts at, and what ``fleet finalize`` moves a store to.
NEWEST = max(READS)


class StoreFormatError(StoreError):
    """The store is at a format this release does not know: upgrade this node first."""


@dataclass(frozen=True)
class FormatState:
    """The store's active format, and who moved it there (empty for an unmarked store)."""

    number: int
    marked: bool = True
    version: str = ""
    node: str = ""
    at: str = ""
    note: str = ""  # what to say of it instead (a store kind with one format)

    def describe(self) -> str:
        if self.note:
            return f"format {self.number} ({self.note})"
        if not self.marked:
            return (
                f"format {self.number} (the store keeps no format number: written by a release"
                " before 0.3.0)"
            )
        who = f" by certagent {self.version}" if self.version else ""
        where = f" on node {self.node}" if self.node else ""
        when = f" at {self.at}" if self.at else ""
        return f"format {self.number} (set{who}{where}{when})"


def check_known(
    state: FormatState, where: str, version: str, reads: frozenset[int] = READS
) -> None:
    """StoreFormatError naming the format and its writer if this release cannot read it
    (``reads``: the formats it reads of this kind of store)."""
    if state.number in reads:
        return
    who = f"certagent {state.version}" if state.version else "a newer certagent"
    raise StoreFormatError(
        f"the store {where} is at format {state.number} (finalized by {who}"
        f"{f' on node {state.node}' if state.node else ''}{f' at {state.at}' if state.at else ''});"
        f" this node runs certagent {version}, which reads formats {describe_formats(reads)}:"
        f" upgrade this node to {state.version or 'that release'} or later before starting it"
        " against this store. Nothing was read or written."
    )


def describe_formats(numbers: Iterable[int]) -> str:
    """``1-2``, ``1, 3`` ..."""
    ordered = sorted(set(numbers))
    if not ordered:
        return "none"
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


# --- the fleet's board ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """What a node says of itself on the fleet's board: its release and the formats it reads.

    ``writes``: the format it writes now (the store's active format when it last beat).
    ``renew_pace``: the renewals a second it completed over the last five minutes; None
    for a node that does not renew (or a release that does not say).
    """

    version: str
    reads: tuple[int, ...] = field(default_factory=lambda: tuple(sorted(READS)))
    writes: int = 0
    haproxy: str = ""
    renew_pace: float | None = None

    def to_json(self) -> str:
        data: dict[str, object] = {
            "version": self.version,
            "reads": list(self.reads),
            "writes": self.writes,
            "haproxy": self.haproxy,
        }
        if self.renew_pace is not None:
            data["renew_pace"] = round(self.renew_pace, 6)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> NodeInfo:
        """ValueError if ``raw`` is not what :meth:`to_json` writes (hostile input)."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        version, reads = data.get("version"), data.get("reads")
        writes, haproxy = data.get("writes", 0), data.get("haproxy", "")
        if not isinstance(version, str) or not 0 < len(version) <= 64:
            raise ValueError("no version")
        if not isinstance(reads, list) or not all(
            isinstance(n, int) and 0 < n < 1000 for n in reads
        ):
            raise ValueError("reads is not a list of format numbers")
        if not isinstance(writes, int) or not isinstance(haproxy, str) or len(haproxy) > 64:
            raise ValueError("bad writes or haproxy")
        pace = data.get("renew_pace")
        if pace is not None and (
            isinstance(pace, bool)
            or not isinstance(pace, int | float)
            or not 0 <= pace < 1e9  # also refuses NaN
        ):
            raise ValueError("renew_pace is not a number of renewals a second")
        renew_pace = float(pace) if pace is not None else None
        return cls(version, tuple(sorted(set(reads))), writes, haproxy, renew_pace)


@dataclass(frozen=True)
class NodeSeen:
    """A node on the fleet's board, as ``fleet status`` lists it.

    ``info`` None: a node that announces its data keys but not its version (0.2.0,
    which reads formats 1 and 2 but cannot say so).  ``live``: its last beat has not
    lapsed; a node that stopped stays listed for a while (``seen`` is when it last beat,
    Unix seconds by the store's clock, as ``now``).
    """

    node: str
    info: NodeInfo | None
    seen: float
    live: bool

    @property
    def version(self) -> str:
        """Its release; ``0.2.0`` for a node that announces its data key but no version (the
        only release that does so)."""
        return self.info.version if self.info is not None else "0.2.0"

    def reads(self, number: int) -> bool:
        return self.info is not None and number in self.info.reads


def holding_back(nodes: Sequence[NodeSeen], target: int) -> list[NodeSeen]:
    """The nodes that keep the store from moving to format ``target``: every node listed
    (running, or stopped recently and so maybe coming back) that does not say it reads
    it.  A node that does not announce a version holds it back whatever it may read."""
    return [n for n in nodes if not n.reads(target)]


# --- the migration -------------------------------------------------------------------------

#: Record ids a migration's report names at most.
_NAMED = 20


@dataclass
class Migration:
    """What one migration did: records read, rewritten, and left in an older format."""

    scanned: int = 0
    rewritten: int = 0
    left: int = 0
    #: up to 20 of the records left behind, each with why
    problems: list[str] = field(default_factory=list)

    def note(self, cert_id: str, why: str) -> None:
        self.left += 1
        if len(self.problems) < _NAMED:
            self.problems.append(f"{cert_id}: {why}")
