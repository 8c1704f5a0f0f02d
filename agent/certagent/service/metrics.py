"""Prometheus metrics: ``GET /metrics`` renders the agent's status snapshot.

Nothing is instrumented on the hot path but :class:`LatencyHistogram` (one
bisect per load).  Every other value is read at scrape time from the counters
the agent keeps anyway (:meth:`~certagent.service.daemon.Agent.status`), so a
scrape costs O(1) whatever the number of slots or stored certificates, plus the
two health probes the status makes.  :func:`render` is pure: snapshot in, text
exposition format out (prometheus-client does the format).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "LatencyHistogram", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds: a load takes a few ms when all goes well, up to the hold (5 s) in a storm.
LOAD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: ensure counter -> the ``outcome`` label of certagent_ensure_requests_total
_OUTCOMES = {
    "hits": "hit",
    "loaded": "loaded",
    "unknown": "unknown",
    "negative_hits": "unknown_cached",
    "busy": "busy",
    "invalid": "invalid",
    "errors": "error",
    "wildcard_hits": "wildcard_hit",
}


class LatencyHistogram:
    """Counts of observations per bucket, and their sum; O(log buckets) per observation."""

    def __init__(self, buckets: tuple[float, ...] = LOAD_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bucket (+Inf)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds

    def snapshot(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.total}


def render(status: Mapping[str, Any]) -> bytes:
    """The exposition text for one status snapshot (``Agent.status()``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(status))
    return generate_latest(registry)


