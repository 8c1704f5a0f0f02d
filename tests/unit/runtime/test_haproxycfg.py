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


def test_http3_adds_quic_binds_usage_tracking_and_alt_svc() -> None:
    assert "quic4@" not in render_haproxy_cfg(LAYOUT) and "limited-quic" not in render_haproxy_cfg(
        LAYOUT
    )
    cfg = render_haproxy_cfg(
        replace(
            LAYOUT,
            bind="192.0.2.7:443",
            tls_keys=Path("/etc/certagent/tls.keys"),
            http3_max_age=900,
        )
    )
    assert "$" not in cfg.replace("$cfg", "")
    assert (
        "    bind quic4@192.0.2.7:443 ssl crt /etc/certagent/default.pem"
        " crt-list /etc/certagent/certagent.crtlist tls-ticket-keys /etc/certagent/tls.keys"
        " alpn h3\n" in cfg
    )
    # the QUIC bind sits in fe_tls, with the TCP side's certificates
    assert cfg.index("frontend fe_tls") < cfg.index("quic4@") < cfg.index("backend be_app")
    # QUIC connections count as uses of loaded hosts in fe_sni's table
    assert (
        "tcp-request session track-sc0 ssl_fc_sni,lower table fe_sni if { ssl_fc_alpn -m str h3 }"
        " { ssl_fc_sni,lower,table_gpt0(fe_sni) -m int gt 0 }" in cfg
    )
    assert (
        'http-after-response set-header alt-svc "h3=\\":443\\"; ma=900"'
        " unless { res.hdr(alt-svc) -m found }" in cfg
    )
    assert ".if feature(QUIC_OPENSSL_COMPAT)\n    limited-quic\n.endif\n\ndefaults" in cfg


def test_an_ipv6_bind_gets_a_quic6_listener() -> None:
    cfg = render_haproxy_cfg(replace(LAYOUT, bind="[::]:8443", http3_max_age=3600))
    assert "    bind quic6@[::]:8443 ssl crt " in cfg
    assert 'alt-svc "h3=\\":8443\\"; ma=3600"' in cfg
