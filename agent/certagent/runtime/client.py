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

from certagent.errors import HAProxyError, HAProxyTimeout, HAProxyUnavailable
from certagent.runtime import protocol
from certagent.runtime.protocol import Command, Identity

__all__ = ["Command", "Identity", "RuntimeClient", "probe_identity", "query"]

log = logging.getLogger(__name__)

_READ_CHUNK = 65536


class RuntimeClient:
    def __init__(
        self, path: str, *, timeout: float = 5.0, bufsize: int = protocol.DEFAULT_BUFSIZE
    ) -> None:
        self.path = path
        self.timeout = timeout
        self.bufsize = bufsize
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
        await self.execute(protocol.prompt())
        self.identity = protocol.parse_identity(await self.execute(protocol.show_info()))
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

    async def execute(self, command: Command) -> str:
        """Send one command, return its reply text (continuation prompts removed)."""
        (reply,) = await self.pipeline([command])
        return reply

    async def pipeline(self, commands: Sequence[Command]) -> list[str]:
        """Send ``commands`` in one write and return their replies, in order.

        HAProxy runs them one after the other, exactly as if sent one by one;
        only the round trips are saved.  Callers keep every certificate
        transaction closed within the batch (``set``, ``commit``, ``abort``).
        """
        if not commands:
            return []
        data = b"".join(c.encode(self.bufsize) for c in commands)
        if log.isEnabledFor(logging.DEBUG):
            for c in commands:
                # Arguments only: a payload (certificate + private key) is never logged.
                log.debug("runtime-api> %s", c)
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


async def probe_identity(path: str, timeout: float = 2.0) -> Identity:
    """Ask HAProxy who it is over a fresh, read-only connection (``show info``).

    Used by the restart watcher: the writer's own connection keeps talking to
    an old worker after a reload, so only a new connection sees the new one.
    """
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(f"cannot connect to {path}: {exc}") from exc
    command = protocol.show_info()
    try:
        writer.write(command.encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(f"'{command}' on {path} failed: {exc}") from exc
    finally:
        writer.close()
    return protocol.parse_identity(data.decode("utf-8", errors="replace"))


async def query(path: str, command: Command, timeout: float = 5.0) -> str:
    """Run one read-only command over a fresh connection (``check``, diagnostics)."""
    data = command.encode()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), timeout)
        try:
            writer.write(data)
            raw = await asyncio.wait_for(reader.read(), timeout)
        finally:
            writer.close()
    except (OSError, TimeoutError) as exc:
        raise HAProxyUnavailable(f"{command} on {path} failed: {exc}") from exc
    return raw.decode("utf-8", errors="replace")
