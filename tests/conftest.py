"""Names the HAProxy under test in pytest's header (scripts/test.sh runs several)."""

from __future__ import annotations

import os

import pytest

from certagent.testing import HAPROXY, StackError, haproxy_build


def pytest_report_header(config: pytest.Config) -> str:
    where = (
        "CERTAGENT_TEST_HAPROXY" if os.environ.get("CERTAGENT_TEST_HAPROXY") else "PATH's haproxy"
    )
    try:
        build = haproxy_build().describe()
    except StackError as exc:
        build = f"does not run: {exc}"
    return f"HAProxy under test: {build} ({HAPROXY}, from {where})"
