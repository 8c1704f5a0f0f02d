"""The issuance bench's Markdown report."""

from __future__ import annotations

from typing import Any


def _fig(figure: dict[str, Any], unit: str = " ms", digits: int = 0) -> str:
    """``median [min, max]`` of one figure's repeats."""
    if figure.get("median") is None:
        return "?"
    return (
        f"{figure['median']:.{digits}f}{unit} "
        f"[{figure['min']:.{digits}f}, {figure['max']:.{digits}f}]"
    )


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    m, sizes, setup = meta["machine"], meta["sizes"], meta["setup"]
    lines = [
        f"# Issuance on first connection, {meta['date']} ({'smoke' if meta['smoke'] else 'full'})",
        "",
        f"Revision {meta['revision']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['haproxy']}, "
        f"{m['redis']}, Python {m['python']}, pebble {meta['pebble']}; "
        f"{meta.get('seconds', '?')} s in all; load average (1, 5, 15 min)"
        f" {meta.get('load_average_at_start')} at the start,"
        f" {meta.get('load_average_at_end')} at the end.",
        "",
        f"One node (HAProxy + agent + Redis) and pebble on loopback; {setup['pebble']};"
        f" {setup['challenge']}; {setup['key_type']} keys; {setup['allowed_by']};"
        f" acme_concurrency {setup['acme_concurrency']}. Per repeat and variant"
        f" {sizes['names']} never-seen names; {sizes['repeats']} repeats. Each figure is the"
        " median of the repeats [min, max]. **First connection**: from connect() to a TLS"
        " handshake verified against pebble's root, hostname checked. **CA alone**: the same"
        " number of orders placed directly with certagent.acme, HTTP-01 answered through the"
        " same HAProxy's map, from newOrder to the downloaded chain. **Overhead**: first"
        " connection minus CA alone, within each repeat. CPU: on-CPU time from"
        " /proc/<pid>/task/*/schedstat divided by the certificates of the phase.",
        "",
        "| variant | first connection p50 | p99 | CA alone p50 | p99 | overhead p50 | p99 |"
        " verified | orders per name |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in ("sequential", "concurrent"):
        v = result.get(variant)
        if not v:
            continue
        label = "one at a time" if v["workers"] == 1 else f"{v['workers']} at once"
        fc, ca, over = v["first_connection_ms"], v["ca_order_ms"], v["overhead_ms"]
        lines.append(
            f"| {label} | {_fig(fc['p50'])} | {_fig(fc['p99'])} | {_fig(ca['p50'])} |"
            f" {_fig(ca['p99'])} | {_fig(over['p50'])} | {_fig(over['p99'])} |"
            f" {v['verified']} / {v['asked']} | {v['orders_per_name']} |"
        )
    lines += [
        "",
        "## CPU per issuance (ms)",
        "",
        "| variant | phase | agent | HAProxy worker | Redis | pebble | pebble DNS |"
        " bench's ACME client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in ("sequential", "concurrent"):
        v = result.get(variant)
        if not v:
            continue
        for phase, key in (
            ("first connection", "cpu_ms_per_issuance"),
            ("CA alone", "cpu_ms_per_direct_order"),
        ):
            cpu = v[key]
            cells = " | ".join(
                _fig(cpu[p], "", 1) if p in cpu else "-"
                for p in ("agent", "haproxy", "redis", "pebble", "pebble_dns", "acme_client")
            )
            lines.append(f"| {variant} | {phase} | {cells} |")
    lines += [
        "",
        "## Where a first connection's time goes (p50 ms)",
        "",
        "From the agent's debug log and the client's clock (bench/issuance/breakdown.py):"
        " **to order** = connect, ClientHello, Lua, permission, lease, order slot and newOrder;"
        " **order** = the rest of the ACME order (challenge published through the store, the"
        " nodes' acks, validation, finalize, download); **store** = validate and store the"
        " certificate; **load** = into HAProxy; **handshake** = the held connection completes."
        " **CA alone, same span** = the direct orders from newOrder's answer to the download.",
        "",
        "| variant | to order | order | store | load | handshake | CA alone, same span |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in ("sequential", "concurrent"):
        v = result.get(variant)
        if not v or not v.get("breakdown_p50_ms"):
            continue
        b = v["breakdown_p50_ms"]
        cells = " | ".join(
            _fig(b[f"{k}_p50_ms"], "", 1) if f"{k}_p50_ms" in b else "?"
            for k in ("to_order", "order", "store", "load", "handshake", "direct_order")
        )
        lines.append(f"| {variant} | {cells} |")
    problems = [
        f"- {variant}: {v['fallback']} fallback, {v['failed']} failed first connections,"
        f" {v['ca_failed']} failed direct orders"
        for variant in ("sequential", "concurrent")
        if (v := result.get(variant)) and (v["fallback"] or v["failed"] or v["ca_failed"])
    ]
    lines += ["", "## Problems", "", *(problems or ["none"]), ""]
    lines += [
        "Reproduce: `.venv/bin/python -m bench.issuance` (`--smoke` for a quick check;"
        " `--names`, `--repeats`, `--workers`, `--concurrency`, `--log-level`).",
        "",
    ]
    return "\n".join(lines)
