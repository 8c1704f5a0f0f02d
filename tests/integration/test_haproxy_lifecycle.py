"""HAProxy reloads and restarts: the agent notices and hosts keep working; ``certagent check``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from certagent.testing import PKI, RedisFixture, Stack, wait_for
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

HOSTS = [f"site{i}.reload.test" for i in range(3)]


def wait_noticed(stack: Stack, before: dict[str, Any], new_pid: int) -> dict[str, Any]:
    """Wait (at most 5 s) until the agent talks to ``new_pid`` and has re-read its state.

    The first request from the new worker names its pid; the agent moves to it
    (``loader.resets`` + 1) and adopts its (empty) state: ``loader.adoptions`` + 1.
    """

    def noticed() -> dict[str, Any] | None:
        st = stack.status()
        if (
            st["haproxy_pid"] == new_pid
            and st["loader"]["adoptions"] > before["loader"]["adoptions"]
        ):
            return st
        return None

    return wait_for(noticed, 5.0, f"the agent to notice HAProxy pid {new_pid}", interval=0.05)


def assert_hosts_served(stack: Stack) -> None:
    for host in HOSTS:
        assert stack.handshake(host).san == (host,), host
    assert stack.consistency_problems() == []


def test_reload_and_restart_are_noticed(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle(h) for h in HOSTS])
    stack = make_stack(redis_store.url, capacity=10)
    assert_hosts_served(stack)
    first_pid = stack.status()["haproxy_pid"]

    # Reload: SIGUSR2 to the master; the new worker starts without runtime state.
    # Loaded hosts are asked for at once, before the agent's watcher may have looked.
    before = stack.status()
    started = time.monotonic()
    reloaded_pid = stack.reload_haproxy()
    for host in HOSTS:
        assert stack.handshake(host).san == (host,), host
    after = wait_noticed(stack, before, reloaded_pid)
    noticed_reload = time.monotonic() - started
    print(f"reload noticed after {noticed_reload:.3f} s")
    assert reloaded_pid != first_pid
    assert noticed_reload < 2.0
    assert after["loader"]["resets"] == before["loader"]["resets"] + 1
    assert after["slots_used"] == len(HOSTS)  # reloaded into the new worker, no leftovers
    assert_hosts_served(stack)

    # Restart: stop HAProxy completely, start it again.
    before = stack.status()
    stack.stop_haproxy()
    started = time.monotonic()
    restarted_pid = stack.start_haproxy()
    for host in HOSTS:
        assert stack.handshake(host).san == (host,), host
    wait_noticed(stack, before, restarted_pid)
    noticed_restart = time.monotonic() - started
    print(f"restart noticed {noticed_restart:.3f} s after HAProxy was up again")
    assert noticed_restart < 2.0
    assert_hosts_served(stack)
    assert stack.status()["haproxy_pid"] == restarted_pid
    # each host was loaded into each of the three workers: by a client or by the re-warm
    final = stack.status()
    assert final["loader"]["loads"] == 3 * len(HOSTS)
    assert final["ensure"]["reloads"] == 2 and final["rewarm"]["rewarms"] == 2


def test_check_command(make_stack: StackFactory, redis_store: RedisFixture) -> None:
    stack = make_stack(redis_store.url, capacity=10)

    up = stack.cli("check")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "FAIL" not in up.stdout

    stack.stop_haproxy()
    down = stack.cli("check")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "FAIL  HAProxy" in down.stdout
