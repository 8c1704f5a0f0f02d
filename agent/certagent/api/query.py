"""The query of ``GET /v1/certificates``, checked exactly as the OpenAPI document states it.

The ``pattern`` and the bounds of each parameter in ``openapi.json`` are the
constants here (a unit test compares them): a value the document allows is
taken, any other is a 400.  The patterns use only what ECMA 262 and Python's
``re`` read alike, and are matched whole (``re.fullmatch``, so a trailing
newline never slips past ``$``).  Cursors are opaque: the store tells which it
handed out.  Each parameter may appear once.  Cost: one regex match per
parameter, O(length of the query).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from multidict import MultiMapping

from certagent.certs import hostname
from certagent.errors import InvalidCursor, InvalidHostname

from .problems import BadRequest

__all__ = [
    "CURSOR_MAX",
    "DEFAULT_LIMIT",
    "EXPIRING_BEFORE_PATTERN",
    "LIST_PARAMS",
    "MAX_LIMIT",
    "NAME_MAX",
    "NAME_PATTERN",
    "ListQuery",
    "parse_list_query",
]

LIST_PARAMS = ("name", "expiring_before", "cursor", "limit")
MAX_LIMIT = 500
DEFAULT_LIMIT = 100

_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: A hostname or a one-label wildcard, any case (``hostname.normalise_pattern``'s rules):
#: the last label starts with a letter (``192.0.2.1`` is an IP address).
_TOP = "[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
NAME_PATTERN = rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*\.{_TOP}$"
NAME_MAX = hostname.MAX_LENGTH

_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_LEAP_DAY = (
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29"
)
_TIME = (
    "T(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\\.[0-9]{1,9})?)?"
    "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?"
)
#: A calendar date, or a date and time (seconds, fraction and offset optional; no offset: UTC).
EXPIRING_BEFORE_PATTERN = f"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_DAY})(?:{_TIME})?$"

#: Cursors are opaque: the store decides which it handed out (InvalidCursor for others).
CURSOR_MAX = 400

_NAME = re.compile(NAME_PATTERN)
_EXPIRING_BEFORE = re.compile(EXPIRING_BEFORE_PATTERN)
_LIMIT = re.compile("[1-9][0-9]{0,2}")  # an integer as the document's serialization writes it


@dataclass(frozen=True)
class ListQuery:
    name: str | None = None
    expiring_before: datetime | None = None
    cursor: str | None = None
    limit: int = DEFAULT_LIMIT


def parse_list_query(query: MultiMapping[str]) -> ListQuery:
    """The list filters in ``query``; BadRequest, InvalidHostname or InvalidCursor if one is off."""
    unknown = sorted(set(query) - set(LIST_PARAMS))
    if unknown:
        raise BadRequest(
            f"unknown query parameter {', '.join(repr(k[:40]) for k in unknown[:5])};"
            f" known: {', '.join(LIST_PARAMS)}"
        )
    repeated = [k for k in LIST_PARAMS if len(query.getall(k, ())) > 1]
    if repeated:
        raise BadRequest(f"query parameter {repeated[0]} is given more than once")
    name = query.get("name")
    expiring_before = query.get("expiring_before")
    cursor = query.get("cursor")
    return ListQuery(
        name=None if name is None else _parse_name(name),
        expiring_before=None if expiring_before is None else _parse_time(expiring_before),
        cursor=_parse_cursor(cursor) if cursor else None,
        limit=_parse_limit(query.get("limit")),
    )


def _parse_name(value: str) -> str:
    if len(value) > NAME_MAX or not _NAME.fullmatch(value):
        try:
            hostname.normalise_pattern(value)  # for its precise message
        except InvalidHostname as exc:
            raise InvalidHostname(f"name: {exc}") from exc
        raise InvalidHostname(f"name: longer than {NAME_MAX} characters")
    return hostname.normalise_pattern(value.lower())


def _parse_time(value: str) -> datetime:
    if not _EXPIRING_BEFORE.fullmatch(value):
        raise BadRequest(
            f"expiring_before {value[:40]!r} is not a date or an ISO 8601 time,"
            " e.g. 2030-01-31 or 2030-01-31T00:00:00Z"
        )
    moment = datetime.fromisoformat(value)  # the pattern admits only what this reads
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _parse_cursor(value: str) -> str:
    if len(value) > CURSOR_MAX:
        raise InvalidCursor("the cursor is not one this store handed out; list from the start")
    return value


def _parse_limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if not _LIMIT.fullmatch(value) or not 1 <= int(value) <= MAX_LIMIT:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {value[:20]!r}")
    return int(value)
