"""Expiry alarms for ACME-managed certificates fire from the renewal's horizon."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from certagent.certs.pem import parse_bundle
from certagent.service.expiry import ExpiryWatch
from certagent.service.renewtime import RenewPolicy
from certagent.testing.certs import issue, make_ca, shared_key
from tests.memstore import MemoryStore
from tests.unit.service.test_expiry import Lines, Now, written  # noqa: F401 (fixture)

NAME = "short.expiry.test"


@dataclass(frozen=True)
class Failing:
    failures: int
    reason: str


async def managed(store: MemoryStore, days: float) -> str:
    start = datetime.now(UTC)
    chain, key = issue(
        make_ca(), NAME, key=shared_key(), not_before=start, not_after=start + timedelta(days=days)
    )
    locks = store.issuance().locks
    lease = await locks.acquire(NAME, "test", 30)
    assert lease is not None
    record = await locks.add_issued(parse_bundle(chain, key), lease, renew_at=start.timestamp())
    return record.id


async def test_a_short_lived_acme_certificate_is_quiet_until_its_renewal_is_late(
    written: Lines,  # noqa: F811
) -> None:
    store = MemoryStore()
    record_id = await managed(store, 6)
    now = Now()
    watch = ExpiryWatch(store, 21, now=now, renew_policy=RenewPolicy(jitter=0.0))
    await watch.scan()
    assert written.lines == []  # inside the 21-day window, but it renews itself in 3 days
    assert watch.counts.renewing == 1 and watch.counts.expiring == 0
    now.at += timedelta(days=3.5)  # past half its lifetime and still the stored one
    await watch.scan()
    (line,) = written.lines
    assert f"renewal of {NAME} is late" in line and record_id in line
    assert "expires in 2.5 days" in line
    assert watch.counts.renewal_late == 1 and watch.counts.expiring == 1


async def test_a_failing_renewal_warns_with_the_days_left(
    written: Lines,  # noqa: F811
) -> None:
    store = MemoryStore()
    await managed(store, 6)
    failing = {NAME: Failing(2, "ca-unavailable")}
    watch = ExpiryWatch(
        store, 21, now=Now(), renewal=failing.get, renew_policy=RenewPolicy(jitter=0.0)
    )
    await watch.scan()
    (line,) = written.lines
    assert f"renewal of {NAME} failing (2 in a row, ca-unavailable)" in line
    assert "expires in 6.0 days" in line


async def test_uploaded_certificates_warn_as_before_with_renewal_on(
    written: Lines,  # noqa: F811
) -> None:
    store = MemoryStore()
    chain, key = issue(
        make_ca(), "uploaded.test", key=shared_key(),
        not_after=datetime.now(UTC) + timedelta(days=6),
    )  # fmt: skip
    await store.add(parse_bundle(chain, key))
    watch = ExpiryWatch(store, 21, now=Now(), renew_policy=RenewPolicy())
    await watch.scan()
    (line,) = written.lines
    assert "uploaded.test expires in" in line and "renew it" in line
    assert watch.counts.expiring == 1
