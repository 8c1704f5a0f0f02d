"""The agent's local unix socket: one request line, one answer line.

``ensure <hostname>`` -> ``ok`` | ``unknown`` | ``busy`` | ``invalid`` | ``error``
(asked by the HAProxy Lua action); ``status`` -> one line of JSON (asked by
``certagent status``).  The socket is created mode 0600: only HAProxy's user
(and root) may ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from agent.ensure import Ensurer, Outcome

log = logging.getLogger(__name__)

MAX_LINE = 512
READ_TIMEOUT = 2.0
# A storm of new hosts connects hundreds of Lua actions at once; asyncio's default
# backlog (100) would refuse the rest, which then get the fallback.
BACKLOG = 1024


class ControlServer:
    def __init__(
        self, path: str, ensurer: Ensurer, status: Callable[[], Awaitable[dict[str, Any]]]
    ) -> None:
        self.path = path
        self.ensurer = ensurer
        self.status = status
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket from a previous run
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._handle, self.path, limit=MAX_LINE, backlog=BACKLOG
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        log.info("listening for the Lua action on %s", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                line = await reader.readline()
            writer.write((await self._answer(line)).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ValueError, ConnectionError) as exc:
            # ValueError: line over MAX_LINE (asyncio's LimitOverrunError).
            log.debug("control connection dropped: %s", type(exc).__name__)
        finally:
            writer.close()

    async def _answer(self, line: bytes) -> str:
        verb, _, arg = line.rstrip(b"\n").partition(b" ")
        if verb == b"ensure":
            return str(await self.ensurer.ensure(arg))
        if verb == b"status":
            return json.dumps(await self.status(), sort_keys=True)
        return str(Outcome.INVALID)
