"""What a token may do: its scopes, the names it may touch, its expiry, its rate, its client.

A line of the tokens file (:mod:`certagent.api.auth`) is ``name:sha256hex``, then
optional ``key=value`` attributes separated by spaces::

    deploy:5e88…42d8
    panel:9f86…0f00 scopes=domains,read names=*.customer.test expires=2026-07-01T00:00:00Z rate=5/s
    ci:- scopes=certificates,read names=.example.com subject=CN=ci,O=Example

A line without attributes is what every token was before scopes existed: ``admin``
on every name, no expiry, no rate (:data:`EVERYTHING`); such a line is written
exactly as before, so older agents still read it.  A line with attributes is one
an older agent refuses (its hash is not 64 hex digits): a scoped token never
becomes an admin token by being read by a version that does not know scopes.
For the same reason an unknown attribute makes the line (and the file) invalid
here too, instead of being ignored.

Scopes (:class:`Scope`): ``read`` (every GET), ``certificates`` (upload, rotate,
delete certificates, staple OCSP responses), ``domains`` (register and remove
names), ``renewals`` (opt certificates into renewal), ``admin`` (all of them).

Name patterns (:class:`NamePattern`): ``example.com`` (that name), ``*.example.com``
(one label under it, as a TLS wildcard covers), ``.example.com`` (the domain and
every name under it, at any depth).  A certificate is allowed only if every one of
its names is.  Checking costs O(patterns x names) string comparisons.

Everything here is pure: no file, no clock (``now`` is a parameter).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from urllib.parse import quote, unquote

from certagent.certs import hostname
from certagent.errors import ConfigError, InvalidHostname

__all__ = [
    "EVERYTHING",
    "Grant",
    "NamePattern",
    "Rate",
    "Scope",
    "make_grant",
    "parse_attributes",
    "parse_duration",
    "parse_rate",
]


class Scope(StrEnum):
    READ = "read"
    CERTIFICATES = "certificates"
    DOMAINS = "domains"
    RENEWALS = "renewals"
    ADMIN = "admin"


_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"([0-9]{1,6}(?:\.[0-9]{1,3})?)/([smh])\Z")
_KEYS = ("scopes", "names", "expires", "rate", "subject")
#: A subject is kept percent-encoded in the file: no space, '%' or '#' (a comment) in a value.
_SUBJECT_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%#")
_MAX_SUBJECT = 1024
_MAX_PATTERNS = 256


def parse_duration(raw: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d`` -> that long; ConfigError otherwise."""
    match = _DURATION.match(raw.strip())
    if match is None:
        raise ConfigError(
            f"duration {raw[:40]!r}: give a whole number and a unit: 90s, 15m, 12h or 30d"
        )
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True)
class Rate:
    """Requests a token may make, on average: ``10/s``, ``120/m``, ``0.5/s``."""

    count: float
    unit: str  # "s", "m" or "h"

    @property
    def per_second(self) -> float:
        return self.count / _UNITS[self.unit]

    @property
    def burst(self) -> float:
        """How many requests may come at once: one second's worth, at least one."""
        return max(1.0, self.per_second)

    def __str__(self) -> str:
        count = f"{self.count:g}"
        return f"{count}/{self.unit}"


