"""What the directory store knows about its root: records, certbot SANs, the change log.

Pure data, no I/O; owned by the event loop (worker threads only compute
:class:`Lineage` and :class:`~certagent.store.directory._files.Entry` values, the loop
applies them).

* ``files``: every record file and alias directly in root, by file name.
* ``lineages``: every certbot lineage ``live/<dir>/``, by directory name, with
  the signature of its ``fullchain.pem`` + ``privkey.pem`` and the DNS names
  (SANs) of its certificate.
* the SAN index: name (``www.x.com`` or ``*.x.com``) -> the lineage(s) whose
  certificate has it.  One dict lookup per name.  A name of one lineage maps
  to the directory name itself (a string shared with ``lineages``), a name of
  several to a sorted tuple of them.
* :class:`ChangeLog`: the last ``keep`` changes, numbered, for the change feed.

Memory grows with N lineages and S names per certificate: one ``Lineage``
(two small tuples) per lineage and one dict slot per name; the SAN strings are
shared by the lineage and the index (measured: ≈0.5 KB per lineage of 2 names,
10 MB for 20,000).
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Literal

from certagent.certs import hostname
from certagent.errors import ChangesLost, InvalidHostname
from certagent.store.base import Change, ChangeKind
from certagent.store.directory._files import Entry

__all__ = [
    "FULLCHAIN",
    "LIVE",
    "PRIVKEY",
    "WILDCARD_PREFIX",
    "ChangeLog",
    "DirState",
    "Lineage",
    "file_stem",
    "lineage_id",
    "name_of_stem",
]

Kind = Literal["put", "delete"]

LIVE = "live"
FULLCHAIN = "fullchain.pem"
PRIVKEY = "privkey.pem"


#: How a ``*.`` wildcard is spelled in file names written by the agent.
WILDCARD_PREFIX = "_wildcard."


def file_stem(name: str) -> str:
    """The file name stem the agent writes ``name`` under: ``*.x.com`` -> ``_wildcard.x.com``."""
    return WILDCARD_PREFIX + name[2:] if name.startswith("*.") else name


def name_of_stem(stem: str) -> str | None:
    """The name a file stem or certbot directory stands for, or None if lookups never use it.

    ``a.x.com`` -> ``a.x.com``; ``_wildcard.x.com`` and ``*.x.com`` -> ``*.x.com``.
    """
    raw = "*." + stem[len(WILDCARD_PREFIX) :] if stem.startswith(WILDCARD_PREFIX) else stem
    try:
        name = hostname.normalise_pattern(raw)
    except InvalidHostname:
        return None
    return name if name == raw else None


def lineage_id(dirname: str) -> str:
    """The record id of the certbot lineage ``live/<dirname>/``."""
    return f"{LIVE}/{dirname}/{FULLCHAIN}"


#: A certbot lineage as last seen: a 64-bit hash of the (inode, mtime_ns, size) of its
#: ``fullchain.pem`` and ``privkey.pem``, and its certificate's DNS names (SANs; () if it
#: could not be read).  A plain tuple of an int and strings: small, and the garbage
#: collector stops tracking it, so 20,000 of them add nothing to its passes.
Lineage = tuple[int, tuple[str, ...]]


class DirState:
    """Records, lineages and the SAN index of one root; every change is returned as Changes."""

    def __init__(self) -> None:
        self.files: dict[str, Entry] = {}
        self.lineages: dict[str, Lineage] = {}
        self._aliases: dict[str, set[str]] = {}  # record file -> its alias files
        self._by_name: dict[str, str | tuple[str, ...]] = {}

    # --- queries -----------------------------------------------------------------------

    def lineages_for(self, name: str) -> tuple[str, ...]:
        """Directory names of the lineages whose certificate has ``name``, sorted.  O(1)."""
        found = self._by_name.get(name)
        if found is None:
            return ()
        return (found,) if isinstance(found, str) else found

    def aliases_of(self, record: str) -> frozenset[str]:
        """File names of the known aliases pointing to record file ``record``."""
        return frozenset(self._aliases.get(record, ()))

    def names_indexed(self) -> int:
        return len(self._by_name)

    # --- updates -----------------------------------------------------------------------

    def update_files(self, found: Mapping[str, Entry | None]) -> list[Change]:
        """Apply what a look at root's files found (None: gone); the changes, by record."""
        names: dict[str, dict[str, None]] = {}
        for filename in sorted(found):
            before, after = self.files.get(filename), found[filename]
            if before == after:
                continue
            for entry in (before, after):
                if entry is not None:
                    names.setdefault(entry.record, {})[entry.name] = None
            if before is not None and before.record != filename:
                self._unlink_alias(before.record, filename)
            if after is None:
                del self.files[filename]
            else:
                self.files[filename] = after
                if after.record != filename:
                    self._aliases.setdefault(after.record, set()).add(filename)
        return [
            Change("put" if self._is_record(record) else "delete", record, tuple(found_names))
            for record, found_names in names.items()
        ]

    def update_lineages(self, found: Mapping[str, Lineage | None]) -> list[Change]:
        """Apply what a look at ``live/`` found (None: gone); one change per lineage that differs.

        A change's names are the directory's name and the certificate's SANs
        before and after, so an agent finds every host the change may touch.
        """
        changes: list[Change] = []
        for dirname, after in found.items():
            before = self.lineages.get(dirname)
            if before == after:
                continue
            old_sans = before[1] if before is not None else ()
            new_sans = after[1] if after is not None else ()
            for name in set(old_sans) - set(new_sans):
                self._unindex(name, dirname)
            if after is None:
                del self.lineages[dirname]
            else:
                self.lineages[dirname] = after
                for name in set(new_sans) - set(old_sans):
                    self._index(name, dirname)
            own = name_of_stem(dirname) or dirname  # lineages have valid names
            names = tuple(dict.fromkeys((own, *old_sans, *new_sans)))
            kind: Kind = "put" if after is not None else "delete"
            changes.append(Change(kind, lineage_id(dirname), names))
        return changes

    def _is_record(self, filename: str) -> bool:
        entry = self.files.get(filename)
        return entry is not None and entry.record == filename

    def _unlink_alias(self, record: str, alias: str) -> None:
        aliases = self._aliases.get(record)
        if aliases is not None:
            aliases.discard(alias)
            if not aliases:
                del self._aliases[record]

    def _index(self, name: str, dirname: str) -> None:
        current = self._by_name.get(name)
        if current is None:
            self._by_name[name] = dirname
        else:
            merged = {dirname, *((current,) if isinstance(current, str) else current)}
            self._by_name[name] = tuple(sorted(merged))

    def _unindex(self, name: str, dirname: str) -> None:
        current = self._by_name.get(name)
        if current is None or current == dirname:
            self._by_name.pop(name, None)
            return
        if isinstance(current, str):
            return
        rest = tuple(d for d in current if d != dirname)
        self._by_name[name] = rest[0] if len(rest) == 1 else rest


