"""How the agent logs: text or JSON lines on stderr, repeated warnings rate-limited.

Configured once, here, by the command line (nothing else touches the root
logger).  A warning or error that repeats (same logger, same message
template) is written once per ``window`` seconds; the next one written says how
many were held back, so a store that stays down costs one line a minute, not
one every retry.  The REST API's audit lines (:mod:`certagent.api.audit`) are
written as they are, one JSON object per line, in either format, and whatever
``log_level`` says.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from certagent.api.audit import AUDIT_LOGGER

__all__ = ["FORMATS", "JsonFormatter", "RepeatFilter", "TextFormatter", "setup"]

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WINDOW = 60.0


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message[, error]."""

    def format(self, record: logging.LogRecord) -> str:
        audit = getattr(record, "audit_line", None)
        if isinstance(audit, str):
            return audit
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``; an audit line as it is (one JSON object)."""

    def __init__(self) -> None:
        super().__init__(TEXT)

    def format(self, record: logging.LogRecord) -> str:
        audit = getattr(record, "audit_line", None)
        return audit if isinstance(audit, str) else super().format(record)


class RepeatFilter(logging.Filter):
    """Let one WARNING-or-worse record per (logger, message template) through per window."""

    def __init__(self, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self._clock = clock
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (written at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "each", False):
            return True  # each: one line per subject by design (extra={"each": True})
        key = (record.name, str(record.msg))
        now = self._clock()
        written = self._seen.get(key)
        if written is not None and now - written[0] < self.window:
            self._seen[key] = (written[0], written[1] + 1)
            return False
        if written is not None and written[1]:
            record.msg = f"{record.msg} (and {written[1]} more like it in the last %.0f s)"
            record.args = (*_args(record), self.window)
        if len(self._seen) > 10_000:  # bounded: templates are few, this never fills in practice
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True


def _args(record: logging.LogRecord) -> tuple[object, ...]:
    if record.args is None:
        return ()
    return record.args if isinstance(record.args, tuple) else (record.args,)


def setup(level: str, fmt: str = "text") -> None:
    """Configure the root logger: ``level``, ``fmt`` (text or json), repeats held back."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # the audit trail is written whatever the level (SIGHUP changes the root's only)
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)
    # Neither format shows where a line was logged from, nor its process or thread: not
    # collected, ≈1.7 µs less per line (the Logging HOWTO's "Optimization"); the agent
    # logs one INFO line per certificate it loads.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
