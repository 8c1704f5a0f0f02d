"""/metrics for renewal: the schedule's counts, this node's renewals, the delay histogram."""

from __future__ import annotations

from typing import Any

from certagent.service.metrics import LatencyHistogram, render
from certagent.service.renewer import RENEW_BUCKETS
from tests.unit.service.test_metrics_text import samples, snapshot


def issuance(renewal: dict[str, Any] | None) -> dict[str, Any]:
    waits = LatencyHistogram((1.0,))
    return {
        "pending": 0, "orders_started": 5, "orders_valid": 4, "orders_failed": 1,
        "failed_by_reason": {"challenge": 1}, "fallbacks": 0, "wait_seconds": waits.snapshot(),
        "permission": {"allowed": 3, "denied": 0, "ask_requests": 0},
        "challenges": {"serving": 0}, "budget_waits": 2, "renewal": renewal,
    }  # fmt: skip


def test_renewal_metrics_with_their_values() -> None:
    delay = LatencyHistogram(RENEW_BUCKETS)
    for seconds in (0.5, 3.0, 3.0, 100_000.0):
        delay.observe(seconds)
    renewal = {
        "scheduled": 1000, "due": 7, "overdue": 2, "failing": 1, "done": 40, "failed": 3,
        "postponed": 5, "ari_checks": 11, "renew_seconds": delay.snapshot(),
        "backlog": 7, "pace": 0.25, "clear_seconds": 28.0, "concurrency": 10, "late": True,
    }  # fmt: skip
    got = samples(render(snapshot(issuance=issuance(renewal))))
    assert got[("certagent_renewals_scheduled", ())] == 1000
    assert got[("certagent_renewals_due", ())] == 7
    assert got[("certagent_renewals_overdue", ())] == 2
    assert got[("certagent_renewals_failing", ())] == 1
    assert got[("certagent_renewal_pace", ())] == 0.25
    assert got[("certagent_renewal_clear_seconds", ())] == 28.0
    assert got[("certagent_renewal_concurrency", ())] == 10
    assert got[("certagent_renewals_total", (("result", "done"),))] == 40
    assert got[("certagent_renewals_total", (("result", "failed"),))] == 3
    assert got[("certagent_renewals_total", (("result", "postponed"),))] == 5
    assert got[("certagent_renewal_ari_checks_total", ())] == 11
    assert got[("certagent_acme_budget_waits_total", ())] == 2
    assert got[("certagent_renewal_delay_seconds_bucket", (("le", "1.0"),))] == 1
    assert got[("certagent_renewal_delay_seconds_bucket", (("le", "5.0"),))] == 3
    assert got[("certagent_renewal_delay_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("certagent_renewal_delay_seconds_count", ())] == 4


def test_no_time_to_clear_without_a_pace() -> None:
    delay = LatencyHistogram(RENEW_BUCKETS)
    renewal = {
        "scheduled": 10, "due": 3, "overdue": 0, "failing": 0, "done": 0, "failed": 0,
        "postponed": 0, "ari_checks": 0, "renew_seconds": delay.snapshot(),
        "backlog": 3, "pace": 0.0, "clear_seconds": None, "concurrency": 4, "late": False,
    }  # fmt: skip
    got = samples(render(snapshot(issuance=issuance(renewal))))
    assert got[("certagent_renewal_pace", ())] == 0.0
    assert ("certagent_renewal_clear_seconds", ()) not in got


def test_no_renewal_metrics_when_renewal_is_off_or_its_store_read_failed() -> None:
    for renewal in (None, {"error": "store unavailable"}):
        got = samples(render(snapshot(issuance=issuance(renewal))))
        assert not any(name.startswith("certagent_renewal") for name, _ in got)
        assert got[("certagent_acme_orders_total", (("result", "valid"),))] == 4
