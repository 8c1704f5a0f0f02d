"""Time for the ACME client: a clock seam, ``Retry-After`` parsing and the polling schedule.

Tests pass their own :class:`Clock` instead of patching ``time``.  Nothing here
does I/O except :meth:`Clock.sleep`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from time import monotonic, time

#: Retry-After values are clamped to this (a week): a CA asking for more is treated
#: as asking for a week, and garbage never turns into a sleep of years.
MAX_RETRY_AFTER = 7 * 24 * 3600.0
#: The first poll of an authorization or order comes this soon (pebble validates
#: in milliseconds; a real CA in hundreds of them) ...
FIRST_POLL = 0.1
#: ... and later polls back off by this factor up to :data:`MAX_POLL`.
POLL_FACTOR = 1.5
MAX_POLL = 2.0


@dataclass(frozen=True)
class Clock:
    """Wall time (for HTTP dates), monotonic time (for deadlines) and sleeping."""

    time: Callable[[], float] = time
    monotonic: Callable[[], float] = monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 §10.2.3), or None.

    Accepts delay-seconds (``120``) and an HTTP date (``Wed, 21 Oct 2026 07:28:00
    GMT``, relative to ``now``, a Unix time).  A date in the past gives 0; values are
    clamped to :data:`MAX_RETRY_AFTER`; anything unparseable gives None.
    """
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 64:
        return None
    if text.isascii() and text.isdigit():
        return min(float(int(text[:12])), MAX_RETRY_AFTER)
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000" (RFC 5322: no zone information): read as UTC
        moment = moment.replace(tzinfo=dt.UTC)
    return min(max(0.0, moment.timestamp() - now), MAX_RETRY_AFTER)


def poll_delays(
    first: float = FIRST_POLL, factor: float = POLL_FACTOR, cap: float = MAX_POLL
) -> Iterator[float]:
    """0.1, 0.15, 0.225 ... seconds, capped at 2 s: the wait before each poll."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * factor)
