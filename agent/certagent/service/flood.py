"""Keeping floods of made-up names cheap: a lookup budget and one log line per interval.

The name filter (:mod:`certagent.service.namefilter`) turns away names the
store certainly lacks.  What it admits still goes through :class:`LookupBudget`,
a token bucket that bounds store lookups per second (a burst as large as a
storm of real new hosts goes through at once); while the filter is not ready
(before the agent has loaded or built it) a second, smaller one
(:data:`UNFILTERED_RATE`) applies too.  Names the store does not have
are reported by :class:`UnknownNames` as one INFO line per interval with a
count and a few examples, not one line each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Store lookups per second while the name filter is not ready (at start, during a rebuild
#: after a lost change feed): a flood from the agent's first second reaches the store no more.
UNFILTERED_RATE = 50.0
#: Seconds between two summaries of names not in the store.
INTERVAL = 10.0
EXAMPLES = 3


class LookupBudget:
    """A token bucket: ``rate`` lookups a second on average, ``burst`` at once."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        """Spend one token if there is one; O(1)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class UnknownNames:
    """Counts names the store lacks and logs them as one line per ``interval``."""

    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._since = clock()
        self._filtered = 0
        self._looked_up = 0
        self._examples: list[str] = []

    def note(self, name: str, *, looked_up: bool) -> None:
        if looked_up:
            self._looked_up += 1
        else:
            self._filtered += 1
        if len(self._examples) < EXAMPLES:
            self._examples.append(name)
        if self._clock() - self._since >= self.interval:
            self.flush()

    def flush(self) -> None:
        """Write the summary now (also at shutdown), if there is anything to say."""
        count = self._filtered + self._looked_up
        if count:
            log.info(
                "%d names not in the store in the last %.0f s (%d turned away by the name"
                " filter, %d looked up), e.g. %s",
                count,
                self._clock() - self._since,
                self._filtered,
                self._looked_up,
                ", ".join(self._examples),
            )
        self._since = self._clock()
        self._filtered = self._looked_up = 0
        self._examples = []
