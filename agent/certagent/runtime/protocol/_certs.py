"""Certificates: listing them, one transaction (set, commit, abort), OCSP responses."""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass

from certagent.errors import (
    CommandFailed,
    HAProxyError,
    WrongTransaction,
)
from certagent.runtime.protocol._framing import (
    Command,
    _fail,
)


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
