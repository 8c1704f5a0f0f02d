"""HAProxy's runtime-API protocol, sans I/O: every command the agent sends, and its reply.

Everything here turns values into bytes or bytes into typed values; nothing touches a socket.
The client in :mod:`certagent.runtime.client` moves the bytes.  No other module of the agent
spells a command: each one is built by a function here (returning a :class:`Command`), next to
the check or parser of its reply (a unit test keeps it so).

The connection runs in ``prompt`` mode: every reply ends with ``"\\n> "``; before 3.2 each line
of a ``<<`` payload is first acknowledged with a ``"+ "`` continuation prompt.

The public API, by section:

* framing: :class:`Command` (``.encode()``), :func:`encode`, :class:`ReplySplitter`,
  :func:`shown` (a command fit for a log), ``PROMPT``, ``DEFAULT_BUFSIZE``, ``LOCKED``;
* session: :func:`prompt`; :func:`show_info` -> :func:`parse_show_info`, :func:`parse_identity`
  (:class:`Identity`); :func:`show_build` (parsed in runtime/build.py); :func:`master_reload`;
* certificates: :func:`show_certs` -> :func:`parse_show_ssl_cert` (:class:`CertList`);
  :func:`show_cert` -> :func:`parse_cert_details` (:class:`CertDetails`);
  :func:`new_cert` -> :func:`check_new_cert`; :func:`set_cert`, :func:`set_cert_ocsp`
  -> :func:`check_set_cert`; :func:`commit_cert` -> :func:`check_commit_cert`;
  :func:`abort_cert` -> :func:`check_abort_cert`; :func:`set_ocsp_response` ->
  :func:`check_set_ocsp`; :class:`Transaction` (set [+ OCSP], commit, abort, and the
  judgement of their replies: the one implementation of a certificate transaction);
* crt-lists: :func:`show_crtlists` -> :func:`parse_show_crtlists`; :func:`show_crtlist`
  -> :func:`parse_show_crtlist`; :func:`add_crtlist` -> :func:`check_add_crtlist`;
* the usage table's marks (fe_sni's stick table: ``gpt0`` = the slot of a loaded host):
  :func:`set_mark` -> :func:`check_set_mark`; :func:`unmark` -> :func:`check_unmark`;
  :func:`clear_entry` -> :func:`check_clear_table`; :func:`show_entry`,
  :func:`show_marked` -> :func:`parse_show_table` (:class:`TableEntry`), :func:`is_table_dump`;
* ticket keys: :func:`show_tls_keys` -> :func:`parse_show_tls_keys`; :func:`set_tls_key`
  -> :func:`check_set_tls_key`;
* maps (no longer used by the agent; measured by the bench): :func:`check_empty`,
  :func:`check_del_map`, :func:`parse_show_map`.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Sequence
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


# --- session ----------------------------------------------------------------------


def prompt() -> Command:
    """Switch the connection to prompt mode (its reply is the first, empty, prompt)."""
    return Command(("prompt",))


def show_info() -> Command:
    return Command(("show", "info"))


def show_build(dev: bool) -> Command:
    """``show dev`` (3.0+: ``haproxy -vv``'s lines) or ``show libs`` (the executable first)."""
    return Command(("show", "dev" if dev else "libs"))


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
class Identity:
    """Which HAProxy process a connection talks to; changes on reload and restart."""

    pid: int
    start_time: int
    version: str


def parse_identity(reply: str) -> Identity:
    """The :class:`Identity` in a ``show info`` reply."""
    info = parse_show_info(reply)
    try:
        return Identity(
            int(info["Pid"]), int(info.get("Start_time_sec", "0")), info.get("Version", "?")
        )
    except ValueError as exc:
        raise HAProxyError(f"unexpected 'show info' values: Pid={info.get('Pid')!r}") from exc


def master_reload() -> Command:
    """``reload`` on HAProxy's master CLI (``haproxy -S``), not the workers' runtime API.

    HAProxy 2.6's master re-executes itself; what it writes back before the
    connection closes is not an answer to check.
    """
    return Command(("reload",))


# --- certificates ---------------------------------------------------------------------


def show_certs() -> Command:
    """``show ssl cert``: every certificate name, and the open transaction (O(K) reply)."""
    return Command(("show", "ssl", "cert"))


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


def show_cert(name: str) -> Command:
    return Command(("show", "ssl", "cert", name))


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


def new_cert(name: str) -> Command:
    """An empty certificate store called ``name`` (a slot HAProxy does not know yet)."""
    return Command(("new", "ssl", "cert", name))


def check_new_cert(cert: str, reply: str) -> None:
    if reply != f"New empty certificate store '{cert}'!":
        raise _fail(f"new ssl cert {cert}", reply)


def set_cert(name: str, pem: bytes) -> Command:
    """Open (or update) the transaction of ``name`` with a normalised PEM bundle."""
    return Command(("set", "ssl", "cert", name), pem)


def set_cert_ocsp(name: str, der: bytes) -> Command:
    """Put an OCSP response (DER) into the transaction of ``name``; stapled from the commit."""
    return Command(("set", "ssl", "cert", f"{name}.ocsp"), base64.b64encode(der) + b"\n")


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


def commit_cert(name: str) -> Command:
    return Command(("commit", "ssl", "cert", name))


def check_commit_cert(cert: str, reply: str) -> None:
    lines = reply.splitlines()
    if not lines or not lines[0].startswith("Committing "):
        raise _fail(f"commit ssl cert {cert}", reply)
    # One '.' per crt-list instance updated follows the name: "Committing <name>..".
    if lines[0].rstrip(".") != f"Committing {cert}":
        raise WrongTransaction(f"commit ssl cert {cert} committed {lines[0][11:]!r}")
    if lines[-1] != "Success!":
        raise _fail(f"commit ssl cert {cert}", reply)


def abort_cert(name: str) -> Command:
    return Command(("abort", "ssl", "cert", name))


def check_abort_cert(cert: str, reply: str) -> None:
    if reply != f"Transaction aborted for certificate '{cert}'!":
        raise _fail(f"abort ssl cert {cert}", reply)


@dataclass(frozen=True)
class Transaction:
    """One certificate transaction: ``set`` [+ ``set .ocsp``], ``commit``, ``abort``.

    Sent whole in one write.  The trailing ``abort`` closes the transaction of
    a failed commit (after a good one it answers "No ongoing transaction!",
    which is not checked), so no transaction is ever left open for the next
    ``set`` to merge into (the 2.6.12 merge: docs/haproxy.md).  A ``set`` that
    lands in another certificate's transaction is caught by its reply, and the
    ``commit`` and ``abort`` that follow it name our certificate, which HAProxy
    refuses for a transaction about another one.

    ``pem`` None keeps the certificate and only staples ``ocsp`` (HAProxy sets
    stapling up at a commit).
    """

    name: str
    pem: bytes | None
    ocsp: bytes | None = None

    def __post_init__(self) -> None:
        if self.pem is None and self.ocsp is None:
            raise ValueError("a transaction needs a certificate or an OCSP response")

    def commands(self) -> list[Command]:
        commands = [] if self.pem is None else [set_cert(self.name, self.pem)]
        if self.ocsp is not None:
            commands.append(set_cert_ocsp(self.name, self.ocsp))
        return [*commands, commit_cert(self.name), abort_cert(self.name)]

    @property
    def size(self) -> int:
        """How many commands (and replies) the transaction has."""
        return (self.pem is not None) + (self.ocsp is not None) + 2

    def check(self, replies: Sequence[str]) -> None:
        """Judge the replies to :meth:`commands` (exactly :attr:`size` of them).

        Raises WrongTransaction (another writer's transaction showed up),
        Locked (retry later) or CommandFailed for the first reply that failed.
        """
        if len(replies) != self.size:
            raise ValueError(f"{len(replies)} replies for {self.size} commands")
        *sets, commit, _abort = replies
        for reply in sets:
            check_set_cert(self.name, reply)
        check_commit_cert(self.name, commit)


def set_ocsp_response(der: bytes) -> Command:
    """A fresh OCSP response for a certificate HAProxy already staples (found by its CertID)."""
    return Command(("set", "ssl", "ocsp-response"), base64.b64encode(der) + b"\n")


def check_set_ocsp(reply: str) -> None:
    """``set ssl ocsp-response``: refused when no loaded certificate has its CertID."""
    if reply != "OCSP Response updated!":
        raise CommandFailed("set ssl ocsp-response <response>", reply)


# --- crt-lists ------------------------------------------------------------------------


def show_crtlists() -> Command:
    """``show ssl crt-list``: the crt-lists of HAProxy's configuration."""
    return Command(("show", "ssl", "crt-list"))


def parse_show_crtlists(reply: str) -> tuple[str, ...]:
    return tuple(line for line in reply.splitlines() if line and not line.startswith("#"))


def show_crtlist(crtlist: str) -> Command:
    """``show ssl crt-list <list>``: its lines (O(K) reply)."""
    return Command(("show", "ssl", "crt-list", crtlist))


def parse_show_crtlist(reply: str) -> tuple[str, ...]:
    """``show ssl crt-list <list>``: the certificate of each line (options ignored)."""
    entries = []
    for line in reply.splitlines():
        if not line or line.startswith("#"):
            continue
        entries.append(line.split(" ", 1)[0])
    return tuple(entries)


def add_crtlist(crtlist: str, name: str) -> Command:
    """A crt-list line for certificate ``name`` (refused while its store is empty)."""
    return Command(("add", "ssl", "crt-list", crtlist, name))


def check_add_crtlist(crtlist: str, cert: str, reply: str) -> None:
    # One '.' per bind using the crt-list follows: "... in crt-list '<l>'.."
    expected = f"Inserting certificate '{cert}' in crt-list '{crtlist}'"
    lines = reply.splitlines()
    if len(lines) != 2 or lines[0].rstrip(".") != expected or lines[1] != "Success!":
        raise _fail(f"add ssl crt-list {crtlist} {cert}", reply)


# --- the usage table: marks of loaded hosts ----------------------------------------------


def set_mark(table: str, host: str, number: int) -> Command:
    """Mark ``host`` loaded in slot ``number`` (0: not loaded); its connections skip the agent."""
    return Command(("set", "table", table, "key", host, "data.gpt0", str(number)))


def check_set_mark(reply: str) -> None:
    check_empty("set table", reply)


def clear_entry(table: str, host: str) -> Command:
    """Drop ``host``'s entry (refused while a connection tracks it: :func:`check_clear_table`)."""
    return Command(("clear", "table", table, "key", host))


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


def unmark(table: str, host: str) -> list[Command]:
    """Mark ``host`` not loaded, then drop its entry (refused while a connection tracks it)."""
    return [set_mark(table, host, 0), clear_entry(table, host)]


def check_unmark(replies: Iterator[str]) -> None:
    """The two replies of :func:`unmark`; an entry in use is fine (already neutral)."""
    check_set_mark(next(replies))
    check_clear_table("clear table", next(replies))


def show_entry(table: str, host: str) -> Command:
    """``show table <t> key <host>``: one entry (O(log K))."""
    return Command(("show", "table", table, "key", host))


def show_marked(table: str) -> Command:
    """Every host marked loaded (``gpt0`` > 0): O(K), for adoption and ``status``."""
    return Command(("show", "table", table, "data.gpt0", "gt", "0"))


def is_table_dump(table: str, reply: str) -> bool:
    """Whether ``reply`` to ``show table <table> ...`` is that table's dump (it exists)."""
    return reply.startswith(f"# table: {table},")


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


# --- TLS ticket keys -------------------------------------------------------------------

_TLS_KEY_ROW = re.compile(r"(\d+)\.(\d+) (\S+)\Z")
NO_TLS_KEYS_FILE = "unable to locate referenced filename"


def show_tls_keys(keys_file: str) -> Command:
    return Command(("show", "tls-keys", keys_file))


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


def set_tls_key(keys_file: str, key: str) -> Command:
    """Shift HAProxy's ring of ``keys_file`` by one: ``key`` becomes the next key.

    The key is a secret: log the command with :func:`shown` only.
    """
    return Command(("set", "ssl", "tls-key", keys_file, key))


def check_set_tls_key(keys_file: str, reply: str) -> None:
    """``set ssl tls-key <file> <key>``; the command named without its key (a secret)."""
    if reply != "TLS ticket key updated!":
        raise CommandFailed(f"set ssl tls-key {keys_file} <key>", reply)


# --- maps (the retired map file; the bench still measures them) ----------------------------


def check_empty(command: str, reply: str) -> None:
    """``add map``, ``set map``, ``clear map``, ``set table`` answer nothing on success."""
    if reply:
        raise _fail(command, reply)


def check_del_map(command: str, reply: str) -> bool:
    """True if the key was deleted, False if it was not there."""
    if reply == "":
        return True
    if reply == "Key not found.":
        return False
    raise _fail(command, reply)


def parse_show_map(reply: str) -> list[tuple[str, str]]:
    """``show map <map>``: ``0x55..: key value`` or ``0x55.. key value`` lines."""
    rows = []
    for line in reply.splitlines():
        parts = line.split(" ", 2)
        if len(parts) != 3 or not parts[0].startswith("0x"):
            continue
        rows.append((parts[1], parts[2]))
    return rows
