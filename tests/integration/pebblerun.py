"""Running a test's pebble: stopped by PID afterwards, its log printed if the test failed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from certagent.testing.pebble import Pebble


@contextlib.contextmanager
def running(pebble: Pebble, request: pytest.FixtureRequest) -> Iterator[Pebble]:
    """Start ``pebble``; stop it by PID afterwards, printing its log if the test failed
    (``rep_call``, set by tests/integration/conftest.py)."""
    pebble.start()
    try:
        yield pebble
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(pebble.log_tails())
        pebble.stop()
