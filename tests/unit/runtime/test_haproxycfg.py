"""haproxy.cfg rendering and the Lua action's template (pure, no HAProxy)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from certagent.runtime.haproxycfg import HAProxyLayout, log_target, lua_source, render_haproxy_cfg

LAYOUT = HAProxyLayout(
    cfg_path=Path("/etc/certagent/haproxy.cfg"),
    lua_path=Path("/etc/certagent/certagent.lua"),
    run_dir=Path("/run/certagent"),
    crt_list="/etc/certagent/certagent.crtlist",
    agent_socket="/run/certagent/agent.sock",
    default_cert=Path("/etc/certagent/default.pem"),
    bind=":8443",
    capacity=1000,
    usage_expire_ms=3_600_000,
    fallback="default-cert",
    backend=None,
    bufsize=16384,
    hold=5.0,
)


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("stdout", "stdout format raw"),
        ("stderr", "stderr format raw"),
        ("/dev/log", "/dev/log"),
        ("127.0.0.1:514", "127.0.0.1:514"),
        ("logs.example:1514", "logs.example:1514"),
    ],
)
def test_log_targets(value: str, target: str) -> None:
    assert log_target(value) == target


@pytest.mark.parametrize("value", ["syslog", "host:0", "host:70000", "/dev/log x", "a b:514", ""])
def test_unusable_log_targets_say_what_works(value: str) -> None:
    with pytest.raises(ValueError, match="stdout, stderr, a syslog socket path"):
        log_target(value)


def test_the_default_layout() -> None:
    cfg = render_haproxy_cfg(LAYOUT)
    assert "$" not in cfg.replace("$cfg", "")  # every placeholder filled
    assert "stick-table type string len 253 size 4000 expire 3600000ms store gpt0,conn_cnt" in cfg
    assert "stats socket /run/certagent/admin.sock mode 600 level admin" in cfg
    assert "tune.bufsize 16384" in cfg
    # the Lua action waits the hold plus a margin, the inspect-delay a margin more
    assert "lua.certagent_ensure /run/certagent/agent.sock 6000 " in cfg
    assert "tcp-request inspect-delay 7000ms" in cfg
    assert "crt-list /etc/certagent/certagent.crtlist alpn" in cfg
    assert "fallback = default-cert" in cfg and "tcp-request content reject if" not in cfg
    assert 'http-request return status 200 content-type text/plain string "ok\\n"' in cfg
    assert " tls-ticket-keys /" not in cfg
    assert "    user " not in cfg


def test_reject_a_backend_a_user_and_ticket_keys() -> None:
    cfg = render_haproxy_cfg(
        replace(
            LAYOUT,
            fallback="reject",
            backend="127.0.0.1:8080",
            user="haproxy",
            tls_keys=Path("/etc/certagent/tls.keys"),
            capacity=100,
        )
    )
    assert "tcp-request content reject if { var(txn.certagent) -m found }" in cfg
    assert "    server app 127.0.0.1:8080" in cfg
    assert "    user haproxy\n    group haproxy\n" in cfg
    assert "mode 600 user haproxy group haproxy level admin" in cfg
    assert "certagent.crtlist tls-ticket-keys /etc/certagent/tls.keys alpn" in cfg
    assert "size 1000 expire" in cfg  # at least 1000 entries, whatever the capacity


def test_the_lua_action_is_packaged() -> None:
    source = lua_source()
    assert "certagent_ensure" in source and 'collectgarbage("setpause", 100)' in source
