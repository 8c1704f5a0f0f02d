"""The Markdown report of one ``python -m bench.renewal`` run."""

from __future__ import annotations

from typing import Any


def _med(figure: dict[str, Any] | None) -> str:
    if not figure or figure.get("median") is None:
        return "?"
    return f"{figure['median']} (min {figure['min']}, max {figure['max']})"


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    m = meta["machine"]
    lines = [
        f"# Renewal bench, {meta['date']}" + (" (smoke sizes)" if meta["smoke"] else ""),
        "",
        f"Revision {meta['revision']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['haproxy']},"
        f" {m['redis']}, Python {m['python']}. Medians of {meta['sizes']['repeats']} runs"
        " (min, max).",
        "",
    ]
    idle = result.get("idle")
    if idle:
        lines += [
            "## At rest (`idle`)",
            "",
            f"One node with issuance on, nothing to do; {idle['window_s']} s windows. CPU from"
            " /proc/<pid>/task/*/schedstat (ns); utime+stime (10 ms ticks) over all windows as"
            " a cross-check in the JSON.",
            "",
            "| schedule | agent + HAProxy ms/s | agent | HAProxy (master + worker) | Redis |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, key in (
            ("empty", "empty"),
            (f"{idle['scheduled']:,} entries", "scheduled_entries"),
        ):
            row = idle[key]
            lines.append(
                f"| {label} | {_med(row['agent_plus_haproxy_ms_per_s'])}"
                f" | {_med(row['agent_ms_per_s'])} | {_med(row['haproxy_ms_per_s'])}"
                f" | {_med(row['redis_ms_per_s'])} |"
            )
        lines += [
            "",
            f"Entries spread over {idle['spread_days']} days, the first due"
            f" {idle['first_due_in_s']} s after the last window (none due while measured);"
            " each name has a stored record (not loaded; the renewer reads only due entries)."
            f" Target ≤ {idle['target_ms_per_s']} ms/s: {'met' if idle['met'] else 'NOT met'}.",
            "",
        ]
    thr = result.get("throughput")
    if thr:
        lines += [
            "## Renewals per second against pebble (`throughput`)",
            "",
            f"{thr['names']} certificates made due at once, budget off"
            " (pebble with `PEBBLE_VA_NOSLEEP=1`, HTTP-01 through the node's HAProxy):"
            f" **{_med(thr['renewals_per_s'])} renewals/s**, a round in {_med(thr['round_s'])} s;"
            f" orders at pebble per round {thr['orders_at_pebble_per_round']}.",
            "",
        ]
    return "\n".join(lines)
