"""At the end: orders at the CA against issuances and renewals due, late and overdue counts.

Each on-demand name renews every ``lifetime x fraction`` (:func:`lifetime_fraction`:
one half under 10 days) counted from its first certificate's notBefore, each renewal
moved by up to ``renew_jitter`` (5 %) of the lifetime either way:
``renewals_due_estimate`` is the expected count under that schedule
(:func:`expected_renewals`), ``renewals_due_floor`` the plain sum of
floor((end - notBefore) / period).  Every
order pebble created (its log, across CA restarts) counts, failed ones too.

Overdue: the agents' own count (``status``: entries more than ``renew_overdue_grace``,
1 h by default, past their time) and the schedule read straight from the store with a
grace of a tenth of the lifetime (30 s for 300 s certificates; at least 15 s, a
``renew_tick`` and an order), which is what "late"
means for certificates that live minutes; and the entries whose certificate has
expired while waiting (a failed renewal is rescheduled to its retry, which may fall
after the expiry: such an entry is not "overdue" by its time, but it is behind).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from bench.soak.warmup import FirstCert
from certagent.config import Settings
from certagent.service.renewtime import lifetime_fraction
from certagent.testing import RedisFixture, Stack, StackError
from certagent.testing.pebble import Pebble

#: the agent's default renew_jitter (the soak runs the defaults)
RENEW_JITTER = Settings.renew_jitter
ENSURE_KEYS = ("requests", "loaded", "busy", "busy_by_reason", "unknown", "errors", "reloads")
OVERDUE_GRACE_SHARE = 0.1
OVERDUE_GRACE_MIN = 15.0  # s: a renew_tick (10 s) and an order
LISTED = 20
FAR = 10 * 365 * 86400.0  # s: "every entry" as a range read
#: substrings of the agents' WARNING lines about renewals behind their time
LOG_MARKERS = {"late": " is late (due since", "overdue": "overdue", "failing": "failing ("}


def expected_renewals(elapsed: float, period: float, spread: float) -> float:
    """Renewals one name is expected to have had ``elapsed`` s after its first certificate.

    Renewal k falls at k x ``period`` plus the sum of k jitters, each uniform within
    +-``spread`` (the agent's ``renew_jitter`` x lifetime, drawn per certificate): the
    probability that it fell before ``elapsed``, summed over k (a normal law for k >= 2).
    A renewer that keeps its schedule does this many; names issued together (the warm-up)
    renew together, so a floor() would be off by a whole round near a round's end.
    """
    total, k = 0.0, 1
    while True:
        mean = k * period
        sd = spread * math.sqrt(k / 3.0)  # uniform(-s, s) has variance s^2 / 3
        if mean - 6 * sd > elapsed:
            return total
        if sd == 0:
            total += 1.0 if elapsed >= mean else 0.0
        elif k == 1:
            total += min(1.0, max(0.0, (elapsed - (mean - spread)) / (2 * spread)))
        else:
            total += 0.5 * (1.0 + math.erf((elapsed - mean) / (sd * math.sqrt(2.0))))
        k += 1


def due_estimate(first: Sequence[FirstCert], end: float) -> dict[str, Any]:
    expected = 0.0
    floor = 0
    periods = []
    for cert in first:
        lifetime = cert.not_after - cert.not_before
        period = lifetime * lifetime_fraction(lifetime)
        periods.append(period)
        elapsed = end - cert.not_before
        expected += expected_renewals(elapsed, period, RENEW_JITTER * lifetime)
        floor += max(0, math.floor(elapsed / period))
    renewals = round(expected)
    return {
        "issuances": len(first),
        "renewals_due_estimate": renewals,
        "renewals_due_floor": floor,
        "orders_expected": len(first) + renewals,
        "renewal_period_s": round(sum(periods) / len(periods), 1) if periods else None,
    }


def agent_status(stacks: Sequence[Stack]) -> list[dict[str, Any]]:
    """Each node's ``status`` renewal section (whatever keys it has) and its first-connection
    counters (fallbacks by reason), or the error."""
    out: list[dict[str, Any]] = []
    for i, stack in enumerate(stacks):
        try:
            status = stack.status()
        except (OSError, ValueError, StackError) as exc:
            out.append({"node": i, "error": f"{type(exc).__name__}: {exc}"})
            continue
        issuance = status.get("issuance") or {}
        ensure = status.get("ensure") or {}
        out.append(
            {
                "node": i,
                "renewal": issuance.get("renewal"),
                # why first connections got the fallback, since this agent's last start
                "ensure": {k: ensure.get(k) for k in ENSURE_KEYS},
            }
        )
    return out


def log_warnings(stacks: Sequence[Stack]) -> dict[str, int]:
    """WARNING lines of every agent's log (all its runs) about late, overdue, failing renewals."""
    counts = dict.fromkeys(LOG_MARKERS, 0)
    for stack in stacks:
        for line in stack.agent_log().splitlines():
            if "WARNING" not in line or "renew" not in line:
                continue
            for key, marker in LOG_MARKERS.items():
                counts[key] += marker in line
    return counts


def schedule_overdue(store: RedisFixture, grace: float) -> dict[str, Any]:
    """Entries in the store's schedule more than ``grace`` s past their renewal time."""

    async def read() -> dict[str, Any]:
        opened = store.open()
        try:
            renewals = opened.issuance().renewals
            now = time.time()
            scheduled, due = await renewals.count(now)
            # every entry (a soak has hundreds), earliest first: one range read
            entries = await renewals.due(now + FAR, max(1, scheduled))
        finally:
            await opened.close()
        overdue = [e for e in entries if e.renew_at <= now - grace]
        expired = [e for e in entries if 0 < e.not_after <= now]
        behind = {e.name for e in overdue} | {e.name for e in expired}
        return {
            "grace_s": grace,
            "scheduled": scheduled,
            "due": due,
            "overdue": len(overdue),
            "expired": len(expired),
            "behind": len(behind),
            "overdue_names": [
                {"name": e.name, "late_s": round(now - e.renew_at, 1)} for e in overdue[:LISTED]
            ],
            "expired_names": [
                {"name": e.name, "expired_s_ago": round(now - e.not_after, 1)}
                for e in expired[:LISTED]
            ],
        }

    return asyncio.run(read())


def account(
    stacks: Sequence[Stack],
    pebble: Pebble,
    store: RedisFixture,
    first: Sequence[FirstCert],
    lifetime: float,
    end: float,
) -> dict[str, Any]:
    estimate = due_estimate(first, end)
    orders = pebble.orders()
    expected = estimate["orders_expected"]
    return {
        "orders": orders,
        "certificates_issued": pebble.certificates(),
        **estimate,
        "orders_over_expected": round(orders / expected, 3) if expected else None,
        "renewals_over_due": (
            round((orders - len(first)) / estimate["renewals_due_estimate"], 3)
            if estimate["renewals_due_estimate"]
            else None
        ),
        "status": agent_status(stacks),
        "log_warnings": log_warnings(stacks),
        "overdue_at_end": schedule_overdue(
            store, max(OVERDUE_GRACE_MIN, OVERDUE_GRACE_SHARE * lifetime)
        ),
    }
