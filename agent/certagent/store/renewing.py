"""What every store's renewal schedule checks and computes the same way: pure functions.

The roles are :mod:`certagent.store.renewals`'; the Redis store, the directory
store and the in-memory ones (:mod:`certagent.store.localrenewals`) call these so
that an entry or a budget window reaches a key or a file only once validated,
and so that they cut time into the same fixed windows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from certagent.store.issuing import check_name, check_time
from certagent.store.renewals import BudgetWindow, DueRenewal

__all__ = [
    "MAX_DUE",
    "MAX_WINDOW",
    "check_due_limit",
    "check_entry",
    "check_windows",
    "format_time",
    "window_index",
    "window_wait",
]

#: Entries :meth:`~certagent.store.renewals.Renewals.due` returns per call at most.
MAX_DUE = 10_000
#: The longest budget window (seconds): a leap year.
MAX_WINDOW = 366 * 86_400.0

_KEY = re.compile(r"[A-Za-z0-9_.:*-]{1,200}\Z")


def check_entry(name: str, renew_at: float, not_after: float) -> DueRenewal:
    """A schedule entry with its name lowercased; ValueError (InvalidHostname) otherwise."""
    return DueRenewal(
        check_name(name),
        check_time(renew_at, "renew_at"),
        check_time(not_after, "not_after"),
    )


def check_due_limit(limit: int) -> int:
    """``limit`` if it is a page size :meth:`due` accepts: 1 to :data:`MAX_DUE`."""
    if not isinstance(limit, int) or not 1 <= limit <= MAX_DUE:
        raise ValueError(f"limit must be between 1 and {MAX_DUE}, not {limit!r}")
    return limit


def check_windows(windows: Sequence[BudgetWindow]) -> tuple[BudgetWindow, ...]:
    """``windows`` if each is valid and no (key, seconds) repeats; ValueError otherwise."""
    seen: set[tuple[str, float]] = set()
    for window in windows:
        if not isinstance(window.key, str) or not _KEY.match(window.key):
            raise ValueError(
                f"a budget key must be 1-200 of A-Z a-z 0-9 _ . : * -, not {str(window.key)[:40]!r}"
            )
        if not isinstance(window.limit, int) or window.limit < 0:
            raise ValueError(f"budget {window.key}: the limit must be 0 or more")
        seconds = window.seconds
        if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError(f"budget {window.key}: seconds must be a number")
        if not 0 < seconds <= MAX_WINDOW:
            raise ValueError(f"budget {window.key}: seconds must be in (0, {MAX_WINDOW:.0f}]")
        if (window.key, float(seconds)) in seen:
            raise ValueError(f"budget {window.key}: the same window is given twice")
        seen.add((window.key, float(seconds)))
    return tuple(windows)


def window_index(window: BudgetWindow, now: float) -> int:
    """Which fixed window of ``window.seconds`` ``now`` is in (windows start at 0 Unix)."""
    return math.floor(now / window.seconds)


def window_wait(window: BudgetWindow, now: float) -> float:
    """Seconds from ``now`` until the next window of ``window`` starts (> 0)."""
    return max((window_index(window, now) + 1) * window.seconds - now, 0.001)


def format_time(moment: float) -> str:
    """A time as stored in keys and files: an integer when whole, else Python's shortest repr."""
    return str(int(moment)) if moment == int(moment) else repr(float(moment))
