"""The issue's table from one run's result: every figure per N, the ratio large/small, targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], float | None], str]


def _get(*path: str) -> Callable[[dict[str, Any]], float | None]:
    def get(side: dict[str, Any]) -> float | None:
        value: Any = side
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return None if value is None else float(value)

    return get


ROWS: list[Row] = [
    ("agent start → first verified handshake of a never-seen host, s (median)",
     _get("starts", "first_verified_handshake_s", "median"), "{:.3f}"),
    ("cold p50, ms", _get("serve", "cold_warm", "cold_ms", "p50"), "{:.2f}"),
    ("cold p99, ms", _get("serve", "cold_warm", "cold_ms", "p99"), "{:.2f}"),
    ("warm p50, ms", _get("serve", "cold_warm", "warm_ms", "p50"), "{:.2f}"),
    ("storm of 1,000 new hosts in 1 s: verified %, median",
     _get("serve", "storms", "verified_pct", "median"), "{:.1f}"),
    ("storm: p99 ms, median", _get("serve", "storms", "p99_ms", "median"), "{:.1f}"),
    ("agent start → name filter ready, s (median; from the snapshot)",
     _get("starts", "filter_ready_s", "median"), "{:.3f}"),
    ("first start after the import (no snapshot: rebuild) → filter ready, s",
     _get("first_start", "filter_ready_s"), "{:.2f}"),
    ("agent CPU, first 10 s after spawn, ms (median)",
     _get("starts", "agent_cpu_ms", "median"), "{:,.0f}"),
    ("Redis CPU, same 10 s, ms (median)", _get("starts", "redis_cpu_ms", "median"), "{:,.0f}"),
    ("HAProxy worker CPU, same 10 s, ms (median)",
     _get("starts", "haproxy_cpu_ms", "median"), "{:,.0f}"),
    ("agent RSS peak in its first 10 s, MB (median)",
     _get("starts", "agent_peak_rss_mb", "median"), "{:.1f}"),
    ("agent RSS peak over floods, cold hosts and storms, MB",
     _get("serve", "agent_peak_rss_mb"), "{:.1f}"),
    ("made-up names reaching Redis, flood from the agent's first second (median)",
     _get("floods", "at_start", "made_up_reaching_store", "median"), "{:,.0f}"),
    ("store lookups/s, flood at start, highest second (median)",
     _get("floods", "at_start", "max_lookups_per_s", "median"), "{:,.0f}"),
    ("made-up names reaching Redis, same flood on a settled agent (median)",
     _get("floods", "settled", "made_up_reaching_store", "median"), "{:,.0f}"),
    ("new real hosts' p99 during the flood at start, ms (median)",
     _get("floods", "at_start", "real_p99_ms", "median"), "{:.1f}"),
    ("new real hosts' p99 during the flood, settled agent, ms (median)",
     _get("floods", "settled", "real_p99_ms", "median"), "{:.1f}"),
    ("name filter size, bytes", _get("filter", "bytes"), "{:,.0f}"),
    ("name filter snapshot in Redis, bytes", _get("filter", "snapshot_bytes"), "{:,.0f}"),
    ("`cert ls`: wall time to the end, s", _get("cert_ls", "total_s", "median"), "{:.2f}"),
    ("`cert ls`: peak RSS, MB", _get("cert_ls", "peak_rss_mb", "median"), "{:.1f}"),
    ("`cert ls`: first line, s (median)",
     _get("cert_ls", "first_line_s", "median"), "{:.3f}"),
    ("`cert import`: certificates/s", _get("import", "rate_per_s"), "{:,.0f}"),
    ("`cert import`: rate over the first tenth, /s",
     _get("import", "rate_first_tenth_per_s"), "{:,.0f}"),
    ("`cert import`: rate over the last tenth, /s",
     _get("import", "rate_last_tenth_per_s"), "{:,.0f}"),
    ("`cert import`: importer peak RSS, MB", _get("import", "importer_peak_rss_mb"), "{:.1f}"),
    ("`cert import`: a validation worker's peak RSS, MB",
     _get("import", "worker_peak_rss_mb"), "{:.1f}"),
    ("Redis used_memory per certificate, bytes",
     _get("redis", "used_memory_per_cert"), "{:,.0f}"),
    ("Redis used_memory, MB", _get("redis", "used_memory_mb"), "{:,.0f}"),
    ("BGSAVE, s", _get("redis", "bgsave_s"), "{:.2f}"),
    ("RDB, MB", _get("redis", "rdb_mb"), "{:,.1f}"),
]  # fmt: skip


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: its value at each N and large / small."""
    sizes = sorted(result["sizes"], key=int)
    small, large = result["sizes"][sizes[0]], result["sizes"][sizes[-1]]
    rows = []
    for label, get, _ in ROWS:
        rows.append(
            {
                "figure": label,
                sizes[-1]: get(large),
                sizes[0]: get(small),
                "ratio": _ratio(get(large), get(small)),
            }
        )
    return rows


