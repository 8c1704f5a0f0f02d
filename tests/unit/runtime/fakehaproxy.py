"""A fake HAProxy 2.6.12 runtime API for unit tests: its certificate state, and a unix socket.

:class:`HAProxyModel` answers commands the way 2.6.12 does (the replies recorded in
tests/unit/runtime/test_protocol.py and /work/shared/design/haproxy-2.6-facts.md), with its
one process-wide certificate transaction and the merge of a second ``set`` into it.
:class:`FakeRuntimeSocket` serves any responder on a unix socket with HAProxy's
framing: ``prompt`` mode (a ``"\\n> "`` after each reply, ``"+ "`` per payload line),
or one command per connection without it.  Real-HAProxy behaviour is covered by
tests/integration.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from certagent.runtime import protocol

Responder = Callable[[tuple[str, ...], bytes | None], str]

TABLE_HEADER = "# table: {table}, type: string, size:4000, used:{used}"


@dataclass
class HAProxyModel:
    """What one HAProxy worker holds, changed by the commands it answers."""

    crt_list: str = "/etc/certagent/certagent.crtlist"
    table: str = "fe_sni"
    pid: int = 4242
    certs: dict[str, bytes | None] = field(default_factory=dict)  # name -> committed PEM
    listed: list[str] = field(default_factory=list)
    transaction: tuple[str, bytes | None] | None = None  # certificate name, PEM set in it
    marks: dict[str, int] = field(default_factory=dict)  # usage table: host -> gpt0
    in_use: set[str] = field(default_factory=set)  # entries a connection tracks
    locked: int = 0  # answer "currently locked" to this many more certificate commands
    names: dict[bytes, tuple[str, ...]] = field(default_factory=dict)  # PEM -> its DNS names
    log: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, args: tuple[str, ...], payload: bytes | None) -> str:
        self.log.append(args)
        verb = " ".join(args[:3])
        if verb in ("set ssl cert", "commit ssl cert", "abort ssl cert") and self.locked:
            self.locked -= 1
            return protocol.LOCKED
        if args == ("show", "info"):
            return f"Name: HAProxy\nVersion: 2.6.12\nPid: {self.pid}\nStart_time_sec: 1\n"
        if verb == "new ssl cert":
            return self._new(args[3])
        if verb == "set ssl cert":
            return self._set(args[3].removesuffix(".ocsp"), payload, args[3].endswith(".ocsp"))
        if verb == "commit ssl cert":
            return self._commit(args[3])
        if verb == "abort ssl cert":
            return self._abort(args[3])
        if verb == "add ssl crt-list":
            return self._add(args[3], args[4])
        if args == ("show", "ssl", "cert"):
            txn = [] if self.transaction is None else ["# transaction", "*" + self.transaction[0]]
            return "\n".join([*txn, "# filename", *self.certs])
        if verb == "show ssl cert":
            return self._details(args[3])
        if verb == "show ssl crt-list":
            return "\n".join([f"# {args[3]}", *self.listed])
        if args[:2] == ("set", "table"):
            self.marks[args[4]] = int(args[6])
            return ""
        if args[:2] == ("clear", "table"):
            if args[4] in self.in_use:
                return protocol.IN_USE
            self.marks.pop(args[4], None)
            return ""
        if args[:2] == ("show", "table"):
            return self._show_table(args)
        if verb == "set ssl ocsp-response":
            return "OCSP Response updated!"
        raise AssertionError(f"the fake HAProxy does not know {args}")

    def _new(self, name: str) -> str:
        if name in self.certs:
            return f"Certificate '{name}' already exists!"
        self.certs[name] = None
        return f"New empty certificate store '{name}'!"

    def _set(self, name: str, payload: bytes | None, ocsp: bool) -> str:
        if name not in self.certs:
            return (
                "Can't replace a certificate which is not referenced by the configuration!\n"
                f"Can't update {name}!"
            )
        if payload is not None and b"NOT A PEM" in payload:
            return f"unable to load certificate from file '{name}'.\nCan't update {name}!"
        if self.transaction is not None:  # 2.6.12: merged into the open one, whatever its name
            held, pem = self.transaction
            self.transaction = (held, pem if ocsp else payload)
            return f"Transaction updated for certificate {held}!"
        self.transaction = (name, self.certs[name] if ocsp else payload)
        return f"Transaction created for certificate {name}!"

    def _commit(self, name: str) -> str:
        if self.transaction is None:
            return f"No ongoing transaction! !\nCan't commit {name}!"
        held, pem = self.transaction
        if held != name:
            return (
                f"The ongoing transaction is about '{held}' but you are trying to set '{name}'\n"
                f"Can't commit {name}!"
            )
        if pem is not None and b"MISMATCH" in pem:
            return (
                f"Committing {name}\ninconsistencies between private key and certificate"
                f" loaded '{name}'.\nFailed!"
            )  # the transaction stays open: the caller aborts it
        self.certs[name] = pem
        self.transaction = None
        return f"Committing {name}{'.' if name in self.listed else ''}\nSuccess!"

    def _abort(self, name: str) -> str:
        if self.transaction is None:
            return "No ongoing transaction!"
        if self.transaction[0] != name:
            return f"The ongoing transaction is about '{self.transaction[0]}'\nCan't abort {name}!"
        self.transaction = None
        return f"Transaction aborted for certificate '{name}'!"

    def _add(self, crt_list: str, name: str) -> str:
        if crt_list != self.crt_list:
            return f"crt-list '{crt_list}' does not exist!"
        if self.certs.get(name) is None:
            return f"Can't edit the crt-list: certificate '{name}' is empty!"
        self.listed.append(name)
        return f"Inserting certificate '{name}' in crt-list '{crt_list}'.\nSuccess!"

    def _details(self, name: str) -> str:
        pem = self.certs.get(name)
        if pem is None:
            return "Can't display the certificate: Not found or the certificate is a bundle!"
        sans = ", ".join(f"DNS:{n}" for n in self.names.get(pem, ("unknown.test",)))
        return (
            f"Filename: {name}\nStatus: Used\nSerial: 01\n"
            f"Subject Alternative Name: {sans}\n"
            f"SHA1 FingerPrint: {fingerprint(pem)}\nSubject: /CN=x\n"
        )

    def _show_table(self, args: tuple[str, ...]) -> str:
        if args[2] != self.table:
            return f"No such table: {args[2]}"
        hosts = [args[4]] if args[3] == "key" else [h for h, n in self.marks.items() if n > 0]
        rows = [
            f"0x55d0{i:08x}: key={h} use=0 exp=3599000 gpt0={self.marks[h]} conn_cnt=1"
            for i, h in enumerate(hosts)
            if h in self.marks
        ]
        return "\n".join([TABLE_HEADER.format(table=args[2], used=len(self.marks)), *rows])


def fingerprint(pem: bytes) -> str:
    """The model's stand-in for a certificate's SHA-1 fingerprint: that of its PEM."""
    return hashlib.sha1(pem).hexdigest().upper()


class FakeRuntimeSocket:
    """A unix socket answering with ``respond``, in HAProxy's runtime-API framing.

    ``silent`` connections read commands and never answer (a stuck HAProxy);
    ``close_after`` closes a connection after that many commands, mid-stream.
    """

    def __init__(self, path: Path, respond: Responder) -> None:
        self.path = path
        self.respond = respond
        self.received: list[tuple[tuple[str, ...], bytes | None]] = []
        self.connections = 0
        self.silent = False
        self.close_after: int | None = None
        self._server: asyncio.Server | None = None
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # Python 3.11's wait_closed does not wait for the connections: end them
        for writer in self._handlers.values():
            writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers[task] = writer
            task.add_done_callback(lambda t: self._handlers.pop(t, None))
        interactive = False
        try:
            while not reader.at_eof():
                line = await reader.readline()
                if not line:
                    break
                text = line.decode().rstrip("\n")
                payload: bytes | None = None
                plus = b""
                if text.endswith(" <<"):
                    text, lines = text[:-3], []
                    while (more := await reader.readline()) not in (b"\n", b""):
                        lines.append(more)
                    payload = b"".join(lines)
                    plus = b"+ " * (len(lines) + 1)
                args = tuple(text.split(" "))
                if args == ("prompt",):
                    interactive = True
                    writer.write(b"\n> ")
                    continue
                self.received.append((args, payload))
                if self.close_after is not None and len(self.received) >= self.close_after:
                    break
                if self.silent:
                    continue
                reply = self.respond(args, payload)
                body = (reply + "\n").encode() if reply else b""
                if not interactive:
                    writer.write(body)
                    break
                writer.write(plus + body + b"\n> ")
        finally:
            writer.close()  # flushes what is buffered; no await, so a cancelled task closes too
