"""The HAProxy side of ``certagent init``: haproxy.cfg and the Lua action, from templates.

Pure rendering, no I/O beyond reading the packaged templates
(``runtime/templates/``, which are links to the repository's top-level
``haproxy/`` and ``lua/`` folders).  docs/haproxy.md explains the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from certagent.runtime.tlspolicy import INTERMEDIATE, TlsPolicy, tls_lines

# The Lua action waits for the agent's answer this long beyond the agent's hold, and the
# connection's inspect-delay leaves this much more, so that the agent always answers first.
LUA_MARGIN_MS = 1000
INSPECT_MARGIN_MS = 1000


@dataclass(frozen=True)
class HAProxyLayout:
    """Everything haproxy.cfg names: paths, the public bind and the policies."""

    cfg_path: Path
    lua_path: Path
    run_dir: Path
    crt_list: str
    agent_socket: str
    default_cert: Path
    bind: str
    capacity: int
    usage_expire_ms: int
    fallback: str  # "default-cert" or "reject"
    backend: str | None  # host:port of the operator's HTTP backend; None = built-in 200
    bufsize: int
    hold: float  # seconds a new host's connection may wait for the agent
    log_target: str = "stdout format raw"  # HAProxy's `log` target (see log_target())
    user: str | None = None  # workers run as this user; it owns the unix sockets
    tls_keys: Path | None = None  # the fleet's session-ticket keys, kept by the agent
    tls: TlsPolicy = INTERMEDIATE  # protocol versions, ciphers and curves of fe_tls
    # on-demand issuance: fe_http on this address answers HTTP-01 from the challenge map
    # (and redirects everything else to https); TLS-ALPN-01 validations skip the Lua action
    http_bind: str | None = None
    challenge_map: Path | None = None
    acme_alpn: bool = False
    # HTTP/3 (certagent init --http3): QUIC binds on ``bind`` beside the TCP one, announced
    # to TCP clients with this Alt-Svc max-age (s); None = no HTTP/3
    http3_max_age: int | None = None


@dataclass(frozen=True)
class HAProxyNames:
    """Names the generated haproxy.cfg gives to what the agent edits."""

    crt_list: str
    usage_table: str
    usage_expire_ms: int


def log_target(value: str) -> str:
    """HAProxy's ``log`` target for ``certagent init --log``: ValueError if unusable.

    ``stdout`` or ``stderr`` (raw lines, for a supervisor such as systemd's journal),
    an absolute path (a syslog unix socket, e.g. ``/dev/log``) or ``HOST:PORT``
    (syslog over UDP).
    """
    if value in ("stdout", "stderr"):
        return f"{value} format raw"
    if value.startswith("/") and " " not in value and len(value) < 100:
        return value
    host, sep, port = value.rpartition(":")
    if sep and host and port.isdigit() and 0 < int(port) < 65536 and " " not in host:
        return value
    raise ValueError(
        f"log target {value!r}: use stdout, stderr, a syslog socket path (/dev/log) or HOST:PORT"
    )


def template(name: str) -> str:
    """A packaged template's text: ``haproxy.cfg.tmpl`` or ``certagent.lua``."""
    return resources.files("certagent.runtime").joinpath("templates", name).read_text()


def lua_source() -> str:
    """The Lua action HAProxy loads (``lua-load``)."""
    return template("certagent.lua")


def render_haproxy_cfg(layout: HAProxyLayout) -> str:
    """haproxy.cfg for ``layout``: fe_sni (mode tcp, SNI peek) -> fe_tls (TLS, crt-list)."""
    if layout.fallback == "reject":
        fallback_rule = (
            "    # fallback = reject: close connections whose certificate could not be loaded\n"
            "    tcp-request content reject if { var(txn.certagent) -m found } "
            "!{ var(txn.certagent) -m str ok }"
        )
    else:
        fallback_rule = (
            "    # fallback = default-cert: connections whose certificate could not be\n"
            "    # loaded continue and are served the default certificate"
        )
    if layout.backend is None:
        app_backend = '    http-request return status 200 content-type text/plain string "ok\\n"'
    else:
        app_backend = f"    server app {layout.backend}"
    lua_timeout_ms = round(layout.hold * 1000) + LUA_MARGIN_MS
    acme_alpn_rule = (
        "    # ACME TLS-ALPN-01: the CA's validation (it offers only acme-tls/1) goes straight\n"
        "    # to fe_tls, where a challenge slot answers it; it never asks the agent\n"
        "    tcp-request content accept if { req.ssl_hello_type 1 } { req.ssl_alpn acme-tls/1 }\n"
        if layout.acme_alpn
        else ""
    )
    return Template(template("haproxy.cfg.tmpl")).substitute(
        cfg_path=layout.cfg_path,
        crt_list=layout.crt_list,
        run_dir=layout.run_dir,
        lua_path=layout.lua_path,
        bufsize=layout.bufsize,
        bind=layout.bind,
        inspect_delay_ms=lua_timeout_ms + INSPECT_MARGIN_MS,
        # loaded hosts (wildcards add some) and unmarked ones a live connection still holds
        table_size=max(4 * layout.capacity, 1000),
        usage_expire_ms=layout.usage_expire_ms,
        agent_socket=layout.agent_socket,
        lua_timeout_ms=lua_timeout_ms,
        fallback_rule=fallback_rule,
        default_cert=layout.default_cert,
        app_backend=app_backend,
        log_target=layout.log_target,
        global_user=f"    user {layout.user}\n    group {layout.user}\n" if layout.user else "",
        socket_owner=f" user {layout.user} group {layout.user}" if layout.user else "",
        tls_ticket_keys=f" tls-ticket-keys {layout.tls_keys}" if layout.tls_keys else "",
        tls_settings=tls_lines(layout.tls),
        acme_alpn_rule=acme_alpn_rule,
        http_frontend=_http_frontend(layout),
        quic_global=_quic_global(layout),
        quic_frontend=_quic_frontend(layout),
    )


def quic_bind_address(bind: str) -> str:
    """``bind``'s address as a QUIC listener: ``quic4@ADDR:PORT`` or ``quic6@[ADDR]:PORT``."""
    host, _, port = bind.rpartition(":")
    family = "quic6" if ":" in host else "quic4"
    return f"{family}@{host}:{port}"


def _quic_global(layout: HAProxyLayout) -> str:
    """``limited-quic`` where HAProxy's QUIC runs on OpenSSL's compatibility layer (3.0)."""
    if layout.http3_max_age is None:
        return ""
    lines = [
        "    # HTTP/3: a build whose QUIC runs on OpenSSL's compatibility layer (Debian 13's 3.0)",
        "    # serves QUIC only with limited-quic (no 0-RTT); builds on a TLS library with its",
        "    # own QUIC support (3.2 on OpenSSL 3.5+) do not need it",
        ".if feature(QUIC_OPENSSL_COMPAT)",
        "    limited-quic",
        ".endif",
    ]
    return "\n".join(lines) + "\n"


def _quic_frontend(layout: HAProxyLayout) -> str:
    """fe_tls's QUIC binds, their usage tracking and the Alt-Svc announcement."""
    if layout.http3_max_age is None:
        return ""
    port = layout.bind.rpartition(":")[2]
    keys = f" tls-ticket-keys {layout.tls_keys}" if layout.tls_keys else ""
    loaded = "{ ssl_fc_sni,lower,table_gpt0(fe_sni) -m int gt 0 }"
    lines = [
        "    # HTTP/3 (certagent init --http3): QUIC on the public address, with the same",
        "    # crt-list, default certificate and ticket keys as the TCP side, and no hop: a host",
        "    # certagent has loaded is served at once; any other gets the default certificate,",
        "    # the client fails that handshake and comes back over TCP, which loads the host",
        f"    bind {quic_bind_address(layout.bind)} ssl crt {layout.default_cert}"
        f" crt-list {layout.crt_list}{keys} alpn h3",
        "    # QUIC connections never cross fe_sni: count each in its table as a use of its host,",
        "    # so that a host served only over HTTP/3 is not recycled as idle",
        "    tcp-request session track-sc0 ssl_fc_sni,lower table fe_sni"
        f" if {{ ssl_fc_alpn -m str h3 }} {loaded}",
        "    # tell clients that HTTP/3 is here; max-age: docs/haproxy.md#http3",
        f'    http-after-response set-header alt-svc "h3=\\":{port}\\"; ma={layout.http3_max_age}"'
        " unless { res.hdr(alt-svc) -m found }",
    ]
    return "\n".join(lines) + "\n"


def _http_frontend(layout: HAProxyLayout) -> str:
    """``fe_http``: ACME HTTP-01 answers from the challenge map, a redirect for the rest."""
    if layout.http_bind is None or layout.challenge_map is None:
        return ""
    answer = f"path,field(4,/),map({layout.challenge_map})"
    challenge = "{ path_beg /.well-known/acme-challenge/ }"
    lines = [
        "",
        "frontend fe_http",
        "    # ACME HTTP-01: certagent adds each challenge the fleet is validating to this map",
        "    # at runtime, on every node; everything else goes to https",
        "    mode http",
        f"    bind {layout.http_bind}",
        f'    http-request return status 200 content-type text/plain lf-string "%[{answer}]"'
        f" if {challenge} {{ {answer} -m found }}",
        '    http-request return status 404 content-type text/plain string "no such challenge\\n"'
        f" if {challenge}",
        "    http-request redirect scheme https code 301",
    ]
    return "\n".join(lines) + "\n"