def must_show(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 21's Must show 1, 2 and 3, from the largest N (and its ratio to the smallest)."""
    sizes = sorted(result["sizes"], key=int)
    small, large = result["sizes"][sizes[0]], result["sizes"][sizes[-1]]
    cpu = _ratio(_get("starts", "agent_cpu_ms", "median")(large),
                 _get("starts", "agent_cpu_ms", "median")(small))  # fmt: skip
    at_start = _get("floods", "at_start", "max_lookups_per_s", "max")(large)
    settled = _get("floods", "settled", "max_lookups_per_s", "max")(large)
    p99 = _ratio(_get("floods", "at_start", "real_p99_ms", "median")(large),
                 _get("floods", "settled", "real_p99_ms", "median")(large))  # fmt: skip
    ls_rss = _get("cert_ls", "peak_rss_mb", "max")(large)
    ls_first = _get("cert_ls", "first_line_s", "median")(large)
    rate = _get("import", "rate_per_s")(large)
    imp_rss = _get("import", "importer_peak_rss_mb")(large)

    def check(value: float | None, ok: bool, limit: str) -> dict[str, Any]:
        return {"value": value, "limit": limit, "holds": value is not None and ok}

    return {
        "1_agent_cpu_ratio": check(cpu, cpu is not None and cpu <= 1.5, "≤ x1.5"),
        "1_flood_lookups_per_s_at_start": check(
            at_start,
            at_start is not None and at_start <= max(50.0, settled or 0.0),
            f"≤ 50/s and ≤ settled ({settled})",
        ),
        "1_real_p99_at_start_over_settled": check(p99, p99 is not None and p99 <= 2.0, "≤ x2"),
        "2_cert_ls_peak_rss_mb": check(ls_rss, ls_rss is not None and ls_rss <= 100, "≤ 100"),
        "2_cert_ls_first_line_s": check(ls_first, ls_first is not None and ls_first <= 1, "≤ 1"),
        "3_import_rate_per_s": check(rate, rate is not None and rate >= 10_000, "≥ 10,000"),
        "3_importer_peak_rss_mb": check(imp_rss, imp_rss is not None and imp_rss <= 150, "≤ 150"),
    }


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    m = meta["machine"]
    sizes = sorted(result["sizes"], key=int)
    small, large = sizes[0], sizes[-1]
    gen = meta["generation"]
    loads = ", ".join(f"{int(n):,}: {result['sizes'][n]['loadavg'][0]}" for n in sizes)
    lines = [
        f"# {int(large):,} vs {int(small):,} certificates in one run, {meta['date'][:10]}",
        "",
        f"`python -m bench.million {' '.join(meta['argv'])}` at {meta['revision']}:"
        f" {meta['seconds']:.0f} s in all ({gen['note']}). Machine: {m['nproc']} CPUs"
        f" ({m['cpu_model']}), {m['mem_total_gb']} GB, {m['haproxy']}, {m['redis']},"
        f" Python {m['python']}. Load average (1 min) at the start of each N:"
        f" {loads} (anything else running on the machine shows there).",
        "",
        "ECDSA P-256 leaves, each with its own key, one shared intermediate; imported with"
        " `certagent cert import` into a private redis-server; HAProxy on a free loopback port."
        f" Medians of {meta['plan']['repeats']} repeats where marked.",
        "",
        f"| figure | {int(large):,} | {int(small):,} | ratio |",
        "|---|---:|---:|---:|",
    ]
    for (label, _, fmt), row in zip(ROWS, table(result), strict=True):

        def show(v: float | None, fmt: str = fmt) -> str:
            return "-" if v is None else fmt.format(v)

        ratio = "-" if row["ratio"] is None else f"x{row['ratio']}"
        lines.append(f"| {label} | {show(row[large])} | {show(row[small])} | {ratio} |")
    lines += ["", "## Must show (issue 21), at the largest N", "",
              "| check | value | limit | holds |", "|---|---:|---|---|"]  # fmt: skip
    for name, c in result["must_show"].items():
        lines.append(f"| {name} | {c['value']} | {c['limit']} | {'yes' if c['holds'] else 'NO'} |")
    lines += ["", "Seconds per phase (1-min load average at its end):", ""]
    for n in sizes:
        loads = result["sizes"][n].get("loadavg_after_phase", {})
        phases = ", ".join(
            f"{k} {v:.0f}" + (f" (load {loads[k]})" if k in loads else "")
            for k, v in result["sizes"][n]["phase_s"].items()
        )
        lines.append(f"- {int(n):,}: {phases}")
    return "\n".join(lines) + "\n"
