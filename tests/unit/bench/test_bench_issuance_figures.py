"""The figures of ``bench.issuance``: medians of repeats, differences within a repeat."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bench.issuance.breakdown import segments
from bench.issuance.report import markdown
from bench.issuance.run import _figures, name


def _run(first: tuple[float, float], ca: tuple[float, float], agent_cpu: float) -> dict[str, Any]:
    def ms(p50: float, p99: float) -> dict[str, Any]:
        return {"count": 3, "p50": p50, "p99": p99, "fallback": 0, "failed": 0, "errors": []}

    return {
        "first_connection_ms": ms(*first),
        "ca_order_ms": ms(*ca),
        "orders_for_first_connections": 3,
        "breakdown": {"count": 3, "order_p50_ms": first[0] / 2, "direct_order_p50_ms": ca[0] / 2},
        "cpu_ms_per_issuance": {"agent": agent_cpu, "pebble": 5.0},
        "cpu_ms_per_direct_order": {"agent": 0.0, "pebble": 5.0, "acme_client": 6.0},
    }


def test_issuance_overhead_is_taken_within_each_repeat_then_the_median() -> None:
    runs = [_run((150, 300), (100, 200), 10), _run((400, 500), (380, 490), 20),
            _run((160, 310), (90, 250), 30)]  # fmt: skip
    figures = _figures(runs, count=3)
    assert figures["overhead_ms"]["p50"] == {
        "median": 50.0, "min": 20.0, "max": 70.0, "runs": [50.0, 20.0, 70.0]
    }  # fmt: skip
    assert figures["overhead_ms"]["p99"]["runs"] == [100.0, 10.0, 60.0]
    assert figures["first_connection_ms"]["p50"]["median"] == 160.0
    assert figures["cpu_ms_per_issuance"]["agent"]["median"] == 20.0
    assert figures["cpu_ms_per_direct_order"]["acme_client"]["median"] == 6.0
    assert figures["verified"] == figures["asked"] == 9
    assert figures["orders_per_name"] == 1.0
    assert figures["breakdown_p50_ms"]["order_p50_ms"]["runs"] == [75.0, 200.0, 80.0]
    assert set(figures["breakdown_p50_ms"]) == {"order_p50_ms", "direct_order_p50_ms"}


def test_issuance_report_shows_median_with_spread_per_variant() -> None:
    figures = _figures([_run((150, 300), (100, 200), 10)], count=3)
    result = {
        "meta": {
            "date": "2026-11-27T00:00:00Z",
            "revision": "abc",
            "machine": {
                "nproc": 2,
                "cpu_model": "x",
                "haproxy": "h",
                "redis": "r",
                "python": "3.11",
            },
            "pebble": "2.4.0",
            "smoke": True,
            "sizes": {"names": 3, "repeats": 1, "workers": 3},
            "setup": {
                "pebble": "p",
                "challenge": "http-01",
                "key_type": "ecdsa",
                "allowed_by": "suffix",
                "acme_concurrency": 3,
            },
        },
        "sequential": {"workers": 1, **figures},
        "concurrent": {"workers": 3, **figures},
    }
    text = markdown(result)
    assert "| one at a time | 150 ms [150, 150] | 300 ms [300, 300] | 100 ms [100, 100] |" in text
    assert "| 3 at once |" in text
    assert "| sequential | CA alone | 0.0 [0.0, 0.0] | - | - | 5.0 [5.0, 5.0] | - | 6.0" in text
    assert name("fc", "seq", 2, 7) == "fc-seq-2-007.issuance.bench.test"


def test_issuance_breakdown_splits_each_first_connection_at_the_agents_log_lines() -> None:
    log = "\n".join(
        [
            "2026-11-27 05:17:24,742 DEBUG certagent.acme.issue: ACME order https://ca/o/1 for"
            " a.test: pending",
            "2026-11-27 05:17:24,760 INFO certagent.service.challenges: answering the http-01"
            " challenge for a.test",
            "2026-11-27 05:17:24,960 DEBUG certagent.acme.issue: ACME order https://ca/o/1:"
            " certificate for a.test",
            "2026-11-27 05:17:24,981 INFO certagent.store.redis._store: stored certificate 59 for"
            " a.test (sha256 d3, acme) in redis://127.0.0.1:1/0",
            "2026-11-27 05:17:24,999 INFO certagent.service.ensure: serving a.test from"
            " /certagent/slot-00003.pem (certificate 59)",
        ]
    )
    t0 = dt.datetime(2026, 11, 27, 5, 17, 24, 700_000).timestamp()
    parts = segments(log, {"a.test": (t0, t0 + 0.310), "never-logged.test": (t0, t0 + 1)})
    ms = {k: [round(v * 1000) for v in values] for k, values in parts.items()}
    assert ms == {"to_order": [42], "order": [218], "store": [21], "load": [18], "handshake": [11]}
