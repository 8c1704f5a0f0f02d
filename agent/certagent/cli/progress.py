"""What ``certagent cert import`` shows while it runs, on stderr.

On a terminal, one bar redrawn in place (count, percent, rate, ETA) at most
:data:`TTY_INTERVAL` apart; anywhere else (a pipe, a file, CI logs), a plain
line at most every :data:`LINE_INTERVAL` seconds, so a 100,000-file import
writes a few dozen lines, not 100,000.  The final summary is the caller's.
Each update costs O(1): a clock read, and a write only when one is due.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol, TextIO

__all__ = ["LINE_INTERVAL", "TTY_INTERVAL", "Counts", "Progress"]

#: Seconds between two redraws of the bar on a terminal (at most 10 a second).
TTY_INTERVAL = 0.1
#: Seconds between two progress lines when stderr is not a terminal.
LINE_INTERVAL = 5.0
_BAR = 24
_CLEAR = "\033[K"  # erase to the end of the line


class Counts(Protocol):
    """The running totals of an import (:class:`~certagent.cli.importer.ImportResult`)."""

    total: int
    added: int
    existing: int
    failed: int

    @property
    def done(self) -> int: ...


class Progress:
    """Progress of one import on ``out``; ``None`` shows nothing.

    ``tty`` defaults to ``out.isatty()``; ``interval`` to :data:`TTY_INTERVAL`
    or :data:`LINE_INTERVAL`; ``clock`` is the seam tests move time with.
    """

    def __init__(
        self,
        out: TextIO | None,
        *,
        tty: bool | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.tty = bool(out is not None and out.isatty()) if tty is None else tty
        if interval is None:
            interval = TTY_INTERVAL if self.tty else LINE_INTERVAL
        self.interval = interval
        self.clock = clock
        self.counts: Counts | None = None
        self.start = 0.0
        self.shown = 0.0
        self.drawn = False  # a bar is on the current line

    def begin(self, counts: Counts) -> None:
        """Start timing ``counts`` (its ``total`` known)."""
        self.counts = counts
        self.start = self.shown = self.clock()

    def update(self) -> None:
        """The counts changed: redraw the bar or write a line if one is due."""
        if self.out is None or self.counts is None:
            return
        now = self.clock()
        if now - self.shown < self.interval:
            return
        self.shown = now
        if self.tty:
            self._draw(now)
        else:
            self.out.write(self.line(now) + "\n")
            self.out.flush()

    def report(self, label: str, error: Exception) -> None:
        """A file was refused: say so on its own line (under the bar, which comes back)."""
        if self.out is None:
            return
        code = getattr(error, "code", type(error).__name__)
        erase = "\r" + _CLEAR if self.drawn else ""
        self.out.write(f"{erase}skipped {label}: {code}: {error}\n")
        self.drawn = False
        if self.tty:
            self.shown = 0.0  # redraw at the next update

    def finish(self) -> None:
        """The import is over: on a terminal, the bar's final state and a newline."""
        if self.out is None or self.counts is None or not self.tty:
            return
        self._draw(self.clock())
        self.out.write("\n")
        self.out.flush()
        self.drawn = False

    # --- text ---------------------------------------------------------------------------------

    def _rate_and_eta(self, now: float) -> tuple[float, str]:
        c = self.counts
        assert c is not None
        elapsed = now - self.start
        rate = c.done / elapsed if elapsed > 0 else 0.0
        left = c.total - c.done
        if left <= 0:
            return rate, "0:00"
        if rate <= 0:
            return rate, "--:--"
        return rate, _clock(left / rate)

    def line(self, now: float) -> str:
        """The plain line: ``import: 4210/10000 files (42%), 4200 added, …, 812/s, ETA 0:07``."""
        c = self.counts
        assert c is not None
        rate, eta = self._rate_and_eta(now)
        return (
            f"import: {c.done}/{c.total} files ({_percent(c)}%), {c.added} added,"
            f" {c.existing} already stored, {c.failed} failed, {rate:.0f}/s, ETA {eta}"
        )

    def bar(self, now: float, columns: int = 80) -> str:
        """The terminal bar: ``[#####·····] 4210/10000  42%  812/s  ETA 0:07  3 failed``."""
        c = self.counts
        assert c is not None
        rate, eta = self._rate_and_eta(now)
        filled = _BAR * c.done // c.total if c.total else _BAR
        text = (
            f"[{'#' * filled}{'.' * (_BAR - filled)}] {c.done}/{c.total} {_percent(c):>3}%"
            f"  {rate:.0f}/s  ETA {eta}"
        )
        if c.failed:
            text += f"  {c.failed} failed"
        return text[: max(1, columns - 1)]  # never wrap: a wrapped line is not redrawn in place

    def _draw(self, now: float) -> None:
        assert self.out is not None
        self.out.write("\r" + self.bar(now, _columns(self.out)) + _CLEAR)
        self.out.flush()
        self.drawn = True


def _percent(c: Counts) -> int:
    return 100 * c.done // c.total if c.total else 100


def _clock(seconds: float) -> str:
    """``0:07``, ``12:34``, ``1:02:03``."""
    s = int(seconds + 0.5)
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _columns(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (OSError, ValueError):  # not a terminal after all, or no file descriptor
        return 80
