"""The renewal schedule's journal, ``<root>/.certagent/renewals.log``: blocking file I/O.

One line per change, appended (and fsynced) under an exclusive ``flock`` of the
journal itself; replaying the lines in order gives the schedule::

    S <name> <renew_at> <not_after>     the entry of <name> is now this
    D <name>                            <name> has no entry

A line that is neither (a write cut short by a crash) is skipped with a
warning.  Several processes may write it (the agent, and a CLI command given the
same directory): each keeps the journal's *signature* (inode, size) as it last
read or wrote it, and a signature that changed meanwhile means another process
wrote: :meth:`Journal.append` then replays the journal (its own line included)
and hands back the schedule, and :meth:`Journal.read_if_changed` does the same
for readers.  Once the journal holds :data:`COMPACT_AT` lines and more than twice
as many as entries, :meth:`Journal.append` rewrites it with one ``S`` line per
entry (a synced temporary file and a rename, under the lock); a writer that was
waiting for the lock on the old file sees that its inode is no longer the
path's and opens the new one.

Functions run on the directory store's worker threads.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from certagent.errors import InvalidHostname, StoreCorrupt
from certagent.store.directory._files import atomic_write
from certagent.store.issuing import check_name
from certagent.store.localrenewals import Schedule
from certagent.store.renewals import DueRenewal
from certagent.store.renewing import check_entry, format_time

__all__ = ["COMPACT_AT", "MAX_JOURNAL", "Journal", "Replayed", "Signature", "line_of"]

log = logging.getLogger(__name__)

#: The journal is compacted once it has this many lines and twice as many as entries.
COMPACT_AT = 1000
#: A journal larger than this is refused (about 2.5 million lines).
MAX_JOURNAL = 256 << 20

#: (inode, size) of the journal; (0, 0) when there is none.
Signature = tuple[int, int]
_NONE: Signature = (0, 0)


@dataclass(frozen=True)
class Replayed:
    """The schedule a journal replays to, its line count and the signature read."""

    schedule: Schedule
    lines: int
    signature: Signature


def line_of(name: str, entry: DueRenewal | None) -> bytes:
    """The journal line saying ``name``'s entry is now ``entry`` (None: dropped)."""
    if entry is None:
        return f"D {name}\n".encode("ascii")
    at, after = format_time(entry.renew_at), format_time(entry.not_after)
    return f"S {name} {at} {after}\n".encode("ascii")


def _changes(data: bytes, where: str) -> Iterator[DueRenewal | str]:
    """The changes in journal bytes: an entry (``S``) or a dropped name (``D``)."""
    for number, raw in enumerate(data.split(b"\n"), 1):
        parts = raw.decode("ascii", "replace").split()
        if not parts:
            continue
        try:
            if parts[0] == "S" and len(parts) == 4:
                yield check_entry(parts[1], float(parts[2]), float(parts[3]))
                continue
            if parts[0] == "D" and len(parts) == 2:
                yield check_name(parts[1])
                continue
        except (ValueError, InvalidHostname) as exc:
            log.warning("%s line %d: %s; skipped", where, number, exc)
            continue
        log.warning("%s line %d is not a schedule change; skipped", where, number)


def _replay(fd: int, where: str) -> Replayed:
    st = os.fstat(fd)
    if st.st_size > MAX_JOURNAL:
        raise StoreCorrupt(f"{where} is larger than {MAX_JOURNAL >> 20} MiB; move it away")
    data = os.pread(fd, st.st_size, 0)
    entries: dict[str, DueRenewal] = {}
    lines = 0
    for change in _changes(data, where):
        lines += 1
        if isinstance(change, DueRenewal):
            entries[change.name] = change
        else:
            entries.pop(change, None)
    return Replayed(Schedule(entries.values()), lines, (st.st_ino, len(data)))


class Journal:
    """``folder/name``, the journal of one directory store (see the module's docstring)."""

    def __init__(self, folder: Path, name: str = "renewals.log") -> None:
        self.folder = folder
        self.path = folder / name

    def signature(self) -> Signature:
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return _NONE
        return (st.st_ino, st.st_size)

    def read(self) -> Replayed:
        """The journal replayed (under a shared lock: no half-written line is read)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return Replayed(Schedule(), 0, _NONE)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _replay(fd, str(self.path))
        finally:
            os.close(fd)

    def read_if_changed(self, seen: Signature) -> Replayed | None:
        """:meth:`read` if the journal's signature is not ``seen`` (another process wrote)."""
        return None if self.signature() == seen else self.read()

    def append(self, line: bytes, seen: Signature) -> tuple[Replayed | None, Signature]:
        """Append ``line`` under the lock, fsynced.

        ``seen``: the signature this process last had.  Returns the journal
        replayed (``line`` included) if another process had written it
        meanwhile, else None; and the signature after the write.
        """
        self._folder()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                if self.signature()[0] != st.st_ino:
                    continue  # compacted (renamed over) while we waited: open the new file
                before = (st.st_ino, st.st_size)
                stale = before != seen and not (seen == _NONE and st.st_size == 0)
                os.write(fd, line)
                os.fsync(fd)
                after = (st.st_ino, st.st_size + len(line))
                return (_replay(fd, str(self.path)) if stale else None), after
            finally:
                os.close(fd)

    def compact(self) -> Replayed:
        """Rewrite the journal with one line per entry, under the lock; the result."""
        self._folder()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if self.signature()[0] != os.fstat(fd).st_ino:
                    continue
                replayed = _replay(fd, str(self.path))
                entries = replayed.schedule.entries()
                body = b"".join(line_of(e.name, e) for e in entries)
                atomic_write(self.folder, self.path.name, body)
                return Replayed(replayed.schedule, len(entries), self.signature())
            finally:
                os.close(fd)

    def _folder(self) -> None:
        if not self.folder.is_dir():
            self.folder.mkdir(mode=0o700, exist_ok=True)
