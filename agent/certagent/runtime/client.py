"""One long-lived runtime-API connection in prompt mode.

Exactly one :class:`RuntimeClient` writes to an HAProxy: HAProxy 2.6.12 has a
single process-wide certificate transaction and silently merges a second
writer's ``set ssl cert`` into the first one's.  The client runs one command at
a time; callers that need several commands to stay together (a slot load) hold
their own lock around them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from certagent.errors import HAProxyError, HAProxyTimeout, HAProxyUnavailable, Locked
from certagent.runtime import protocol

log = logging.getLogger(__name__)

_READ_CHUNK = 65536


@dataclass(frozen=True)
class Command:
    """One runtime-API command: its arguments and an optional ``<<`` payload."""

    args: tuple[str, ...]
    payload: bytes | None = None


@dataclass(frozen=True)
class Identity:
    """Which HAProxy process a connection talks to; changes on reload and restart."""

    pid: int
    start_time: int
    version: str


def identity_from_info(info: dict[str, str]) -> Identity:
    try:
        return Identity(
            int(info["Pid"]), int(info.get("Start_time_sec", "0")), info.get("Version", "?")
        )
    except ValueError as exc:
        raise HAProxyError(f"unexpected 'show info' values: Pid={info.get('Pid')!r}") from exc


class RuntimeClient:
    def __init__(
        self,
        path: str,
        *,
        timeout: float = 5.0,
        bufsize: int = protocol.DEFAULT_BUFSIZE,
        locked_retries: int = 6,
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.bufsize = bufsize
        self.locked_retries = locked_retries
        self.identity: Identity | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._splitter = protocol.ReplySplitter()
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> Identity:
        await self.close()
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.path), self.timeout
            )
        except (OSError, TimeoutError) as exc:
            raise HAProxyUnavailable(
                f"cannot connect to HAProxy runtime socket {self.path}: {exc}; "
                "is HAProxy running with 'stats socket ... level admin'?"
            ) from exc
        self._splitter = protocol.ReplySplitter()
        await self.execute("prompt")
        self.identity = identity_from_info(
            protocol.parse_show_info(await self.execute("show", "info"))
        )
        log.info(
            "connected to HAProxy %s pid %d via %s",
            self.identity.version,
            self.identity.pid,
            self.path,
        )
        return self.identity

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        self.identity = None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError as exc:
                log.debug("closing runtime socket: %s", exc)

    async def execute(self, *args: str, payload: bytes | None = None) -> str:
        """Send one command, return its reply text (continuation prompts removed)."""
        (reply,) = await self.pipeline([Command(args, payload)])
        return reply

    async def pipeline(self, commands: Sequence[Command]) -> list[str]:
        """Send ``commands`` in one write and return their replies, in order.

        HAProxy runs them one after the other, exactly as if sent one by one;
        only the round trips are saved.  Callers keep every certificate
        transaction closed within the batch (``set``, ``commit``, ``abort``).
        """
        if not commands:
            return []
        data = b"".join(
            protocol.encode(*c.args, payload=c.payload, bufsize=self.bufsize) for c in commands
        )
        if log.isEnabledFor(logging.DEBUG):
            for c in commands:
                # Arguments only: a payload (certificate + private key) is never logged.
                log.debug(
                    "runtime-api> %s%s", protocol.shown(c.args), " <<payload" if c.payload else ""
                )
        timeout = self.timeout + 0.01 * len(commands)
        async with self._lock:
            if self._writer is None or self._reader is None:
                raise HAProxyUnavailable("not connected to the HAProxy runtime socket")
            try:
                self._writer.write(data)
                # asyncio.timeout, not wait_for: no extra task per round trip (hot path)
                async with asyncio.timeout(timeout):
                    await self._writer.drain()
                    return await self._read_replies(self._reader, len(commands))
            except TimeoutError as exc:
                await self.close()
                first = commands[0].args
                raise HAProxyTimeout(
                    f"HAProxy did not answer {' '.join(first[:3])} (+{len(commands) - 1} more)"
                    f" in {timeout:.1f}s"
                ) from exc
            except (OSError, EOFError) as exc:
                await self.close()
                raise HAProxyUnavailable(f"HAProxy runtime connection lost: {exc}") from exc

    async def _read_replies(self, reader: asyncio.StreamReader, count: int) -> list[str]:
        replies = list(self._splitter.feed(b""))
        while len(replies) < count:
            chunk = await reader.read(_READ_CHUNK)
            if not chunk:
                raise EOFError("HAProxy closed the runtime connection (payload over tune.bufsize?)")
            replies.extend(self._splitter.feed(chunk))
        if len(replies) > count or self._splitter.pending:
            raise HAProxyError(f"HAProxy sent more than {count} replies for {count} commands")
        return replies

    async def execute_cert(self, *args: str, payload: bytes | None = None) -> str:
        """Like :meth:`execute`, retrying ``currently locked`` with backoff."""
        delay = 0.01
        for attempt in range(self.locked_retries + 1):
            reply = await self.execute(*args, payload=payload)
            if protocol.LOCKED not in reply or attempt == self.locked_retries:
                return reply
            log.warning("HAProxy certificate operations locked; retrying in %.0f ms", delay * 1000)
            await asyncio.sleep(delay)
            delay *= 2
        raise Locked(" ".join(args), protocol.LOCKED)  # pragma: no cover - loop always returns


async def probe_identity(path: str, timeout: float = 2.0) -> Identity:
    """Ask HAProxy who it is over a fresh, read-only connection (``show info``).

    Used by the restart watcher: the writer's own connection keeps talking to
    an old worker after a reload, so only a new connection sees the new one.
    """
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(f"cannot connect to {path}: {exc}") from exc
    try:
        writer.write(b"show info\n")
        data = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(f"'show info' on {path} failed: {exc}") from exc
    finally:
        writer.close()
    return identity_from_info(protocol.parse_show_info(data.decode("utf-8", errors="replace")))


async def query(path: str, *args: str, timeout: float = 5.0) -> str:
    """Run one read-only command over a fresh connection (``check``, diagnostics)."""
    data = protocol.encode(*args)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
        writer.write(data)
        raw = await asyncio.wait_for(reader.read(), timeout)
        writer.close()
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(
            f"{args[0]} {' '.join(args[1:3])} on {path} failed: {exc}"
        ) from exc
    return raw.decode("utf-8", errors="replace")
