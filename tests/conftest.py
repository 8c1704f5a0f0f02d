"""The HAProxy under test, named in pytest's header, and the marks of the version matrix.

``scripts/test.sh`` runs the whole suite on Debian 12's HAProxy 2.6, then the
integration tests on Debian's 3.0 and 3.2 and the runtime-API tests on 3.4
(``CERTAGENT_TEST_HAPROXY``).  Two marks, given here by module so that the lists
sit in one place, choose what those runs leave out:

* ``no_haproxy``: modules that never start HAProxy (stores, the REST API on its
  own, packaging).  A run on one HAProxy covers them; the harness refuses to
  start HAProxy inside them, so a module wrongly listed fails on the first run.
* ``runtime_api``: the modules that exercise HAProxy's runtime API and TLS side
  most directly, run on 3.4 too.
* ``heavy``: long tests whose subject does not change with HAProxy's version (the
  bench's own smoke runs, the demo, a Redis failover, a bulk import, a flood of
  made-up names, renewal): run on 2.6 only, left out on 3.0 and 3.2, to keep CI
  under 30 minutes (on 3.2 the bench's smoke runs alone took 4 minutes).
* ``own_builds``: tests that start every HAProxy build they compare themselves
  (``python -m bench.versions``, ``python -m bench.http3``): run once, in the 2.6 run.

The header of each run names the HAProxy under test and the marks it leaves out.
"""

from __future__ import annotations

import os

import pytest

from certagent.testing import HAPROXY, StackError, haproxy_build

NO_HAPROXY = {
    "test_acme_client",
    "test_api",
    "test_api_schemathesis",
    "test_bench_import_rate",
    "test_cert_ls",
    "test_cli_cluster",
    "test_import_bulk",
    "test_packaging",
    "test_redisha_harness",
    "test_renewal_schedule",
    "test_store_datakeys",
    "test_store_issuance_directory",
    "test_store_issuance_redis",
    "test_store_redis",
    "test_store_redis_bulk",
    "test_store_redis_ha",
}
RUNTIME_API = {
    "test_crash_safety",
    "test_dual_certs",
    "test_fallback",
    "test_haproxy_lifecycle",
    "test_hostile_sni",
    "test_init",
    "test_lazy_load",
    "test_scale",
    "test_versions",
}

HEAVY = {
    "test_acme_renewal",
    "test_acme_retry_after",
    "test_api_scopes",  # the REST API's authorization: nothing of it changes with HAProxy
    "test_api_tls",
    "test_bench_issuance",
    "test_bench_million",
    "test_bench_renewal",
    "test_bench_smoke",
    "test_bench_soak",
    "test_datakeys",
    "test_demo",
    "test_failover",
    "test_filter_snapshot",
    "test_flood.py::test_a_flood_of_random_names_never_reaches_the_store",
    "test_live.py::test_bulk_import_of_10000_with_a_corrupt_file",
    "test_scale.py::test_status_json_with_thousands_of_loaded_slots_answers_in_full",
}

OWN_BUILDS = {"test_bench_versions", "test_bench_http3"}


def pytest_report_header(config: pytest.Config) -> list[str]:
    where = (
        "CERTAGENT_TEST_HAPROXY" if os.environ.get("CERTAGENT_TEST_HAPROXY") else "PATH's haproxy"
    )
    try:
        build = haproxy_build().describe()
    except StackError as exc:
        build = f"does not run: {exc}"
    lines = [f"HAProxy under test: {build} ({HAPROXY}, from {where})"]
    chosen = config.getoption("markexpr")
    if chosen:
        lines.append(f"tests chosen by -m {chosen!r} (marks: tests/conftest.py)")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        if module in NO_HAPROXY:
            item.add_marker(pytest.mark.no_haproxy)
        if module in RUNTIME_API:
            item.add_marker(pytest.mark.runtime_api)
        function = getattr(item, "originalname", item.name)
        if module in HEAVY or f"{module}.py::{function}" in HEAVY:
            item.add_marker(pytest.mark.heavy)
        if module in OWN_BUILDS:
            item.add_marker(pytest.mark.own_builds)


@pytest.fixture(autouse=True)
def _haproxy_forbidden_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a ``no_haproxy`` test, starting HAProxy (here or in a child process) fails."""
    if request.node.get_closest_marker("no_haproxy") is not None:
        monkeypatch.setenv("CERTAGENT_TEST_NO_HAPROXY", request.node.nodeid)
