"""Files for the directory store: atomic writes and change-feed snapshots.

Plain functions on paths; :mod:`agent.store.directory` decides which paths.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.store.base import Change

__all__ = [
    "Entry",
    "Snapshot",
    "atomic_write",
    "diff",
    "exclusive_write",
    "fsync_dir",
    "signature",
]


@dataclass(frozen=True)
class Entry:
    """One record file or alias in a change-feed snapshot."""

    record: str  # the record id (an alias's target)
    name: str  # the name its file name stands for
    signature: tuple[int, ...]  # (inode, mtime_ns, size) of the file(s), symlinks followed


#: Relative path -> entry, for every record file and alias.
Snapshot = dict[str, Entry]


def signature(path: Path) -> tuple[int, ...] | None:
    """(inode, mtime_ns, size) of a regular file, symlinks followed; None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def diff(base: Snapshot, current: Snapshot) -> tuple[Change, ...]:
    """One change per record whose files differ: ``put`` if it is still there, else ``delete``."""
    names: dict[str, dict[str, None]] = {}
    for path in sorted(base.keys() | current.keys()):
        before, after = base.get(path), current.get(path)
        if before == after:
            continue
        for entry in (before, after):
            if entry is not None:
                names.setdefault(entry.record, {})[entry.name] = None
    records = {path for path, entry in current.items() if entry.record == path}
    return tuple(
        Change("put" if record in records else "delete", record, tuple(found))
        for record, found in sorted(names.items())
    )


def atomic_write(directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` with ``data``, mode 0600, via a synced temporary file."""
    tmp = _synced_temp(directory, name, data)
    try:
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def exclusive_write(directory: Path, name: str, data: bytes) -> None:
    """Create ``directory/name`` with ``data``, mode 0600; FileExistsError if it exists."""
    tmp = _synced_temp(directory, name, data)
    try:
        os.link(tmp, directory / name)  # atomic, and never replaces
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _synced_temp(directory: Path, name: str, data: bytes) -> str:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
