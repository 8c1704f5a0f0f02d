"""Files for the directory store: bounded reads, atomic writes, change signatures.

Plain blocking functions on paths, run in the store's worker threads;
:class:`~certagent.store.directory.DirectoryStore` decides which paths.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from certagent.errors import StoreCorrupt

__all__ = [
    "MAX_FILE_SIZE",
    "Entry",
    "atomic_write",
    "exclusive_write",
    "fsync_dir",
    "read_regular",
    "signature",
]

#: Files above this size are not certificates; they are refused as corrupt, not read.
MAX_FILE_SIZE = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One record file or alias in the root, as the change feed compares them."""

    record: str  # the record id (an alias's target)
    name: str  # the name its file name stands for
    signature: tuple[int, ...]  # (inode, mtime_ns, size) of the file, symlinks followed


def kind_of(mode: int) -> str:
    """``a FIFO``, ``a socket``, ... for a file mode that is not a regular file's."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a regular file"


def read_regular(path: Path, label: str, limit: int = MAX_FILE_SIZE) -> tuple[bytes, float]:
    """The bytes and mtime of regular file ``path`` (symlinks followed), at most ``limit`` bytes.

    Never opens anything but a regular file in a way that could block: the
    file is checked with ``stat`` first, opened with ``O_NONBLOCK`` (a FIFO
    swapped in meanwhile cannot hang the open) and checked again on the open
    descriptor.  FileNotFoundError and NotADirectoryError pass through (no
    such record); a FIFO, socket, device or directory, or a file over
    ``limit``, raises StoreCorrupt naming ``label``; other OSErrors pass
    through.
    """
    before = os.stat(path)
    if not stat.S_ISREG(before.st_mode):
        raise StoreCorrupt(
            f"{label} is {kind_of(before.st_mode)}, not a regular file; only regular files"
            " are read: replace it with a PEM file"
        )
    if before.st_size > limit:
        raise StoreCorrupt(f"{label} is over {limit} bytes ({before.st_size}): not a certificate")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise StoreCorrupt(
                f"{label} became {kind_of(opened.st_mode)} while being opened; only regular"
                " files are read"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise StoreCorrupt(f"{label} is over {limit} bytes: not a certificate")
    return b"".join(chunks), opened.st_mtime


def ocsp_path(chain: Path) -> Path:
    """Where the OCSP response to staple for a certificate file lives (HAProxy's convention)."""
    return chain.with_name(chain.name + ".ocsp")


def signature(path: Path | str) -> tuple[int, ...] | None:
    """(inode, mtime_ns, size) of a regular file, symlinks followed; None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


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
