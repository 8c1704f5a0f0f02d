"""Expiry warnings: once per certificate entering the window, once more when it expires."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from certagent.certs.pem import CertBundle, parse_bundle
from certagent.cli.logs import RepeatFilter
from certagent.service.expiry import ExpiryWatch
from certagent.testing.certs import issue, make_ca, shared_key
from tests.memstore import MemoryStore


class Now:
    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.at


def bundle(name: str, days: float) -> CertBundle:
    chain, key = issue(
        make_ca(), name, key=shared_key(), not_after=datetime.now(UTC) + timedelta(days=days)
    )
    return parse_bundle(chain, key)


class Lines(logging.Handler):
    """What the agent's own handler would write: repeats held back as in production."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.addFilter(RepeatFilter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def written() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("certagent.service.expiry")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def test_each_certificate_warns_once_entering_the_window_and_once_expiring(
    written: Lines,
) -> None:
    store = MemoryStore()
    soon = await store.add(bundle("soon.test", 10))
    other = await store.add(bundle("other.test", 12))
    await store.add(bundle("later.test", 60))
    now = Now()
    watch = ExpiryWatch(store, 21, now=now)
    await watch.scan()
    await watch.scan()
    lines = written.lines  # one template, yet every certificate gets its line
    assert len(lines) == 2, lines
    assert any(f"{soon.id} for soon.test expires in 10.0 days" in line for line in lines)
    assert any(other.id in line for line in lines)
    assert watch.counts.expiring == 2 and watch.counts.expired == 0
    assert watch.counts.soonest == pytest.approx(soon.not_after.timestamp())

    written.lines.clear()
    now.at += timedelta(days=11)  # soon.test expired, other.test still expiring
    await watch.scan()
    lines = written.lines
    assert len(lines) == 1 and "expired on" in lines[0] and soon.id in lines[0]
    assert watch.counts.expired == 1 and watch.counts.expiring == 2

    await store.delete(soon.id)  # renewed or deleted: it leaves the counts
    await watch.scan()
    assert watch.counts.expired == 0 and watch.counts.expiring == 1
    assert watch.status()["window_days"] == 21
