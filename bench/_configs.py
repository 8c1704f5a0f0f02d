"""HAProxy configurations the benchmarks run.

* :func:`preload_config` -- the baseline certagent replaces: one TLS bind with a
  crt-list of N certificates, loaded at startup.
* :func:`with_plain_frontend` -- the generated certagent configuration plus a
  second, plain TLS frontend preloading the same certificates from files, for
  the hop scenario (same process, so the same CPU counters).
* :func:`plain_preload` -- the generated configuration without certagent: fe_tls
  on the public port preloading every certificate, no Lua and no hop (the floor of
  ``bench.versions --preload``).
* :func:`plain_preload_http3` -- the same for a ``certagent init --http3`` configuration:
  fe_tls's QUIC bind preloads the certificates too (``bench.http3``'s floor).
* :data:`VARIANTS` -- rewrites of the generated configuration that might make
  the hop cheaper; each is a function of the generated text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

PRELOAD_TEMPLATE = """\
# certagent bench: HAProxy preloading {count} certificates from one crt-list
global
    log stdout format raw local0 notice
    stats socket {admin_socket} mode 600 level admin
    stats timeout 1d
    ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
    log global
    option dontlognull
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend fe_preload
    mode http
    bind 127.0.0.1:{port} ssl crt {default_cert} crt-list {crt_list} alpn h2,http/1.1
    default_backend be_app

backend be_app
    mode http
    http-request return status 200 content-type text/plain string "ok\\n"
"""


def preload_config(
    path: Path, *, port: int, admin_socket: str, default_cert: Path, crt_list: Path, count: int
) -> Path:
    path.write_text(
        PRELOAD_TEMPLATE.format(
            count=count,
            port=port,
            admin_socket=admin_socket,
            default_cert=default_cert,
            crt_list=crt_list,
        )
    )
    return path


def _fe_tls_bind(cfg: str) -> re.Match[str]:
    match = re.search(r"^\s+bind [ua]\S+ (?:mode 600 )?(?:accept-proxy )?(ssl .*)$", cfg, re.M)
    if match is None:
        raise ValueError("no fe_tls bind line in the generated configuration")
    return match


def with_plain_frontend(cfg: str, port: int, crt_list: Path) -> str:
    """Add ``fe_plain``: ``bind 127.0.0.1:<port>`` with fe_tls's ssl options, preloading
    ``crt_list`` (files holding the same certificates the agent loads from the store).

    It cannot share certagent's crt-list: with two binds on one crt-list, HAProxy
    2.6 answers ``add ssl crt-list`` with ``Inserting certificate ... in crt-list
    '...'..`` (one dot per bind), which the agent does not accept as success.
    """
    ssl_options = re.sub(r"crt-list \S+", f"crt-list {crt_list}", _fe_tls_bind(cfg).group(1))
    return cfg.rstrip("\n") + (
        "\n\n# certagent bench: the same certificates on a plain TLS bind, no hop\n"
        "frontend fe_plain\n"
        "    mode http\n"
        f"    bind 127.0.0.1:{port} {ssl_options}\n"
        "    default_backend be_app\n"
    )


def plain_preload(cfg: str, port: int, crt_list: Path) -> str:
    """The generated configuration less certagent: no ``lua-load``, no fe_sni and no hop;
    fe_tls binds ``127.0.0.1:<port>`` itself and preloads ``crt_list``.  Everything else
    (global tuning, TLS settings, ticket keys, logging, be_app) stays as generated, so a
    storm measures the same HAProxy doing only the TLS handshakes."""
    cfg = re.sub(r"^\s*lua-load(?:-per-thread)? \S+\n", "", cfg, flags=re.M)
    for name in ("fe_sni", "be_certagent_tls"):
        start, end = _section(cfg, name)
        cfg = cfg[: cfg.rfind("\n", 0, start - 1) + 1] + cfg[end:]
    bind = _fe_tls_bind(cfg)
    ssl_options = re.sub(r"crt-list \S+", f"crt-list {crt_list}", bind.group(1))
    line = bind.group(0)
    return cfg.replace(line, line[: line.index("bind ")] + f"bind 127.0.0.1:{port} {ssl_options}")


def plain_preload_http3(cfg: str, port: int, crt_list: Path) -> str:
    """:func:`plain_preload` of an ``init --http3`` configuration: the QUIC bind preloads
    ``crt_list`` too, and counts no use in fe_sni's table (there is none); the Alt-Svc
    header stays (a preloading HAProxy announces HTTP/3 just the same)."""
    cfg = plain_preload(cfg, port, crt_list)
    cfg = re.sub(
        r"^(\s+bind quic\S+ .*)crt-list \S+", rf"\g<1>crt-list {crt_list}", cfg, flags=re.M
    )
    return re.sub(r"^\s+tcp-request session track-sc0 .*table fe_sni.*\n", "", cfg, flags=re.M)


# --- hop variants ------------------------------------------------------------------------


def _section(cfg: str, name: str) -> tuple[int, int]:
    """Start and end offsets of the ``frontend|backend <name>`` section's body."""
    match = re.search(rf"^(?:frontend|backend) {re.escape(name)}\n", cfg, re.M)
    if match is None:
        raise ValueError(f"no section {name} in the configuration")
    end = re.search(r"^\S", cfg[match.end() :], re.M)
    return match.end(), match.end() + (end.start() if end else len(cfg) - match.end())


