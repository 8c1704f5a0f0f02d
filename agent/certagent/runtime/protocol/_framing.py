"""Encoding commands and cutting the prompt-mode stream into replies."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from certagent.errors import (
    CommandFailed,
    Locked,
    PayloadTooLarge,
)

PROMPT = b"\n> "
_CONTINUATION = re.compile(r"\A(?:\+ )+")
# Arguments we ever send: absolute paths, slot names, validated hostnames, numbers.
_ARG = r"[A-Za-z0-9._/*:@+=#-]{1,1024}"
_SAFE_ARG = re.compile(_ARG + r"\Z")
_SAFE_LINE = re.compile(rf"{_ARG}(?: {_ARG})*\Z")
LOCKED = "Operations on certificates are currently locked!"
DEFAULT_BUFSIZE = 16384
# HAProxy keeps room for rewrites (tune.maxrewrite, 1024 by default) in its buffers.
_HEADROOM = 1024


def encode(*args: str, payload: bytes | None = None, bufsize: int = DEFAULT_BUFSIZE) -> bytes:
    """Encode one command line, with an optional ``<<`` payload.

    Every argument must be a plain token: no spaces, ``;`` (command separator),
    quotes, backslashes or line breaks.  The payload must not contain an empty
    line (it would end the payload early and run the rest as commands); callers
    pass PEMs normalised by :func:`certagent.certs.pem.normalise_pem`.
    """
    if not args:
        raise ValueError("empty command")
    line = " ".join(args)
    # One match per command (this runs per load and per usage read); a space inside an
    # argument would split it in two, hence the count.
    if not _SAFE_LINE.match(line) or line.count(" ") != len(args) - 1:
        bad = next((a for a in args if not _SAFE_ARG.match(a)), line)
        raise ValueError(f"unsafe runtime-API argument {bad[:80]!r}")
    if payload is None:
        data = line.encode() + b"\n"
    else:
        if b"\r" in payload or b"\n\n" in payload or payload.startswith(b"\n"):
            raise ValueError("payload contains an empty line or CR; normalise it first")
        if not payload.endswith(b"\n"):
            payload += b"\n"
        data = line.encode() + b" <<\n" + payload + b"\n"
    if len(data) > bufsize - _HEADROOM:
        raise PayloadTooLarge(
            f"command {args[0]} {args[1] if len(args) > 1 else ''} is {len(data)} bytes; "
            f"HAProxy's tune.bufsize {bufsize} leaves {bufsize - _HEADROOM}: raise tune.bufsize "
            "in haproxy.cfg and haproxy_bufsize in certagent.toml, or shorten the chain"
        )
    return data


@dataclass(frozen=True)
class Command:
    """One runtime-API command: its arguments and an optional ``<<`` payload."""

    args: tuple[str, ...]
    payload: bytes | None = None

    def encode(self, bufsize: int = DEFAULT_BUFSIZE) -> bytes:
        """The bytes to send (:func:`encode`)."""
        return encode(*self.args, payload=self.payload, bufsize=bufsize)

    def __str__(self) -> str:
        return shown(self.args) + (" <<payload" if self.payload is not None else "")


def shown(args: tuple[str, ...]) -> str:
    """A command line fit for a log: a ticket key (``set ssl tls-key F <key>``) is hidden."""
    if args[:3] == ("set", "ssl", "tls-key") and len(args) > 4:
        return " ".join((*args[:4], "<key>"))
    return " ".join(args)


# --- framing ----------------------------------------------------------------------


class ReplySplitter:
    """Cuts the prompt-mode byte stream into replies (text before each ``"\\n> "``)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[str]:
        self._buf += data
        while True:
            idx = self._buf.find(PROMPT)
            if idx < 0:
                return
            raw = bytes(self._buf[:idx])
            del self._buf[: idx + len(PROMPT)]
            text = raw.decode("utf-8", errors="replace")
            yield _CONTINUATION.sub("", text).strip("\n")

    @property
    def pending(self) -> int:
        return len(self._buf)


def _fail(command: str, reply: str) -> CommandFailed:
    if LOCKED in reply:
        return Locked(command, reply)
    return CommandFailed(command, reply)


def check_empty(command: str, reply: str) -> None:
    """``add map``, ``set map``, ``clear map``, ``set table`` answer nothing on success."""
    if reply:
        raise _fail(command, reply)
