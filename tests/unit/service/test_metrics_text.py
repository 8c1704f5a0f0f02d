"""/metrics: the status snapshot in Prometheus' text format (pure rendering)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from certagent.service.metrics import LOAD_BUCKETS, LatencyHistogram, render


def snapshot(**over: Any) -> dict[str, Any]:
    hist = LatencyHistogram()
    for seconds in (0.0005, 0.003, 0.003, 0.2, 30.0):
        hist.observe(seconds)
    status: dict[str, Any] = {
        "ensure": {
            "hits": 5, "loaded": 4, "unknown": 3, "negative_hits": 2, "busy": 1, "invalid": 6,
            "errors": 0, "wildcard_hits": 7, "store_lookups": 9, "filtered": 11, "reloads": 1,
            "busy_by_reason": {"hold": 1},
        },
        "loader": {"loads": 4, "recycles": 2, "failures": 1},
        "live": {"changes": 8, "rotated": 1, "unloaded": 2, "orphans": 0},
        "load_seconds": hist.snapshot(),
        "slots_used": 3, "capacity": 10, "hosts_marked": 5, "waiting_loads": 0,
        "store_up": True, "haproxy_up": False,
        "expiry": {"window_days": 21, "expiring": 2, "expired": 1, "soonest": 1.7e9},
        "tickets": {"rotated_at": 1.7e9, "generation": 4},
    }  # fmt: skip
    status.update(over)
    return status


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_metric_with_its_value() -> None:
    got = samples(render(snapshot()))
    assert got[("certagent_ensure_requests_total", (("outcome", "loaded"),))] == 4
    assert got[("certagent_ensure_requests_total", (("outcome", "unknown_cached"),))] == 2
    assert got[("certagent_store_lookups_total", ())] == 9
    assert got[("certagent_ensure_busy_total", (("reason", "hold"),))] == 1
    assert got[("certagent_loads_total", ())] == 4
    assert got[("certagent_recycles_total", ())] == 2
    assert got[("certagent_load_failures_total", ())] == 1
    assert got[("certagent_live_changes_total", ())] == 8
    assert got[("certagent_slots_used", ())] == 3
    assert got[("certagent_slots_capacity", ())] == 10
    assert got[("certagent_hosts_marked", ())] == 5
    assert got[("certagent_hosts_mapped", ())] == 5  # the old name, for one release
    assert got[("certagent_store_up", ())] == 1
    assert got[("certagent_haproxy_up", ())] == 0
    assert got[("certagent_certificates_expiring", ())] == 2
    assert got[("certagent_certificates_expired", ())] == 1
    assert got[("certagent_certificate_soonest_expiry_timestamp_seconds", ())] == 1.7e9
    assert got[("certagent_ticket_key_rotated_timestamp_seconds", ())] == 1.7e9


def test_the_load_histogram_is_cumulative_in_seconds() -> None:
    got = samples(render(snapshot()))
    bucket = "certagent_load_duration_seconds_bucket"
    assert got[(bucket, (("le", "0.001"),))] == 1
    assert got[(bucket, (("le", "0.005"),))] == 3
    assert got[(bucket, (("le", "0.25"),))] == 4
    assert got[(bucket, (("le", "10.0"),))] == 4
    assert got[(bucket, (("le", "+Inf"),))] == 5
    assert got[("certagent_load_duration_seconds_count", ())] == 5
    assert abs(got[("certagent_load_duration_seconds_sum", ())] - 30.2065) < 1e-9
    assert len([k for k in got if k[0] == bucket]) == len(LOAD_BUCKETS) + 1


def test_optional_sections_are_left_out_when_unknown() -> None:
    text = render(snapshot(tickets=None, expiry=None)).decode()
    assert "certagent_ticket_key" not in text and "certagent_certificates_exp" not in text
    text = render(snapshot(expiry={"window_days": 21, "expiring": 0, "expired": 0,
                                   "soonest": None})).decode()  # fmt: skip
    assert "soonest" not in text and "certagent_certificates_expiring 0.0" in text


def test_http3_counters_from_haproxy_and_the_recycled_hosts_back() -> None:
    http3 = {
        "max_age": 3600,
        "returns": 3,
        "window_s": 3600,
        "recycled_idle_s": {"recycles": 2, "min": 1.0, "p10": 1.0, "median": 2.0},
        "quic": {"refused": 4, "failed": 1, "connections": 7, "requests": 9},
    }
    got = samples(render(snapshot(http3=http3)))
    assert got[("certagent_http3_recycled_returns_total", ())] == 3
    assert got[("certagent_http3_refused_handshakes_total", ())] == 4
    assert got[("certagent_http3_failed_handshakes_total", ())] == 1
    assert got[("certagent_http3_connections_total", ())] == 7
    assert got[("certagent_http3_requests_total", ())] == 9
    unreadable = samples(render(snapshot(http3={**http3, "quic": None})))
    assert ("certagent_http3_refused_handshakes_total", ()) not in unreadable
    assert unreadable[("certagent_http3_recycled_returns_total", ())] == 3
    assert not any(name.startswith("certagent_http3") for name, _ in samples(render(snapshot())))
