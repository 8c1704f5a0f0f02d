"""``certagent init --upgrade``: a generated haproxy.cfg brought up to this release, edits kept.

Pure functions on text, no I/O.  The file is "edit freely", so an upgrade rewrites only
what certagent owns and keeps the rest where it was:

* sections certagent owns whole: ``frontend fe_sni`` (its ``bind`` lines are the
  operator's address and are kept), ``backend be_certagent_tls``, ``frontend fe_http``;
* in ``global``, the directives certagent writes (:data:`GLOBAL_OWNED`: the runtime
  socket, the Lua action, buffer size, TLS defaults...); any other line of it is kept;
* in ``frontend fe_tls``, its ``mode``, ``bind`` (QUIC's too) and ``log-format`` lines and
  HTTP/3's usage tracking and Alt-Svc header (:data:`FE_TLS_OWNED`); the operator's routing
  rules and backends are kept;
* every other section (``defaults``, ``backend be_app``, the operator's own) as it is.

:func:`merge` returns the new text and what it did, section by section.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

__all__ = [
    "FE_TLS_OWNED",
    "GLOBAL_OWNED",
    "OWNED_SECTIONS",
    "Facts",
    "Merged",
    "Section",
    "facts",
    "merge",
    "sections",
]

#: Section keywords of haproxy.cfg (a line starting with one at column 0 opens a section).
_SECTION = re.compile(
    r"^(global|defaults|frontend|backend|listen|userlist|peers|resolvers|mailers|program"
    r"|http-errors|ring|cache|crt-store|traces|log-forward|acme)\b"
)
#: Sections an upgrade replaces whole.
OWNED_SECTIONS = ("frontend fe_sni", "backend be_certagent_tls", "frontend fe_http")
#: ``global`` directives certagent writes (the line's first words); conditional-block lines too.
GLOBAL_OWNED = (
    "log ",
    "user ",
    "group ",
    "stats socket ",
    "stats timeout ",
    "lua-load ",
    "lua-load-per-thread ",
    "tune.lua.",
    "tune.bufsize ",
    "tune.listener.multi-queue ",
    "tune.quic.",
    "limited-quic",
    "ssl-default-bind-",
    "ssl-default-server-",
    ".if ",
    ".elif ",
    ".else",
    ".endif",
)
#: ``fe_tls`` lines certagent writes.
FE_TLS_OWNED = (
    "mode ",
    "bind ",
    "log-format ",
    # HTTP/3 (init --http3): QUIC connections counted in fe_sni's table, the Alt-Svc header
    "tcp-request session track-sc0 ssl_fc_sni,lower table fe_sni ",
    "http-after-response set-header alt-svc ",
)
_KEPT_NOTE = "    # kept from the earlier haproxy.cfg by `certagent init --upgrade`"


@dataclass(frozen=True)
class Section:
    """One section: its header line (``""`` for what precedes the first) and its lines."""

    header: str
    lines: tuple[str, ...]

    @property
    def name(self) -> str:
        """``frontend fe_sni``, ``global``...: the header's first two words."""
        return " ".join(self.header.split()[:2])

    def text(self) -> list[str]:
        return [self.header, *self.lines] if self.header else list(self.lines)


@dataclass(frozen=True)
class Facts:
    """What an existing haproxy.cfg says that certagent.toml does not."""

    binds: tuple[str, ...]  # fe_sni's bind lines, as written
    log_target: str | None  # global's first ``log`` target (``stdout format raw``...)
    user: str | None
    default_cert: str | None  # fe_tls's ``crt`` file
    http_binds: tuple[str, ...]  # fe_http's bind lines


@dataclass
class Merged:
    """The upgraded text, and per section: rewritten, kept as it was, added or dropped."""

    text: str
    rewritten: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    operator_lines: list[str] = field(default_factory=list)  # kept inside owned sections

    def diff(self, old: str, path: str) -> str:
        return "".join(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                self.text.splitlines(keepends=True),
                f"{path} (before)",
                f"{path} (upgraded)",
            )
        )


def sections(text: str) -> list[Section]:
    """``text`` cut into sections, in order; the lines before the first one are the first."""
    out: list[Section] = []
    header, lines = "", list[str]()
    for line in text.splitlines():
        if _SECTION.match(line):
            if header or lines:
                out.append(Section(header, tuple(lines)))
            header, lines = line, []
        else:
            lines.append(line)
    if header or lines:
        out.append(Section(header, tuple(lines)))
    return out


