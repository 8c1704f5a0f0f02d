"""The agent's log lines: JSON when asked, repeated warnings held back."""

from __future__ import annotations

import json
import logging

from certagent.cli.logs import JsonFormatter, RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(msg: str, *args: object, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("certagent.store", level, __file__, 1, msg, args, None)


def test_json_lines_carry_time_level_logger_and_message() -> None:
    line = JsonFormatter().format(record("store %s down", "redis://x"))
    out = json.loads(line)
    assert out["level"] == "warning" and out["logger"] == "certagent.store"
    assert out["message"] == "store redis://x down"
    assert out["time"].endswith("+00:00")


def test_a_repeated_warning_is_written_once_per_window_then_counted() -> None:
    clock = Clock()
    f = RepeatFilter(window=60, clock=clock)
    assert f.filter(record("store %s down: %s", "r", "refused"))
    for _ in range(5):
        clock.now += 2
        assert not f.filter(record("store %s down: %s", "r", "timeout"))  # same template
    assert f.filter(record("other %s", "x"))  # another message goes through
    assert f.filter(record("info %s", "x", level=logging.INFO))
    assert f.filter(record("info %s", "x", level=logging.INFO))  # below WARNING: never held
    clock.now += 60
    again = record("store %s down: %s", "r", "refused")
    assert f.filter(again)
    assert again.getMessage() == "store r down: refused (and 5 more like it in the last 60 s)"


def test_an_audit_line_is_written_as_it_is_in_either_format() -> None:
    from certagent.cli.logs import TextFormatter

    line = json.dumps({"audit": True, "token": "panel", "status": 201})
    audit = logging.LogRecord("certagent.audit", logging.INFO, __file__, 1, "%s", (line,), None)
    audit.audit_line = line
    assert JsonFormatter().format(audit) == line == TextFormatter().format(audit)
    plain = TextFormatter().format(record("store %s down", "x"))
    assert plain.endswith("WARNING certagent.store: store x down")
