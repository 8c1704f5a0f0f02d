"""GET /metrics after a small storm: every metric, real values, and promtool accepts it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from certagent.certs.pem import parse_bundle
from certagent.testing import PKI, RedisFixture, free_port, tlsclient, wait_for
from certagent.testing.certs import issue, shared_key
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

# scripts/install.sh puts it beside the Python of the environment it makes
PROMTOOL = Path(sys.executable).with_name("promtool")


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.headers["Content-Type"], reply.read().decode()


def test_metrics_after_a_small_storm(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    hosts = [f"m{i:02d}.metrics.test" for i in range(12)]
    soon = "soon.metrics.test"  # expires in 5 days: inside the 21-day warning window
    chain, key = issue(
        pki.ca, soon, key=shared_key(), not_after=datetime.now(UTC) + timedelta(days=5)
    )
    redis_store.put([*(pki.bundle(h) for h in hosts), parse_bundle(chain, key)])
    bind = f"127.0.0.1:{free_port()}"
    stack = make_stack(redis_store.url, capacity=8, env={"CERTAGENT_METRICS_BIND": bind})
    context = tlsclient.client_context(stack.cafile)

    async def storm(wave: list[str]) -> list[object]:
        return await asyncio.gather(
            *(tlsclient.handshake_async(stack.port, h, context) for h in wave),
            return_exceptions=True,
        )

    # Two waves of 6 new hosts, one client each: each wave fits the 8 slots, so no
    # host is recycled while its own client is still on its way (12 distinct cold
    # hosts at once on 8 slots would thrash, by design). With two clients per host,
    # the first wave's hosts count as used twice and outrank the second wave's just
    # loaded ones, and at this capacity only 2 slots are spared as just loaded
    # (usage.RECENT_MAX, a quarter of the pool): once on HAProxy 3.0 a second-wave
    # host was recycled 3 ms after its load, before its second client's handshake.
    for wave in (hosts[:6], hosts[6:]):
        results = asyncio.run(storm(wave))
        assert all(isinstance(r, tlsclient.CertInfo) for r in results), results
    assert stack.hello(b"absent.metrics.test") == stack.default_der
    content_type, text = scrape(f"http://{bind}/metrics")
    assert content_type.startswith("text/plain; version=0.0.4")

    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return values[(name, tuple(sorted(labels.items())))]

    assert value("certagent_ensure_requests_total", outcome="loaded") >= len(hosts)
    assert value("certagent_ensure_requests_total", outcome="unknown") >= 1
    assert value("certagent_store_lookups_total") >= len(hosts)
    assert value("certagent_loads_total") >= len(hosts)
    assert value("certagent_recycles_total") >= len(hosts) - 8  # capacity 8
    assert value("certagent_load_failures_total") == 0
    assert value("certagent_load_duration_seconds_count") >= len(hosts)
    assert value("certagent_load_duration_seconds_sum") > 0
    assert value("certagent_slots_used") == 8 and value("certagent_slots_capacity") == 8
    assert value("certagent_hosts_marked") >= 1
    assert value("certagent_hosts_mapped") == value("certagent_hosts_marked")  # old name
    assert value("certagent_store_up") == 1 and value("certagent_haproxy_up") == 1
    assert value("certagent_live_changes_total") == 0
    assert value("certagent_certificates_expiring") == 1
    expiry = value("certagent_certificate_soonest_expiry_timestamp_seconds")
    assert abs(expiry - (datetime.now(UTC) + timedelta(days=5)).timestamp()) < 120
    assert value("certagent_ticket_key_generation") >= 2
    assert value("certagent_ticket_key_rotated_timestamp_seconds") > 0
    log = stack.agent_log()
    assert f"for {soon} expires in 5.0 days" in log or f"for {soon} expires in 4.9 days" in log

    # a put through the store is a live change the next scrape counts
    redis_store.put([pki.bundle("late.metrics.test")])
    wait_for(
        lambda: "certagent_live_changes_total 1.0" in scrape(f"http://{bind}/metrics")[1] or None,
        5.0,
        "the change to be counted",
    )

    assert PROMTOOL.exists(), f"{PROMTOOL} missing: run scripts/install.sh"
    checked = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