def _directive(line: str) -> str:
    return line.strip()


def facts(text: str) -> Facts:
    """:class:`Facts` of an existing haproxy.cfg (of any release)."""
    by_name = {s.name: s for s in sections(text)}

    def directives(name: str, prefix: str) -> list[str]:
        section = by_name.get(name)
        if section is None:
            return []
        return [_directive(line) for line in section.lines if _directive(line).startswith(prefix)]

    logs = directives("global", "log ")
    log_target = None
    if logs:
        words = logs[0].split()[1:]
        cut = words.index("local0") if "local0" in words else len(words)
        log_target = " ".join(words[:cut]) or None
    users = directives("global", "user ")
    crt = None
    for bind in directives("frontend fe_tls", "bind "):
        words = bind.split()
        if "crt" in words and words.index("crt") + 1 < len(words):
            crt = words[words.index("crt") + 1]
            break
    return Facts(
        binds=tuple(directives("frontend fe_sni", "bind ")),
        log_target=log_target,
        user=users[0].split()[1] if users and len(users[0].split()) > 1 else None,
        default_cert=crt,
        http_binds=tuple(directives("frontend fe_http", "bind ")),
    )


def merge(old: str, new: str) -> Merged:
    """``new`` (this release's rendering of the same setup) with what the operator kept
    from ``old`` (see the module docstring)."""
    old_sections = {s.name: s for s in sections(old)}
    out: list[str] = []
    merged = Merged("")
    placed: set[str] = set()
    for section in sections(new):
        name = section.name
        before = old_sections.get(name)
        placed.add(name)
        if not section.header:  # the file's head comment: this release's
            out += section.text()
            continue
        if before is None:
            result = section
            if name not in ("backend be_app",):
                merged.added.append(name)
        elif name in OWNED_SECTIONS:
            result = _keep_binds(section, before) if name == "frontend fe_sni" else section
        elif name == "global":
            result = _merge_lines(section, before, GLOBAL_OWNED, merged)
        elif name == "frontend fe_tls":
            result = _merge_lines(_operator_default(section, before), before, FE_TLS_OWNED, merged)
        else:
            result = before  # defaults, be_app: the operator's
        if before is not None:
            if result.text() == before.text():
                merged.kept.append(name)
            else:
                merged.rewritten.append(name)
        out += result.text()
    for section in sections(old):  # the operator's own sections, in their order
        if section.header and section.name not in placed:
            out += section.text()
            merged.kept.append(section.name)
    merged.text = "\n".join(out).rstrip("\n") + "\n"
    return merged


def _keep_binds(new: Section, old: Section) -> Section:
    """fe_sni as rendered, with the old file's ``bind`` lines (the operator's addresses)."""
    binds = [line for line in old.lines if _directive(line).startswith("bind ")]
    if not binds:
        return new
    lines: list[str] = []
    for line in new.lines:
        if _directive(line).startswith("bind "):
            lines += binds
            binds = []
        else:
            lines.append(line)
    return Section(new.header, tuple(lines))


def _operator_default(new: Section, old: Section) -> Section:
    """fe_tls as rendered, without its ``default_backend`` if the old file names one (the
    operator's routing: theirs is kept instead)."""

    def defaults(section: Section) -> list[str]:
        return [
            _directive(x) for x in section.lines if _directive(x).startswith("default_backend ")
        ]

    if not defaults(old) or defaults(old) == defaults(new):
        return new
    lines = tuple(line for line in new.lines if not _directive(line).startswith("default_backend "))
    return Section(new.header, lines)


def _merge_lines(new: Section, old: Section, owned: tuple[str, ...], merged: Merged) -> Section:
    """``new``'s lines, then the lines of ``old`` that certagent does not own (its comments
    only if ``new`` lacks them), under a note; blank lines at the end of ``new`` stay last."""
    known = {_directive(line) for line in new.lines} | {_directive(_KEPT_NOTE)}
    kept = [
        line
        for line in old.lines
        if _directive(line)
        and not _directive(line).startswith(owned)
        and _directive(line) not in known
    ]
    if not kept:
        return new
    merged.operator_lines += [f"{new.name}: {_directive(line)}" for line in kept]
    lines = list(new.lines)
    tail: list[str] = []
    while lines and not lines[-1].strip():
        tail.insert(0, lines.pop())
    return Section(new.header, (*lines, _KEPT_NOTE, *kept, *tail))
