"""The verdict on issue 29's "Must show" and the Markdown table of one soak."""

from __future__ import annotations

from typing import Any

from bench.soak.clients import OUTCOMES
from bench.soak.disruptions import AGENT_DOWN, KINDS

ORDERS_TOLERANCE = 0.05


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Each check with its figure and whether it holds; ``pass`` if all do."""
    table = result["handshakes"]["by_outcome_and_disruption"]
    renewal = result["renewal"]
    expired = sum(table["expired"].values())
    wrong_outside = sum(n for k, n in table["wrong"].items() if k != AGENT_DOWN)
    failed_outside = sum(n for k, n in table["failed"].items() if k != AGENT_DOWN)
    overdue_store = renewal["overdue_at_end"]["behind"]  # overdue or expired, each name once
    overdue_status = sum((s.get("renewal") or {}).get("overdue", 0) or 0 for s in renewal["status"])
    ratio = renewal["orders_over_expected"]
    checks = {
        "expired_handshakes": {"value": expired, "ok": expired == 0},
        "wrong_outside_agent_down": {"value": wrong_outside, "ok": wrong_outside == 0},
        "failed_outside_agent_down": {"value": failed_outside, "ok": failed_outside == 0},
        "overdue_at_end": {
            "value": overdue_store,
            "status_overdue": overdue_status,
            "ok": overdue_store == 0 and overdue_status == 0,
        },
        "orders_within_5pct_of_expected": {
            "value": ratio,
            "ok": ratio is not None and abs(ratio - 1.0) <= ORDERS_TOLERANCE,
        },
        "renewed": {
            "value": renewal["orders"] - renewal["issuances"],
            "ok": renewal["orders"] > renewal["issuances"],
        },
        "no_errors": {"value": len(result["errors"]), "ok": not result["errors"]},
    }
    return {"pass": all(c["ok"] for c in checks.values()), "checks": checks}


def _status_lines(status: list[dict[str, Any]]) -> list[str]:
    """Each node's ``status`` renewal section at the end: its plain figures, whatever they are."""
    lines = []
    for node in status:
        section = node.get("renewal") or {}
        figures = {k: v for k, v in section.items() if not isinstance(v, (dict, list))}
        shown = ", ".join(f"{k} {v}" for k, v in figures.items()) or node.get("error", "none")
        lines.append(f"- node{node['node']} `status` renewal: {shown}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    meta, cfg, hs = result["meta"], result["config"], result["handshakes"]
    m = meta["machine"]
    ren = result["renewal"]
    lines = [
        f"# Soak, {meta['date']}: {cfg['minutes']} min, {cfg['nodes']} nodes",
        "",
        f"Revision {meta['revision']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['haproxy']},"
        f" {m['redis']}, Python {m['python']}. {cfg['names']} on-demand names on pebble"
        f" ({cfg['lifetime']} s certificates), {cfg['imported']} imported, capacity"
        f" {cfg['capacity']} per node, {cfg['clients']} verifying clients,"
        f" store {'Sentinel' if cfg['sentinel'] else 'Redis'}, faults"
        f" {'on' if cfg['faults'] else 'off'}. Agent defaults except the CA.",
        "",
        f"**Verdict: {'PASS' if result['verdict']['pass'] else 'FAIL'}**",
        "",
        "| check | value | ok |",
        "|---|---:|---|",
    ]
    for name, check in result["verdict"]["checks"].items():
        lines.append(f"| {name} | {check['value']} | {'yes' if check['ok'] else 'NO'} |")
    lines += [
        "",
        f"## Handshakes: {hs['total']:,} ({result['handshakes_per_s']} /s)",
        "",
        "| outcome | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for outcome in OUTCOMES:
        row = hs["by_outcome_and_disruption"][outcome]
        lines.append(f"| {outcome} | " + " | ".join(f"{row[k]:,}" for k in KINDS) + " |")
    lines += [
        "",
        f"Disruption windows: {len(result['disruptions'])}"
        f" ({', '.join(f'{k} {v}' for k, v in result['faults_done'].items())}).",
        "",
        "## Renewal",
        "",
        f"{ren['orders']} orders at pebble for {ren['orders_expected']} expected"
        f" ({ren['issuances']} issuances + {ren['renewals_due_estimate']} renewals due under the"
        f" jittered schedule, one every {ren['renewal_period_s']} s per name; floor()"
        f" {ren.get('renewals_due_floor')}): ratio {ren['orders_over_expected']}."
        f" Overdue at the end (grace {ren['overdue_at_end']['grace_s']} s):"
        f" {ren['overdue_at_end']['overdue']}, expired while scheduled"
        f" {ren['overdue_at_end']['expired']}. Agent warnings: {ren['log_warnings']}.",
        "",
        *_status_lines(ren["status"]),
        "",
        "## Processes",
        "",
        "| process | RSS first / last / min / max MB | warm slope MB/10 min | last 10 vs prev 10 MB"
        " | fds | CPU s | PIDs |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for role, s in result["processes"].items():
        r = s["rss_mb"]
        lines.append(
            f"| {role} | {r['first']} / {r['last']} / {r['min']} / {r['max']}"
            f" | {s['rss_slope_mb_per_10min_warm']} | {s['last10_vs_prev10_mb']}"
            f" | {s['fds']['min']}-{s['fds']['max']} | {s['cpu_seconds']} | {s['pids']} |"
        )
    return "\n".join(lines) + "\n"
