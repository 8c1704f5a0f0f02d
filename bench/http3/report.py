"""The Markdown report of ``python -m bench.http3``."""

from __future__ import annotations

from typing import Any

ROWS = (
    ("h3_keepalive", "HTTP/3 keep-alive request"),
    ("h3_handshake", "HTTP/3 full handshake (new QUIC connection, one GET)"),
    ("tcp_keepalive", "TCP keep-alive request (HTTP/1.1 over TLS)"),
    ("tcp_handshake", "TCP full handshake (new TLS connection, one GET)"),
)


def markdown(result: dict[str, Any]) -> str:
    meta, sizes, summary = result["meta"], result["sizes"], result["summary"]
    build = meta["haproxy_build"] or {}
    lines = [
        f"# bench.http3 — {meta['date']} ({meta['revision']})",
        "",
        f"HAProxy {build.get('version', '?')} ({build.get('openssl', '?')}) at"
        f" `{meta['haproxy_binary']}`, both sides; {sizes['hosts']} hosts, ECDSA P-256;"
        f" {meta['machine']['nproc']} CPUs ({meta['machine']['cpu_model']}).",
        "certagent: `certagent init --http3`, every host loaded by a TCP connection first."
        " Preload: the same binary and generated configuration less certagent, every"
        " certificate in a crt-list on the TCP and the QUIC bind.",
        f"{sizes['repeats']} repeats; in each, one window per figure in which the two sides"
        " take turns operation by operation (the CPU of both read at the same instants);"
        " HAProxy worker CPU per operation (every thread, schedstat), median of each side;"
        " the ratio is the median of the per-window ratios, [min, max] beside it.",
        "",
        "| per | certagent µs | preload µs | ratio | [min, max] | with agent + Redis |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for key, label in ROWS:
        s = summary[key]
        lines.append(
            f"| {label} | {s['certagent_us']} | {s['preload_us']} | x{s['ratio']}"
            f" | [{s['ratio_min']}, {s['ratio_max']}] | x{s['ratio_all_processes']} |"
        )
    ops = (
        f"Per side and window: HTTP/3 {sizes['h3_requests']} requests over"
        f" {sizes['h3_connections']} connections, {sizes['h3_handshakes']} handshakes; TCP"
        f" {sizes['tcp_requests']} requests over {sizes['tcp_connections']} connections,"
        f" {sizes['tcp_handshakes']} handshakes (every one a full handshake). The HTTP/3"
        " client is aioquic (pure Python): only HAProxy's CPU is counted, never the client's."
    )
    lines += ["", ops, ""]
    return "\n".join(lines)
