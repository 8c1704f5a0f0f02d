"""Fixtures for the integration tests: a real Redis, HAProxy and ``certagent run``.

The processes themselves are managed by :mod:`certagent.testing` (shared with the
demo and the benchmarks); this file only wraps them in fixtures:

* ``redis_store`` -- a session-wide ``redis-server``, flushed for each test, with
  ``.url``, ``.key_file`` and ``.put(bundles)``.
* ``sentinel_set``, ``cluster_set`` -- a session-wide Sentinel set (1 master, 1
  replica, 3 sentinels) and a 3-master Redis Cluster, started only when a test
  asks for them; ``any_store`` (indirectly parametrized with ``plain``,
  ``sentinel`` or ``cluster``) is a flushed store of that kind.
* ``pki`` -- a session-wide test CA (root file for clients) that issues leaves.
* ``make_stack(store, capacity=..., fallback=..., env=..., init_args=...)`` -- ``certagent init``
  into a fresh directory, then HAProxy and the agent (debug log), as a
  :class:`~certagent.testing.Stack`.  Every stack is stopped by PID after the test;
  a failed test prints the log tails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from certagent.testing import (
    PKI,
    REDIS_SERVER,
    SLOT_PREFIX,
    Prober,
    RedisFixture,
    RedisProcess,
    Stack,
    write_key_file,
)
from certagent.testing.redisha import ClusterSet, SentinelSet

# Test modules import these names from here as well as from certagent.testing.
__all__ = [
    "PKI",
    "SLOT_PREFIX",
    "STORE_KINDS",
    "Prober",
    "RedisFixture",
    "Stack",
    "StackFactory",
]

StackFactory = Callable[..., Stack]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the session on a free loopback port; yields its URL."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    server = RedisProcess(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data-key file for stores that encrypt private keys (``key_file`` setting)."""
    return write_key_file(tmp_path_factory.mktemp("keys") / "certagent.keys")


@pytest.fixture
def redis_store(redis_server: str, key_file: Path) -> RedisFixture:
    """The session's Redis, emptied for this test."""
    fixture = RedisFixture(redis_server, key_file)
    fixture.flushall()
    return fixture


@pytest.fixture(scope="session")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """1 master, 1 replica and 3 sentinels for the session (a failover test makes its own)."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    with SentinelSet(tmp_path_factory.mktemp("sentinel")) as sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def cluster_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterSet]:
    """A 3-master Redis Cluster for the session."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    with ClusterSet(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


STORE_KINDS = ("plain", "sentinel", "cluster")


@pytest.fixture
def any_store(request: pytest.FixtureRequest, key_file: Path) -> RedisFixture:
    """A flushed store of the kind in ``request.param``: plain, sentinel or cluster."""
    kind = request.param
    if kind == "plain":
        fixture: RedisFixture = request.getfixturevalue("redis_store")
        return fixture
    ha: SentinelSet | ClusterSet = request.getfixturevalue(f"{kind}_set")
    fixture = RedisFixture(ha.url, key_file, flusher=ha.flushall)
    fixture.flushall()
    return fixture


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI.create(tmp_path_factory.mktemp("pki") / "root.pem", "certagent integration CA")


@pytest.fixture
def make_stack(
    tmp_path: Path, pki: PKI, key_file: Path, request: pytest.FixtureRequest
) -> Iterator[StackFactory]:
    """Build, start and (always) stop stacks: ``make_stack(store_url, capacity=100, ...)``."""
    stacks: list[Stack] = []

    def factory(
        store: str,
        *,
        capacity: int = 100,
        fallback: str = "default-cert",
        env: Mapping[str, str] | None = None,
        start: bool = True,
        init_args: Sequence[str] = (),
        port: int | None = None,
        address: str = "127.0.0.1",
        agent_cmd: Sequence[str] | None = None,
    ) -> Stack:
        stack = Stack.create(
            tmp_path / f"stack{len(stacks)}",
            store=store,
            cafile=pki.cafile,
            key_file=key_file,
            capacity=capacity,
            fallback=fallback,
            env={"CERTAGENT_LOG_LEVEL": "debug", **(env or {})},
            init_args=init_args,
            port=port,
            address=address,
            agent_cmd=agent_cmd,
        )
        stacks.append(stack)
        if start:
            stack.start_haproxy()
            stack.start_agent()
        return stack

    try:
        yield factory
    finally:
        report = getattr(request.node, "rep_call", None)
        with contextlib.ExitStack() as cleanup:  # closes every stack even if one fails to
            for stack in stacks:
                cleanup.callback(stack.close)
                if report is not None and report.failed:
                    print(stack.log_tails())  # shown under "Captured stdout teardown"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
