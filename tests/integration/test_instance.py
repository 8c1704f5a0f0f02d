"""One agent per HAProxy, signals, and the health commands' exit statuses."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from certagent.testing import PKI, RedisFixture, certagent_argv, cli_start_seconds, wait_for
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration


def test_a_second_agent_exits_at_once_and_the_first_keeps_serving(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle(h) for h in ("one.inst.test", "two.inst.test")])
    stack = make_stack(redis_store.url, capacity=10)
    assert stack.handshake("one.inst.test").san == ("one.inst.test",)
    first = stack.agent
    assert first is not None
    start_cost = cli_start_seconds(stack.env)  # this machine's cost of starting the CLI now
    started = time.monotonic()
    second = subprocess.run(
        [*certagent_argv(), "run", "--config", str(stack.config_path)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=10,
    )
    took = time.monotonic() - started
    assert second.returncode == 1, second.stderr
    # "at once": it waits for nothing beyond starting Python (was < 2.0 s absolute, which a
    # loaded machine's slower start alone could exceed; then start_cost + 1 s, which a
    # machine at load 12 exceeded with 7.3 s against 5.6 s). Waiting on anything (a lock,
    # a timeout of the store or of HAProxy) would cost whole seconds beyond this bound.
    assert took < 2 * start_cost + 1.0, (took, start_cost)
    assert f"another certagent (pid {first.pid}) already serves this HAProxy" in second.stderr
    # the first agent's socket is still there and it still loads new hosts
    assert os.path.exists(stack.settings.agent_socket)
    assert stack.handshake("two.inst.test").san == ("two.inst.test",)
    assert first.poll() is None


def test_sighup_keeps_the_agent_and_names_what_needs_a_restart(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle("hup.inst.test")])
    stack = make_stack(redis_store.url, capacity=10, env={"CERTAGENT_LOG_LEVEL": "info"})
    agent = stack.agent
    assert agent is not None
    text = stack.config_path.read_text().replace('log_level = "info"', 'log_level = "debug"')
    stack.config_path.write_text(text.replace("capacity = 10", "capacity = 11"))
    os.kill(agent.pid, signal.SIGHUP)
    wait_for(lambda: "SIGHUP:" in stack.agent_log() or None, 5.0, "the SIGHUP log line")
    time.sleep(0.2)
    assert agent.poll() is None
    log = stack.agent_log()
    assert "SIGHUP: capacity changed in the config file; they apply after a restart" in log
    # the environment still wins over the file (CERTAGENT_LOG_LEVEL=info): nothing else
    assert stack.handshake("hup.inst.test").san == ("hup.inst.test",)
    assert agent.poll() is None


def test_status_and_check_fail_when_something_is_down(
    make_stack: StackFactory, redis_store: RedisFixture
) -> None:
    stack = make_stack(redis_store.url, capacity=10)
    assert stack.cli("status").returncode == 0
    stack.stop_haproxy()
    status = stack.cli("status")
    assert status.returncode == 1, status.stdout + status.stderr
    assert "haproxy        DOWN" in status.stdout
    assert "haproxy down" in status.stderr
    stack.start_haproxy()
    stack.stop_agent()
    check = stack.cli("check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "FAIL  agent" in check.stdout
    assert "FAIL  HAProxy" not in check.stdout
