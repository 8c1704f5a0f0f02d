"""Reading JSON documents from an ACME CA as hostile input: types, lengths and formats checked.

A :class:`Doc` wraps one decoded JSON object and hands out typed fields; anything
missing, of the wrong type, too long or malformed raises
:class:`~certagent.acme.errors.AcmeProtocolError` naming the document and field.
Unknown fields are ignored (RFC 8555 lets CAs add them).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from certagent.acme.errors import AcmeProtocolError

T = TypeVar("T")

#: The largest JSON document or certificate chain accepted from a CA.
MAX_BODY = 1 << 20
MAX_URL = 2048
MAX_TEXT = 1000
#: Most entries a list in a CA's document may have (identifiers, authorizations ...).
MAX_ITEMS = 1000

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})\Z"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def load_object(body: bytes, what: str) -> Doc:
    """Decode ``body`` as one JSON object; AcmeProtocolError if it is anything else."""
    if len(body) > MAX_BODY:
        raise AcmeProtocolError(f"the CA's {what} is larger than {MAX_BODY} bytes")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise AcmeProtocolError(f"the CA's {what} is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise AcmeProtocolError(f"the CA's {what} is not a JSON object")
    return Doc(value, what)


def clean_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` without control characters (log-safe), cut to ``limit`` characters."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_url(value: str, *, https_only: bool = True) -> str:
    """An absolute https URL (http too with ``https_only=False``), else ValueError."""
    if len(value) > MAX_URL or _CONTROL.search(value) or " " in value:
        raise ValueError("not a URL")
    parts = urlsplit(value)
    allowed = ("https",) if https_only else ("https", "http")
    if parts.scheme not in allowed or not parts.hostname:
        raise ValueError(f"not an {' or '.join(allowed)} URL")
    return value


def parse_time(value: str) -> dt.datetime:
    """An RFC 3339 timestamp as an aware UTC datetime (fractions beyond µs dropped)."""
    match = _RFC3339.match(value)
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp: {value[:40]!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    micro = int((match.group(7) or "0")[:6].ljust(6, "0"))
    zone = match.group(8)
    if zone in ("Z", "z"):
        tz = dt.UTC
    else:
        sign = 1 if zone[0] == "+" else -1
        offset = dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
        if offset >= dt.timedelta(hours=24):
            raise ValueError(f"bad UTC offset in {value[:40]!r}")
        tz = dt.timezone(sign * offset)
    moment = dt.datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz)
    return moment.astimezone(dt.UTC)


class Doc:
    """Typed access to one JSON object from the CA (see the module docstring)."""

    def __init__(self, value: dict[str, Any], what: str) -> None:
        self.value = value
        self.what = what

    def fail(self, key: str, problem: str) -> AcmeProtocolError:
        return AcmeProtocolError(f"the CA's {self.what}: {key!r} {problem}")

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    def _get(self, key: str, kind: type[T], required: bool, kind_name: str) -> T | None:
        value = self.value.get(key)
        if value is None:
            if required:
                raise self.fail(key, "is missing")
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"is not {kind_name}")
        return value

    def text(self, key: str, *, required: bool = True, limit: int = MAX_URL) -> str | None:
        value = self._get(key, str, required, "a string")
        if value is not None and len(value) > limit:
            raise self.fail(key, f"is longer than {limit} characters")
        return value

    def required_text(self, key: str, *, limit: int = MAX_URL) -> str:
        value = self.text(key, limit=limit)
        assert value is not None
        return value

    def choice(self, key: str, choices: tuple[T, ...]) -> T:
        value = self.required_text(key, limit=64)
        for choice in choices:
            if value == choice:
                return choice
        known = ", ".join(map(str, choices))
        raise self.fail(key, f"is {clean_text(value, 40)!r}, not one of {known}")

    def flag(self, key: str) -> bool | None:
        return self._get(key, bool, False, "true or false")

    def integer(self, key: str) -> int | None:
        return self._get(key, int, False, "an integer")

    def url(self, key: str, *, https_only: bool, required: bool = True) -> str | None:
        value = self.text(key, required=required)
        if value is None:
            return None
        try:
            return check_url(value, https_only=https_only)
        except ValueError as exc:
            raise self.fail(key, f"is {exc}") from exc

    def required_url(self, key: str, *, https_only: bool) -> str:
        value = self.url(key, https_only=https_only)
        assert value is not None
        return value

    def time(self, key: str, *, required: bool = False) -> dt.datetime | None:
        value = self.text(key, required=required, limit=64)
        if value is None:
            return None
        try:
            return parse_time(value)
        except ValueError as exc:
            raise self.fail(key, f"is {exc}") from exc

    def doc(self, key: str, *, required: bool = False) -> Doc | None:
        value = self._get(key, dict, required, "an object")
        return None if value is None else Doc(value, f"{self.what} {key}")

    def items(
        self,
        key: str,
        read: Callable[[Any, str], T],
        *,
        required: bool = False,
        limit: int = MAX_ITEMS,
    ) -> tuple[T, ...]:
        """Each element of list ``key`` read with ``read(element, label)``."""
        value = self._get(key, list, required, "a list")
        if value is None:
            return ()
        if len(value) > limit:
            raise self.fail(key, f"has more than {limit} entries")
        return tuple(read(item, f"{self.what} {key}[{i}]") for i, item in enumerate(value))
