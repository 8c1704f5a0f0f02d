"""HAProxy 2.6 runtime-API protocol, sans I/O.

Everything here turns values into bytes or bytes into typed values; nothing
touches a socket.  The client in :mod:`certagent.runtime.client` moves the bytes.

The connection runs in ``prompt`` mode: every reply ends with ``"\\n> "`` and
each line of a ``<<`` payload is acknowledged with a ``"+ "`` continuation
prompt before the reply itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from certagent.errors import (
    CommandFailed,
    HAProxyError,
    Locked,
    PayloadTooLarge,
    WrongTransaction,
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


# --- encoding ---------------------------------------------------------------------


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


# --- reply checks for certificate commands ---------------------------------------------


def _fail(command: str, reply: str) -> CommandFailed:
    if LOCKED in reply:
        return Locked(command, reply)
    return CommandFailed(command, reply)


def check_new_cert(cert: str, reply: str) -> None:
    if reply != f"New empty certificate store '{cert}'!":
        raise _fail(f"new ssl cert {cert}", reply)


def check_set_cert(cert: str, reply: str) -> None:
    """``set ssl cert`` must name *our* certificate (2.6.12 merges into a foreign transaction)."""
    m = re.fullmatch(r"Transaction (?:created|updated) for certificate (\S+)!", reply)
    if m is None:
        raise _fail(f"set ssl cert {cert}", reply)
    if m.group(1) != cert:
        raise WrongTransaction(
            f"set ssl cert {cert} landed in the open transaction of {m.group(1)}; "
            "another writer is using this HAProxy's runtime socket"
        )


def check_commit_cert(cert: str, reply: str) -> None:
    lines = reply.splitlines()
    if not lines or not lines[0].startswith("Committing "):
        raise _fail(f"commit ssl cert {cert}", reply)
    # One '.' per crt-list instance updated follows the name: "Committing <name>..".
    if lines[0].rstrip(".") != f"Committing {cert}":
        raise WrongTransaction(f"commit ssl cert {cert} committed {lines[0][11:]!r}")
    if lines[-1] != "Success!":
        raise _fail(f"commit ssl cert {cert}", reply)


def check_abort_cert(cert: str, reply: str) -> None:
    if reply != f"Transaction aborted for certificate '{cert}'!":
        raise _fail(f"abort ssl cert {cert}", reply)


def check_set_ocsp(reply: str) -> None:
    """``set ssl ocsp-response``: refused when no loaded certificate has its CertID."""
    if reply != "OCSP Response updated!":
        raise CommandFailed("set ssl ocsp-response <response>", reply)


def check_add_crtlist(crtlist: str, cert: str, reply: str) -> None:
    # One '.' per bind using the crt-list follows: "... in crt-list '<l>'.."
    expected = f"Inserting certificate '{cert}' in crt-list '{crtlist}'"
    lines = reply.splitlines()
    if len(lines) != 2 or lines[0].rstrip(".") != expected or lines[1] != "Success!":
        raise _fail(f"add ssl crt-list {crtlist} {cert}", reply)


def check_empty(command: str, reply: str) -> None:
    """``add map``, ``set map``, ``clear map``, ``clear table`` answer nothing on success."""
    if reply:
        raise _fail(command, reply)


def check_del_map(command: str, reply: str) -> bool:
    """True if the key was deleted, False if it was not there."""
    if reply == "":
        return True
    if reply == "Key not found.":
        return False
    raise _fail(command, reply)


# --- parsers for show commands -------------------------------------------------------


@dataclass(frozen=True)
class CertList:
    """``show ssl cert``: certificate names, and the one with an open transaction."""

    names: tuple[str, ...]
    transaction: str | None


def parse_show_ssl_cert(reply: str) -> CertList:
    names: list[str] = []
    transaction: str | None = None
    section = ""
    for line in reply.splitlines():
        if line.startswith("# "):
            section = line[2:].strip()
            continue
        if not line:
            continue
        if section == "transaction":
            transaction = line.lstrip("*")
        elif section == "filename":
            names.append(line.lstrip("*"))
        else:
            raise HAProxyError(f"unexpected 'show ssl cert' line {line[:100]!r}")
    return CertList(tuple(names), transaction)


@dataclass(frozen=True)
class CertDetails:
    """``show ssl cert <name>``."""

    name: str
    status: str
    serial: str
    fingerprint_sha1: str
    dns_names: tuple[str, ...]
    subject: str


def parse_cert_details(reply: str) -> CertDetails:
    fields: dict[str, str] = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            fields[key] = value.strip()
        elif line.endswith(":"):
            fields[line[:-1]] = ""
    if "Filename" not in fields:
        raise HAProxyError(f"unexpected 'show ssl cert <name>' reply {reply[:200]!r}")
    san = fields.get("Subject Alternative Name", "")
    dns = tuple(
        part.strip()[4:].lower() for part in san.split(",") if part.strip().startswith("DNS:")
    )
    return CertDetails(
        name=fields["Filename"].lstrip("*"),
        status=fields.get("Status", ""),
        serial=fields.get("Serial", ""),
        fingerprint_sha1=fields.get("SHA1 FingerPrint", "").upper(),
        dns_names=dns,
        subject=fields.get("Subject", ""),
    )


def parse_show_crtlist(reply: str) -> tuple[str, ...]:
    """``show ssl crt-list <list>``: the certificate of each line (options ignored)."""
    entries = []
    for line in reply.splitlines():
        if not line or line.startswith("#"):
            continue
        entries.append(line.split(" ", 1)[0])
    return tuple(entries)


def parse_show_map(reply: str) -> list[tuple[str, str]]:
    """``show map <map>``: ``0x55..: key value`` or ``0x55.. key value`` lines."""
    rows = []
    for line in reply.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[0].startswith("0x"):
            continue
        rows.append((parts[1], parts[2]))
    return rows


def parse_show_info(reply: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            info[key] = value
    if "Pid" not in info:
        raise HAProxyError(f"unexpected 'show info' reply {reply[:200]!r}")
    return info


@dataclass(frozen=True)
class TableEntry:
    key: str
    expire_ms: int | None
    conn_cnt: int | None
    gpt0: int | None = None


_TABLE_LINE = re.compile(r"0x[0-9a-f]+: key=(\S+) use=\d+ exp=(\d+)(.*)\Z")
_CONN_CNT = re.compile(r"\bconn_cnt=(\d+)")
_GPT0 = re.compile(r"\bgpt0=(\d+)")


def parse_show_table(reply: str) -> list[TableEntry]:
    """``show table <t>`` entries; lines that do not parse (hostile keys) are skipped."""
    entries = []
    for line in reply.splitlines():
        m = _TABLE_LINE.match(line)
        if m is None:
            continue
        conn = _CONN_CNT.search(m.group(3))
        gpt0 = _GPT0.search(m.group(3))
        entries.append(
            TableEntry(
                key=m.group(1),
                expire_ms=int(m.group(2)),
                conn_cnt=int(conn.group(1)) if conn else None,
                gpt0=int(gpt0.group(1)) if gpt0 else None,
            )
        )
    return entries


IN_USE = "Entry currently in use, cannot remove"


def check_clear_table(command: str, reply: str) -> bool:
    """``clear table <t> key <k>``: True if removed (or absent), False if a session holds it.

    HAProxy refuses to remove an entry a live connection tracks; that is not
    an error for the agent, which neutralises the entry first (``gpt0`` 0).
    """
    if reply == "":
        return True
    if reply == IN_USE:
        return False
    raise _fail(command, reply)


# --- TLS ticket keys -------------------------------------------------------------------

_TLS_KEY_ROW = re.compile(r"(\d+)\.(\d+) (\S+)\Z")
NO_TLS_KEYS_FILE = "unable to locate referenced filename"


def shown(args: tuple[str, ...]) -> str:
    """A command line fit for a log: a ticket key (``set ssl tls-key F <key>``) is hidden."""
    if args[:3] == ("set", "ssl", "tls-key") and len(args) > 4:
        return " ".join((*args[:4], "<key>"))
    return " ".join(args)


def parse_show_tls_keys(reply: str) -> tuple[str, ...] | None:
    """``show tls-keys <file>``: the keys in HAProxy's order (previous, current, next).

    None if HAProxy has no ticket-key file of that name (no ``tls-ticket-keys``
    in haproxy.cfg); HAProxyError for any other reply without keys.
    """
    if NO_TLS_KEYS_FILE in reply:
        return None
    rows = []
    for line in reply.splitlines():
        match = _TLS_KEY_ROW.match(line)
        if match:
            rows.append((int(match.group(2)), match.group(3)))
    if not rows:
        raise HAProxyError(f"unexpected 'show tls-keys' reply {reply[:80]!r}")
    return tuple(key for _, key in sorted(rows))


def check_set_tls_key(keys_file: str, reply: str) -> None:
    """``set ssl tls-key <file> <key>``; the command named without its key (a secret)."""
    if reply != "TLS ticket key updated!":
        raise CommandFailed(f"set ssl tls-key {keys_file} <key>", reply)