class ChangeLog:
    """The last ``keep`` changes, numbered; positions are ``<instance>.<number>``.

    A position from another store object, or older than what is kept, raises
    ChangesLost (the caller reconciles everything it has loaded).
    """

    def __init__(self, uri: str, keep: int = 4096) -> None:
        self._uri = uri
        self._instance = secrets.token_hex(4)
        self._seq = 0
        self._log: deque[tuple[int, Change]] = deque(maxlen=keep)

    @property
    def seq(self) -> int:
        return self._seq

    def position(self) -> str:
        return f"{self._instance}.{self._seq}"

    def append(self, changes: Iterable[Change]) -> int:
        """Record ``changes``; how many there were."""
        count = 0
        for change in changes:
            self._seq += 1
            self._log.append((self._seq, change))
            count += 1
        return count

    def seq_of(self, position: str) -> int:
        """The number in ``position``; ChangesLost if this log did not hand it out or dropped it."""
        instance, _, number = position.partition(".")
        if instance != self._instance or not number.isdigit() or int(number) > self._seq:
            raise ChangesLost(
                f"{self._uri}: {position[:40]!r} is not a position of this change feed"
            )
        seq = int(number)
        oldest = self._log[0][0] if self._log else self._seq + 1
        if seq < oldest - 1:
            raise ChangesLost(f"{self._uri}: changes after {position!r} are no longer kept")
        return seq

    def since(self, seq: int) -> tuple[Change, ...]:
        """The changes after ``seq``, one per record (names merged, last kind), by record id.

        Records (``put``/``delete``) and the issuance changes (``challenge``,
        ``domain``: :mod:`certagent.store.issuance`) are merged apart, each by its id.
        """
        merged: dict[tuple[str, str], tuple[ChangeKind, dict[str, None]]] = {}
        for number, change in reversed(self._log):
            if number <= seq:
                break
            group = change.kind if change.kind in ("challenge", "domain") else ""
            key = (group, change.id)
            _, names = merged.setdefault(key, (change.kind, {}))
            names.update(dict.fromkeys(change.names))
        return tuple(
            Change(kind, record, tuple(sorted(names)))
            for (_, record), (kind, names) in sorted(merged.items())
        )
