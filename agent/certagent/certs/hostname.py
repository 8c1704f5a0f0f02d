"""Hostname validation: the only gate between network bytes and HAProxy commands.

A hostname reaches a runtime-API command, a map key, a Redis key or a file path
only after :func:`normalise` accepted it.  Accepted names are lowercase LDH
labels (letters, digits, hyphen; no leading or trailing hyphen), 1-63 characters
each, at least two labels, 253 characters in all, no trailing dot, and a last
label that starts with a letter, as every top-level domain does: ``192.0.2.1``
is an IP address, never a hostname, so it is refused as an SNI and as a DNS
name in a certificate.
"""

from __future__ import annotations

import re

from certagent.errors import InvalidHostname

MAX_LENGTH = 253
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


def normalise(raw: str | bytes) -> str:
    """Return ``raw`` lowercased if it is a valid hostname, else raise InvalidHostname."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise InvalidHostname("hostname is not ASCII") from exc
    if not raw:
        raise InvalidHostname("hostname is empty")
    if len(raw) > MAX_LENGTH:
        raise InvalidHostname(f"hostname is longer than {MAX_LENGTH} characters")
    name = raw.lower()
    labels = name.split(".")
    if len(labels) < 2:
        raise InvalidHostname("hostname needs at least two labels")
    for label in labels:
        if not _LABEL.match(label):
            raise InvalidHostname(f"hostname label {label[:63]!r} is not letters, digits, hyphens")
    if labels[-1].isdigit():
        raise InvalidHostname(f"{name[:80]!r} is an IP address, not a hostname")
    if not labels[-1][0].isalpha():
        raise InvalidHostname(
            f"{name[:80]!r}: the top-level label {labels[-1]!r} must start with a letter"
        )
    return name


def is_valid(raw: str | bytes) -> bool:
    try:
        normalise(raw)
    except InvalidHostname:
        return False
    return True


def normalise_pattern(raw: str) -> str:
    """Validate a certificate name: a hostname or a ``*.`` wildcard over at least two labels."""
    if raw.startswith("*."):
        rest = normalise(raw[2:])
        return "*." + rest
    return normalise(raw)


def wildcard_for(name: str) -> str | None:
    """The one-label wildcard that may cover ``name``: ``a.example.com`` -> ``*.example.com``.

    ``None`` when the parent has fewer than two labels (``*.com`` is never looked up).
    """
    _, _, parent = name.partition(".")
    if parent.count(".") < 1:
        return None
    return "*." + parent


def covers(pattern: str, name: str) -> bool:
    """True if certificate name ``pattern`` is valid for ``name`` (one-label wildcard only)."""
    if pattern == name:
        return True
    return pattern.startswith("*.") and wildcard_for(name) == pattern