class _Snapshot(Collector):
    def __init__(self, status: Mapping[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        st = self.status
        ensure, loader, live = st["ensure"], st["loader"], st["live"]
        outcomes = CounterMetricFamily(
            "certagent_ensure_requests",
            "Requests of HAProxy's Lua action (one per connection to a host not marked"
            " loaded), by outcome",
            labels=["outcome"],
        )
        for key, outcome in _OUTCOMES.items():
            outcomes.add_metric([outcome], ensure[key])
        yield outcomes
        busy = CounterMetricFamily(
            "certagent_ensure_busy",
            "Hosts given the fallback because no certificate could be loaded within the hold,"
            " by the limit hit (queue, hold, slots, load, lookups, filter, issuing)",
            labels=["reason"],
        )
        for reason, count in sorted(ensure.get("busy_by_reason", {}).items()):
            busy.add_metric([reason], count)
        yield busy
        yield _counter(
            "certagent_store_lookups", "Store lookups for new hosts", ensure["store_lookups"]
        )
        yield _counter(
            "certagent_name_filter_rejections",
            "Names the Bloom filter of the store's names turned away without a lookup",
            ensure["filtered"],
        )
        yield _counter("certagent_loads", "Certificates loaded into HAProxy", loader["loads"])
        yield _counter(
            "certagent_recycles",
            "Slots recycled (least recently used) for a new host",
            loader["recycles"],
        )
        yield _counter(
            "certagent_load_failures", "Loads HAProxy refused or failed", loader["failures"]
        )
        yield _counter(
            "certagent_haproxy_reloads", "HAProxy reloads or restarts noticed", ensure["reloads"]
        )
        yield _counter("certagent_live_changes", "Store changes applied", live["changes"])
        yield _counter("certagent_live_rotations", "Certificates swapped in place", live["rotated"])
        yield _counter(
            "certagent_live_unloads", "Certificates unloaded on delete", live["unloaded"]
        )
        yield _gauge(
            "certagent_orphans",
            "Loaded certificates the store no longer has (kept serving)",
            live["orphans"],
        )
        hist = st["load_seconds"]
        buckets = [
            (_le(bound), count)
            for bound, count in zip(
                [*hist["buckets"], float("inf")], _cumulative(hist["counts"]), strict=True
            )
        ]
        yield HistogramMetricFamily(
            "certagent_load_duration_seconds",
            "From the Lua action's request to the new host's certificate loaded, in seconds",
            buckets=buckets,
            sum_value=hist["sum"],
        )
        yield _gauge(
            "certagent_slots_used", "Certificate slots in use in HAProxy", st["slots_used"]
        )
        yield _gauge("certagent_slots_capacity", "Certificate slots at most", st["capacity"])
        yield _gauge("certagent_hosts_marked", "Hosts marked loaded", st["hosts_marked"])
        yield _gauge(  # the old name, for one release
            "certagent_hosts_mapped",
            "Hosts marked loaded (deprecated: certagent_hosts_marked)",
            st["hosts_marked"],
        )
        yield _gauge("certagent_loads_waiting", "Loads queued for HAProxy", st["waiting_loads"])
        yield _gauge("certagent_store_up", "1 if the store answered a ping", int(st["store_up"]))
        yield _gauge(
            "certagent_haproxy_up", "1 if HAProxy's runtime socket answered", int(st["haproxy_up"])
        )
        expiry = st.get("expiry")
        if expiry is not None:
            yield _gauge(
                "certagent_certificates_expiring",
                f"Stored certificates expiring within {expiry['window_days']} days (expired ones"
                " included)",
                expiry["expiring"],
            )
            yield _gauge(
                "certagent_certificates_expired",
                "Stored certificates already expired",
                expiry["expired"],
            )
            if expiry["soonest"] is not None:
                yield _gauge(
                    "certagent_certificate_soonest_expiry_timestamp_seconds",
                    "notAfter of the stored certificate that expires first (Unix time)",
                    expiry["soonest"],
                )
        issuance = st.get("issuance")
        if issuance is not None:
            yield from _issuance(issuance)
        data_keys = st.get("data_keys")
        if data_keys is not None:
            yield from _undecryptable(data_keys["undecryptable"])
        http3 = st.get("http3")
        if http3 is not None:
            yield from _http3(http3)
        tickets = st.get("tickets")
        if tickets is not None and tickets.get("rotated_at") is not None:
            yield _gauge(
                "certagent_ticket_key_rotated_timestamp_seconds",
                "When the session-ticket keys last rotated (Unix time)",
                tickets["rotated_at"],
            )
            yield _gauge(
                "certagent_ticket_key_generation",
                "Generation of the session-ticket key ring",
                tickets["generation"],
            )


def _issuance(st: Mapping[str, Any]) -> Iterator[Metric]:
    """On-demand issuance: orders by result, permission answers, the first connection's wait."""
    orders = CounterMetricFamily(
        "certagent_acme_orders", "ACME orders this agent placed, by result", labels=["result"]
    )
    orders.add_metric(["started"], st["orders_started"])
    orders.add_metric(["valid"], st["orders_valid"])
    orders.add_metric(["failed"], st["orders_failed"])
    yield orders
    failed = CounterMetricFamily(
        "certagent_acme_order_failures", "Failed ACME orders, by reason", labels=["reason"]
    )
    for reason, count in sorted(st["failed_by_reason"].items()):
        failed.add_metric([reason], count)
    yield failed
    yield _gauge("certagent_acme_pending", "Names this agent is issuing now", st["pending"])
    permission = st["permission"]
    answers = CounterMetricFamily(
        "certagent_acme_permission", "Permission policy answers, by answer", labels=["answer"]
    )
    answers.add_metric(["allowed"], permission["allowed"])
    answers.add_metric(["denied"], permission["denied"])
    yield answers
    yield _counter(
        "certagent_acme_ask_requests", "Requests to the ask endpoint", permission["ask_requests"]
    )
    yield _counter(
        "certagent_acme_fallbacks",
        "First connections of an allowed name that got the fallback (no certificate in time)",
        st["fallbacks"],
    )
    hist = st["wait_seconds"]
    buckets = [
        (_le(bound), count)
        for bound, count in zip(
            [*hist["buckets"], float("inf")], _cumulative(hist["counts"]), strict=True
        )
    ]
    yield HistogramMetricFamily(
        "certagent_acme_first_connection_seconds",
        "From a name's first connection to its issued certificate in the store, in seconds",
        buckets=buckets,
        sum_value=hist["sum"],
    )
    yield _gauge(
        "certagent_acme_challenges_served",
        "ACME challenge answers this node serves now",
        st["challenges"]["serving"],
    )
    yield _counter(
        "certagent_acme_budget_waits",
        "Orders the fleet's issuance budget held back (each tried again later)",
        st.get("budget_waits", 0),
    )
    budget = st.get("budget")
    if budget is not None:
        spent = CounterMetricFamily(
            "certagent_acme_budget_orders",
            "Orders this agent asked the fleet's issuance budget for, by kind and answer",
            labels=["kind", "answer"],
        )
        for answer in ("taken", "refused"):
            for kind in ("new", "renewal"):
                spent.add_metric([kind, answer], budget[answer].get(kind, 0))
        yield spent
    renewal = st.get("renewal")
    if renewal is not None and "error" not in renewal:
        yield from _renewal(renewal)


def _renewal(st: Mapping[str, Any]) -> Iterator[Metric]:
    """Renewal: the fleet's schedule (from the store), this node's renewals and failures."""
    for key, doc in (
        ("scheduled", "ACME-managed names in the fleet's renewal schedule"),
        ("due", "Names whose renewal time has come"),
        ("overdue", "Names whose renewal time passed more than renew_overdue_grace ago"),
        ("failing", "Names whose last renewal on this node failed"),
    ):
        yield _gauge(f"certagent_renewals_{key}", doc, st[key])
    yield _gauge(
        "certagent_renewal_pace",
        "Renewals this node completed a second, over the last five minutes",
        st["pace"],
    )
    if st["clear_seconds"] is not None:
        yield _gauge(
            "certagent_renewal_clear_seconds",
            "The due names over this node's pace: seconds to clear the backlog (at most)",
            st["clear_seconds"],
        )
    if st.get("fleet_pace") is not None:
        yield _gauge(
            "certagent_renewal_fleet_pace",
            "Renewals a second of every running node that renews (their last beats)",
            st["fleet_pace"],
        )
    yield _gauge(
        "certagent_renewal_concurrency",
        "Renewals this node runs at once now (renew_concurrency; acme_concurrency when late)",
        st["concurrency"],
    )
    done = CounterMetricFamily(
        "certagent_renewals", "Renewals this node attempted, by result", labels=["result"]
    )
    for result in ("done", "failed", "postponed"):
        done.add_metric([result], st[result])
    yield done
    yield _counter(
        "certagent_renewal_ari_checks", "renewalInfo (ARI) requests to the CA", st["ari_checks"]
    )
    hist = st["renew_seconds"]
    yield HistogramMetricFamily(
        "certagent_renewal_delay_seconds",
        "From a name's renewal time to its renewed certificate in the store, in seconds",
        buckets=[
            (_le(bound), count)
            for bound, count in zip(
                [*hist["buckets"], float("inf")], _cumulative(hist["counts"]), strict=True
            )
        ],
        sum_value=hist["sum"],
    )


def _http3(st: Mapping[str, Any]) -> Iterator[Metric]:
    """HTTP/3: fe_tls's QUIC counters (from HAProxy) and hosts back after a recycle."""
    yield _counter(
        "certagent_http3_recycled_returns",
        "Hosts loaded again over TCP within the Alt-Svc max-age of losing their slot: their"
        " HTTP/3 clients met the default certificate first and fell back",
        st["returns"],
    )
    quic = st.get("quic")
    if quic is None:
        return
    yield _counter(
        "certagent_http3_refused_handshakes",
        "QUIC handshakes on fe_tls that clients closed with a TLS alert (a certificate they"
        " refused: a host not loaded, recycled or deleted); a client may repeat its close in"
        " several packets, each counted (HAProxy's quic_transp_err_crypto_error)",
        quic["refused"],
    )
    yield _counter(
        "certagent_http3_failed_handshakes",
        "QUIC handshakes HAProxy failed itself (quic_hdshk_fail)",
        quic["failed"],
    )
    yield _counter(
        "certagent_http3_connections", "HTTP/3 connections on fe_tls (h3sess)", quic["connections"]
    )
    yield _counter(
        "certagent_http3_requests", "HTTP/3 requests on fe_tls (h3req)", quic["requests"]
    )


def _undecryptable(st: Mapping[str, Any]) -> Iterator[Metric]:
    """Records the agent could not decrypt: lookups by data key (at most 9 labels), listed now."""
    met = CounterMetricFamily(
        "certagent_undecryptable_records",
        "Lookups that met a stored record this agent cannot decrypt, by the data key it names"
        " (a key missing from key_file, or an altered record; `certagent status` names them)",
        labels=["key_id"],
    )
    for key_id, count in st["by_key_id"].items():
        met.add_metric([key_id], count)
    yield met
    yield _gauge(
        "certagent_undecryptable_records_listed",
        "Records that did not decrypt when last met, as `certagent status` lists them (at most 20)",
        len(st["records"]),
    )


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _cumulative(counts: list[int]) -> list[int]:
    out, running = [], 0
    for count in counts:
        running += count
        out.append(running)
    return out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
