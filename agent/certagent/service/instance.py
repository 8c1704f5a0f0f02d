"""One agent per HAProxy: an exclusive lock on a file beside the agent's socket.

Two agents on one HAProxy would be two runtime-API writers (2.6.12 merges their
certificate transactions) and would delete each other's socket.  The lock is
``flock`` on ``<agent_socket>.lock``: the kernel drops it when the process
ends, however it ends (SIGKILL included), so a stale lock file never blocks a
restart.  The holder's pid is written into the file for the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from certagent.errors import ConfigError


class InstanceLock:
    def __init__(self, socket_path: str) -> None:
        self.path = Path(socket_path + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming the agent that holds it."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"cannot open the agent's lock file {self.path}: {exc.strerror}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"another certagent (pid {holder}) already serves this HAProxy: it holds "
                f"{self.path}; stop it first (one agent per HAProxy: it is the only writer "
                "of the runtime API)"
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None
