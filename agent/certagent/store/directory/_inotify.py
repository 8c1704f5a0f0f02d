"""Linux inotify through the C library (ctypes): no thread, no timer, nothing at rest.

The directory store registers the directories it cares about and reads the
events from a non-blocking file descriptor that the event loop watches
(``loop.add_reader``): the agent is woken only when a watched directory changes.
:func:`open_inotify` raises :class:`InotifyUnavailable` where there is no
inotify (another OS, a C library without it, ``max_user_instances`` reached);
:meth:`Inotify.add_watch` raises :class:`WatchLimit` when ``max_user_watches``
is reached.  Both make the store poll instead.

The watch table (descriptor -> what the caller calls that directory) is locked:
watches are added from worker threads while the event loop reads events.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DIR_MASK",
    "IN_ATTRIB",
    "IN_CLOSE_WRITE",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_IGNORED",
    "IN_ISDIR",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_Q_OVERFLOW",
    "Event",
    "Inotify",
    "InotifyUnavailable",
    "WatchLimit",
    "open_inotify",
]

IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000

#: What the store watches in a directory: entries appearing, disappearing,
#: renamed, written and closed, or changing metadata; and the directory itself
#: going away.  Not IN_MODIFY: a file is looked at once its writer closes it.
DIR_MASK = (
    IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ_SIZE = 64 * 1024


class InotifyUnavailable(OSError):
    """This system offers no inotify instance to this process."""


class WatchLimit(OSError):
    """``fs.inotify.max_user_watches`` is reached."""


@dataclass(frozen=True, slots=True)
class Event:
    wd: int  # -1 for IN_Q_OVERFLOW
    mask: int
    name: str  # the entry in the watched directory; "" for events on the directory itself
    tag: str | None  # what add_watch was told the directory is; None if unknown


class _Libc:
    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self.init1 = libc.inotify_init1
            self.add_watch = libc.inotify_add_watch
            self.rm_watch = libc.inotify_rm_watch
        except (OSError, AttributeError) as exc:
            raise InotifyUnavailable(errno.ENOSYS, f"no inotify in the C library: {exc}") from exc
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm_watch.restype = ctypes.c_int


def open_inotify() -> Inotify:
    """A new inotify instance; InotifyUnavailable if the system has none for us."""
    libc = _Libc()
    fd = libc.init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise InotifyUnavailable(code, f"inotify_init1: {os.strerror(code)}")
    return Inotify(libc, fd)


class Inotify:
    """One inotify instance: watches by tag, events read without blocking."""

    def __init__(self, libc: _Libc, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._lock = threading.Lock()
        self._tags: dict[int, str] = {}
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def __len__(self) -> int:
        with self._lock:
            return len(self._tags)

    def add_watch(self, path: Path, tag: str, mask: int = DIR_MASK) -> int:
        """Watch directory ``path`` (symlinks followed); events carry ``tag``.

        Watching a directory twice returns the same descriptor.  Raises
        FileNotFoundError / NotADirectoryError if it is gone, WatchLimit when
        the per-user limit is reached, OSError otherwise.
        """
        if self._closed:
            raise OSError(errno.EBADF, "the inotify instance is closed")
        wd = int(self._libc.add_watch(self._fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSPC:
                raise WatchLimit(
                    code,
                    "the inotify watch limit is reached (fs.inotify.max_user_watches); "
                    "raise it with sysctl",
                )
            raise OSError(code, os.strerror(code), str(path))
        with self._lock:
            self._tags[wd] = tag
        return wd

    def read(self) -> list[Event]:
        """Every event queued now (possibly none); never blocks."""
        events: list[Event] = []
        while not self._closed:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not data:
                break
            with self._lock:
                offset = 0
                while offset + _HEADER.size <= len(data):
                    wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                    offset += _HEADER.size
                    raw = data[offset : offset + length].split(b"\0", 1)[0]
                    offset += length
                    tag = self._tags.get(wd)
                    if mask & IN_IGNORED:
                        self._tags.pop(wd, None)
                    events.append(Event(wd, mask, os.fsdecode(raw), tag))
        return events

    def close(self) -> None:
        """Close the descriptor (every watch goes with it); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._tags.clear()
        os.close(self._fd)