def _add_to_section(cfg: str, name: str, line: str, after: str = "    mode tcp\n") -> str:
    start, end = _section(cfg, name)
    body = cfg[start:end]
    if after not in body:
        raise ValueError(f"{after.strip()!r} not in section {name}")
    return cfg[:start] + body.replace(after, after + line + "\n", 1) + cfg[end:]


def _global(cfg: str, line: str) -> str:
    return cfg.replace("\nglobal\n", f"\nglobal\n{line}\n", 1)


def splice(cfg: str) -> str:
    """``option splice-auto`` on both sides of the tcp hop (fe_sni and be_certagent_tls)."""
    cfg = _add_to_section(cfg, "fe_sni", "    option splice-auto")
    return _add_to_section(cfg, "be_certagent_tls", "    option splice-auto")


def fewer_rules(cfg: str) -> str:
    """A loaded host tracked and accepted before the Lua rule is even looked at.

    Generated (a loaded host: hello-type twice, the slot variable twice, accept last)::

        set-var(txn.certagent_slot) req.ssl_sni,lower,table_gpt0(fe_sni) if { hello }
        lua ... if { req.ssl_hello_type 1 } !{ var(txn.certagent_slot) -m int gt 0 }
        track-sc0 req.ssl_sni,lower if { var(txn.certagent_slot) -m int gt 0 }
        accept if { req.ssl_hello_type 1 }

    Variant (a loaded host stops at rule 3)::

        set-var(...) ; track-sc0 ... if { slot > 0 } ; accept if { sc0_tracked } ; lua ...
    """
    lua = re.search(r"^    tcp-request content lua\.\S+ \S+ \d+ if .*$", cfg, re.M)
    track = re.search(r"^    tcp-request content track-sc0 .*$", cfg, re.M)
    if lua is None or track is None or track.start() < lua.start():
        raise ValueError("the generated fe_sni rules are not as expected")
    fast = track.group(0) + "\n    tcp-request content accept if { sc0_tracked }\n" + lua.group(0)
    cfg = cfg.replace(track.group(0) + "\n", "", 1)
    return cfg.replace(lua.group(0), fast, 1)


def nbthread1(cfg: str) -> str:
    """``nbthread 1`` (HAProxy 2.6 defaults to one thread per CPU: 2 here)."""
    return _global(cfg, "    nbthread 1")


def bufsize32k(cfg: str) -> str:
    """``tune.bufsize 32768`` instead of 16384."""
    return re.sub(r"tune\.bufsize \d+", "tune.bufsize 32768", cfg, count=1)


def abns(cfg: str) -> str:
    """The hop on an abstract socket (measured only: abns@ has no access control)."""
    server = re.search(r"server fe_tls unix@(\S+)", cfg)
    if server is None:
        raise ValueError("no unix@ hop in the configuration")
    path = server.group(1)
    name = "certagent-bench-" + re.sub(r"[^A-Za-z0-9]", "-", path)[-60:]
    cfg = cfg.replace(f"unix@{path} mode 600", f"abns@{name}", 1)
    return cfg.replace(f"unix@{path}", f"abns@{name}", 1)


def edge_triggered(cfg: str) -> str:
    """``tune.fd.edge-triggered on`` (experimental in 2.6: fewer epoll_ctl calls)."""
    return _global(cfg, "    expose-experimental-directives\n    tune.fd.edge-triggered on")


def no_proxy_v2(cfg: str) -> str:
    """For measurement only: the hop without the PROXY v2 header (fe_tls loses the client
    address)."""
    cfg = cfg.replace(" send-proxy-v2", "", 1)
    return cfg.replace(" accept-proxy", "", 1)


def no_track(cfg: str) -> str:
    """For measurement only: no usage tracking (the agent's LRU needs it)."""
    return re.sub(r"^    tcp-request content track-sc0 .*\n", "", cfg, count=1, flags=re.M)


def baseline(cfg: str) -> str:
    return cfg


VARIANTS: dict[str, Callable[[str], str]] = {
    "baseline": baseline,
    "fewer-rules": fewer_rules,
    "splice-auto": splice,
    "bufsize-32k": bufsize32k,
    "nbthread-1": nbthread1,
    "edge-triggered": edge_triggered,
    "abns": abns,
    "no-proxy-v2": no_proxy_v2,
    "no-track": no_track,
}

#: Variants that change what certagent relies on: measured to explain the cost, not to adopt.
INFORMATIVE = {"abns", "no-proxy-v2", "no-track"}