def parse_rate(raw: str) -> Rate:
    """``N/s`` (or ``N/m``, ``N/h``); N a positive number. ConfigError otherwise."""
    match = _RATE.match(raw.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(
            f"rate {raw[:40]!r}: give requests per second as N/s (e.g. 10/s or 0.5/s),"
            " or per minute or hour as N/m, N/h"
        )
    return Rate(float(match.group(1)), match.group(2))


@dataclass(frozen=True)
class NamePattern:
    """``example.com``, ``*.example.com`` or ``.example.com`` (see the module's docstring)."""

    kind: str  # "exact", "wildcard" or "subtree"
    domain: str

    @classmethod
    def parse(cls, raw: str) -> NamePattern:
        """A pattern from ``raw`` (any case); ConfigError if it is none."""
        text = raw.strip().lower()
        kind, domain = "exact", text
        if text.startswith("*."):
            kind, domain = "wildcard", text[2:]
        elif text.startswith("."):
            kind, domain = "subtree", text[1:]
        try:
            return cls(kind, hostname.normalise(domain))
        except InvalidHostname as exc:
            raise ConfigError(
                f"name pattern {raw[:80]!r}: {exc}; use example.com, *.example.com (one label"
                " under it) or .example.com (it and every name under it)"
            ) from exc

    def covers(self, name: str) -> bool:
        """Whether ``name`` (a lowercase hostname, or a ``*.`` certificate name) is inside."""
        if self.kind == "exact":
            return name == self.domain
        if self.kind == "subtree":
            return name == self.domain or name.endswith("." + self.domain)
        head, _, rest = name.partition(".")
        return bool(head) and rest == self.domain  # one label, or the wildcard itself

    def __str__(self) -> str:
        return {"exact": "", "wildcard": "*.", "subtree": "."}[self.kind] + self.domain


@dataclass(frozen=True)
class Grant:
    """What one token may do; the default is what a line without attributes grants."""

    scopes: frozenset[Scope] = frozenset({Scope.ADMIN})
    #: () = every name
    patterns: tuple[NamePattern, ...] = ()
    expires: datetime | None = None
    rate: Rate | None = None
    #: a client certificate subject (RFC 4514) that authenticates as this token
    subject: str | None = field(default=None)

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    @property
    def limited(self) -> bool:
        """Whether the token is held to some names."""
        return bool(self.patterns)

    def allows_name(self, name: str) -> bool:
        return not self.patterns or any(p.covers(name) for p in self.patterns)

    def allows_names(self, names: Iterable[str]) -> bool:
        """Whether every one of ``names`` is inside the patterns (a certificate's test)."""
        return all(self.allows_name(name) for name in names)

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def attributes(self) -> str:
        """This grant as the file's attributes; "" for :data:`EVERYTHING` (the old format)."""
        parts = []
        if self.scopes != EVERYTHING.scopes:
            parts.append("scopes=" + ",".join(s.value for s in Scope if s in self.scopes))
        if self.patterns:
            parts.append("names=" + ",".join(str(p) for p in self.patterns))
        if self.expires is not None:
            parts.append("expires=" + _iso(self.expires))
        if self.rate is not None:
            parts.append(f"rate={self.rate}")
        if self.subject is not None:
            parts.append("subject=" + quote(self.subject, safe=_SUBJECT_SAFE))
        return " ".join(parts)

    def describe(self) -> dict[str, object]:
        """What ``certagent token ls --json`` prints (never a hash)."""
        return {
            "scopes": [s.value for s in Scope if s in self.scopes],
            "names": [str(p) for p in self.patterns],
            "expires": None if self.expires is None else _iso(self.expires),
            "rate": None if self.rate is None else str(self.rate),
            "subject": self.subject,
        }


EVERYTHING = Grant()


def make_grant(
    *,
    scopes: Iterable[str] = (),
    names: Iterable[str] = (),
    expires_in: str | None = None,
    rate: str | None = None,
    subject: str | None = None,
    now: datetime,
) -> Grant:
    """A grant from ``certagent token add``'s options (``now`` + ``expires_in`` = expiry)."""
    chosen = [_scope(s) for s in scopes]
    patterns = tuple(dict.fromkeys(NamePattern.parse(n) for n in names))
    return Grant(
        scopes=frozenset(chosen) if chosen else EVERYTHING.scopes,
        patterns=_bounded(patterns),
        expires=None if expires_in is None else _second(now + parse_duration(expires_in)),
        rate=None if rate is None else parse_rate(rate),
        subject=None if subject is None else _subject(subject),
    )


def parse_attributes(words: Iterable[str], where: str) -> Grant:
    """The grant of a line's ``key=value`` words; ConfigError naming ``where`` otherwise."""
    seen: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or key not in _KEYS:
            raise ConfigError(
                f"{where}: unknown attribute {word[:40]!r}; a token line takes"
                f" {', '.join(k + '=' for k in _KEYS)} (this certagent may be older than the"
                " one that wrote it)"
            )
        if key in seen:
            raise ConfigError(f"{where}: {key}= is given twice")
        seen[key] = value
    try:
        scopes = [_scope(s) for s in seen["scopes"].split(",")] if "scopes" in seen else []
        patterns = tuple(NamePattern.parse(p) for p in seen.get("names", "").split(",") if p)
        if "names" in seen and not patterns:
            raise ConfigError("names= lists no pattern")
        expires = _parse_time(seen["expires"]) if "expires" in seen else None
        rate = parse_rate(seen["rate"]) if "rate" in seen else None
        subject = _subject(unquote(seen["subject"])) if "subject" in seen else None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return Grant(
        scopes=frozenset(scopes) if scopes else EVERYTHING.scopes,
        patterns=_bounded(patterns),
        expires=expires,
        rate=rate,
        subject=subject,
    )


def _scope(raw: str) -> Scope:
    try:
        return Scope(raw.strip().lower())
    except ValueError as exc:
        raise ConfigError(f"scope {raw[:40]!r}: use {', '.join(s.value for s in Scope)}") from exc


def _bounded(patterns: tuple[NamePattern, ...]) -> tuple[NamePattern, ...]:
    if len(patterns) > _MAX_PATTERNS:
        raise ConfigError(f"a token takes at most {_MAX_PATTERNS} name patterns")
    return patterns


def _subject(raw: str) -> str:
    text = raw.strip()
    if not text or len(text) > _MAX_SUBJECT or not text.isprintable() or "=" not in text:
        raise ConfigError(
            f"client certificate subject {raw[:80]!r}: give it as RFC 4514 prints it, e.g."
            " CN=deploy,O=Example (`openssl x509 -noout -subject -nameopt RFC2253`)"
        )
    return text


def _parse_time(raw: str) -> datetime:
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise ConfigError(f"expires={raw[:40]!r} is not an ISO 8601 time") from exc
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _second(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole second (the file keeps whole seconds)."""
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + timedelta(seconds=1)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
