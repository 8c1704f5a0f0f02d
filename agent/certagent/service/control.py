"""The agent's local unix socket: one request line, one answer line.

``ensure <hostname> [<haproxy worker pid>]`` -> ``ok`` | ``unknown`` | ``busy`` |
``invalid`` | ``error`` (asked by the HAProxy Lua action); ``status`` -> one line
of JSON (asked by ``certagent status`` and ``check``); ``status slots`` -> the same
with every slot (O(K), ≈175 bytes a slot: one line of any length, framed by the
end of the connection; the CLI reads to EOF, cli/agentsocket.py); an operator
action (``tls-keys-rotate``) -> one line of JSON, ``{"error": ...}`` if it
failed.  The socket is created mode 0600: only HAProxy's user (and root) may ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from certagent.errors import AgentError
from certagent.service.ensure import Ensurer, Outcome

log = logging.getLogger(__name__)

MAX_LINE = 512
READ_TIMEOUT = 2.0
# A storm of new hosts connects hundreds of Lua actions at once; asyncio's default
# backlog (100) would refuse the rest, which then get the fallback.
BACKLOG = 4096


class ControlServer:
    """The unix socket server; one short connection per request (the Lua action's way).

    A plain :class:`asyncio.Protocol` per connection rather than streams: a
    storm brings thousands of these, and each costs one accept, one read, one
    write and one task for the answer.
    """

    def __init__(
        self,
        path: str,
        ensurer: Ensurer,
        status: Callable[[bool], Awaitable[dict[str, Any]]],
        actions: Mapping[bytes, Callable[[], Awaitable[dict[str, Any]]]] | None = None,
    ) -> None:
        self.path = path
        self.ensurer = ensurer
        self.status = status
        self.actions = dict(actions or {})
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self.open: set[_Connection] = set()  # connections not closed yet

    async def start(self) -> None:
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket from a previous run
        old = os.umask(0o177)
        try:
            self._server = await asyncio.get_running_loop().create_unix_server(
                lambda: _Connection(self), self.path, backlog=BACKLOG
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        log.info("listening for the Lua action on %s", self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._answering):
                task.cancel()
            for connection in list(self.open):
                connection.close()  # an answer still being worked out is dropped
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def answer_later(self, line: bytes, connection: _Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._respond(line, connection))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _respond(self, line: bytes, connection: _Connection) -> None:
        connection.send(await self._answer(line))

    async def _answer(self, line: bytes) -> str:
        verb, _, arg = line.rstrip(b"\n").partition(b" ")
        if verb == b"ensure":
            host, _, pid = arg.partition(b" ")
            if pid and not (pid.isdigit() and len(pid) <= 10):
                return str(Outcome.INVALID)
            return str(await self.ensurer.ensure(host, int(pid) if pid else None))
        if verb == b"status":
            return json.dumps(await self.status(arg == b"slots"), sort_keys=True)
        action = self.actions.get(verb)
        if action is not None and not arg:
            try:
                return json.dumps(await action(), sort_keys=True)
            except AgentError as exc:
                log.warning("%s failed: %s", verb.decode(), exc)
                return json.dumps({"error": str(exc)})
        return str(Outcome.INVALID)


class _Connection(asyncio.Protocol):
    """One request line in (at most MAX_LINE bytes, within READ_TIMEOUT), one answer out."""

    def __init__(self, server: ControlServer) -> None:
        self._server = server
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._asked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's is not an asyncio.Transport subclass)
        self._transport = cast(asyncio.Transport, transport)
        self._server.open.add(self)
        self._timer = asyncio.get_running_loop().call_later(READ_TIMEOUT, self._drop, "timeout")

    def data_received(self, data: bytes) -> None:
        if self._asked:
            return  # one request per connection
        self._buffer += data
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_LINE:
                self._drop("line over the limit")
            return
        if end > MAX_LINE:
            self._drop("line over the limit")
            return
        self._asked = True
        if self._timer is not None:
            self._timer.cancel()
        self._server.answer_later(bytes(self._buffer[:end]), self)

    def eof_received(self) -> bool | None:
        if not self._asked:
            self._drop("closed before a full line")
        return True  # keep the transport open to write the answer

    def send(self, answer: str) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(answer.encode() + b"\n")
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None  # an answer still being worked out is dropped
        self._server.open.discard(self)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _drop(self, why: str) -> None:
        log.debug("control connection dropped: %s", why)
        if self._transport is not None:
            self._transport.close()
