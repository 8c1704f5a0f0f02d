"""The Markdown report of one run of the preload comparison (the JSON is the source)."""

from __future__ import annotations

from typing import Any


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _opt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else _fmt(value, digits)


def _churn_breakdown(churn: dict[str, Any]) -> list[str]:
    """What of the churn's RSS change is the TLS session cache filling (runs since run 4)."""
    cache = churn.get("certagent_session_cache_mb")
    if not cache:
        return []
    return [
        f"Of that RSS, HAProxy's shared TLS session cache (`tune.ssl.cachesize`, filled by every"
        f" new session up to its fixed size) went from {cache[0]} to {cache[1]} MB; without it"
        f" the largest deviation from round 1 is"
        f" {churn['certagent_max_deviation_without_session_cache_pct']} %. Usage stick-table"
        f" entries after the last round: {churn['usage_table_entries_last']:,}.",
        "",
    ]


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"x{ratio}"


def _ok(flag: bool) -> str:
    return "met" if flag else "**missed**"


def _run(result: dict[str, Any]) -> list[str]:
    """What ran where: the command, the revision, the machine, the certificates."""
    meta = result["meta"]
    machine = meta["machine"]
    return [
        f"# certagent benchmark, {meta['date']} ({meta['mode']}, {meta['key_type']})",
        "",
        f"`{meta['command']}` at {meta.get('revision', '?')} — {meta['duration_s']:.0f} s."
        f" Machine: {machine['nproc']} CPUs "
        f"({machine['cpu_model']}), {machine['mem_total_gb']} GB RAM, Linux {machine['kernel']}; "
        f"{machine['haproxy']}; {machine['redis']}; Python {machine['python']}.",
        "",
        f"Certificates: {meta['certificates']}",
        "",
        f"Storm client and warm-host prober: {meta.get('storm_client', 'Python asyncio')}.",
        "",
    ]


def _targets(result: dict[str, Any]) -> list[str]:
    """Each target, measured, met or not; what limits those missed."""
    targets = result["targets"]
    out = [
        "## Targets (issue 4), measured in this run",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    for row in targets.values():
        out.append(f"| {row['target']} | {row['measured']} | {_ok(row['met'])} |")
    missed = [row for row in targets.values() if not row["met"] and row.get("limit")]
    if missed:
        out += ["", "What limits the targets missed in this run:", ""]
        out += [f"- {row['target']}: {row['limit']}." for row in missed]
    return out


def _startup(result: dict[str, Any]) -> list[str]:
    """Scenario 1."""
    startup = result["startup"]
    out = [
        "",
        "## 1. Startup: process start to the first verified handshake of a random host",
        "",
        "| certificates | preload | preload RSS | certagent | certagent HAProxy RSS"
        " | agent RSS | speed-up |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in startup["rows"]:
        out.append(
            f"| {r['n']:,} | {_fmt(r['preload_s'])} s | {_fmt(r['preload_rss_mb'], 1)} MB"
            f" | {_fmt(r['certagent_s'], 3)} s | {_fmt(r['certagent_haproxy_rss_mb'], 1)} MB"
            f" | {_fmt(r['certagent_agent_rss_mb'], 1)} MB | x{_fmt(r['speedup'], 0)} |"
        )
    return out


def _churn(result: dict[str, Any]) -> list[str]:
    """Scenario 2."""
    churn = result["churn"]
    out = [
        "",
        f"## 2. Memory under churn: capacity {churn['capacity']:,}, {churn['store_hosts']:,}"
        f" hosts in the store, {churn['rounds']} rounds of {churn['hosts_per_round']:,} distinct"
        " hosts",
        "",
        f"certagent HAProxy worker RSS: {churn['certagent_empty_rss_mb']} MB empty, "
        f"{churn['certagent_rss_after_round1_mb']} MB after round 1 (pool full), "
        f"{churn['certagent_rss_last_mb']} MB after round {churn['rounds']}; largest deviation"
        f" from round 1: {churn['certagent_max_deviation_pct']} %. Preload (all "
        f"{result['startup']['rows'][-1]['n']:,} certificates): {churn['preload_rss_mb']} MB, "
        f"largest deviation {churn['preload_max_deviation_pct']} %.",
        "",
        *_churn_breakdown(churn),
        "| round | certagent RSS MB | of it TLS session cache MB | usage-table entries"
        " | preload RSS MB | slots used | recycles"
        " | verified handshakes (cold / warm / preload) | ensure not ok |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sample = churn["handshakes_sampled_per_round"]
    for r in churn["per_round"]:
        out.append(
            f"| {r['round']} | {r['certagent_rss_mb']}"
            f" | {_opt(r.get('certagent_session_cache_mb'))}"
            f" | {_opt(r.get('usage_table_entries'), 0)}"
            f" | {r['preload_rss_mb']} | {r['slots_used']}"
            f" | {r['recycles']} | {r['cold_handshakes_ok']}/{sample} · "
            f"{r['warm_handshakes_ok']}/{sample} · {r['preload_handshakes_ok']}/{sample}"
            f" | {r['ensure_other']} |"
        )
    return out


def _cold_warm(result: dict[str, Any]) -> list[str]:
    """Scenario 3."""
    cold_warm = result["cold_warm"]
    out = [
        "",
        f"## 3. Cold vs warm: {cold_warm['hosts']:,} never-seen hosts, one at a time"
        f" ({cold_warm['failures']} failures)",
        "",
        "| handshake latency (ms) | p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (
        ("certagent, cold (first connection)", "certagent_cold_ms"),
        ("certagent, warm (second connection)", "certagent_warm_ms"),
        ("preload", "preload_ms"),
        ("added by the cold load (cold - warm, per host)", "added_ms"),
    ):
        v = cold_warm[key]
        out.append(f"| {label} | {v['p50']} | {v['p90']} | {v['p99']} | {v['max']} |")
    return out


def _storm(result: dict[str, Any]) -> list[str]:
    """Scenario 4, and the agent's counters meanwhile."""
    storm = result["storm"]
    out = [
        "",
        f"## 4. Cold storm: {storm['certagent']['hosts']:,} distinct new hosts started within "
        f"{storm['spread_s']} s, {storm['concurrency']} at once",
        "",
        "| | verified | launch span | handshake p50 / p90 / p99 ms | warm host p99 idle → "
        "during ms | warm ratio | CPU ms per new host: HAProxy · agent | failures |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, key in (
        ("certagent (load_batch 32, the default)", "certagent"),
        ("certagent (load_batch 1)", "certagent_batch_1"),
        ("preload", "preload"),
    ):
        v = storm[key]
        lat = v["latency_ms"]
        errors = ", ".join(f"{k}: {n}" for k, n in v["errors"].items()) or "none"
        cpu = v.get("cpu", {})
        out.append(
            f"| {label} | {v['verified']}/{v['hosts']} ({v['success_pct']} %) | "
            f"{v['launch_span_s']} s | {lat['p50']} / {lat['p90']} / {lat['p99']} | "
            f"{v['warm_idle_ms']['p99']} → {v['warm_during_ms']['p99']} | "
            f"x{v['warm_p99_ratio']} | {_opt(cpu.get('haproxy_cpu_ms_per_host'))} · "
            f"{_opt(cpu.get('agent_cpu_ms_per_host'))} | {errors} |"
        )

    for label, key in (("load_batch 32", "certagent"), ("load_batch 1", "certagent_batch_1")):
        counters = storm[key].get("agent_counters")
        if counters:
            listed = ", ".join(f"{k} {v}" for k, v in counters.items())
            out += ["", f"Agent counters during the storm ({label}): {listed}."]
    return out


def _hop(result: dict[str, Any]) -> list[str]:
    """Scenario 5, one row per configuration variant."""
    hop = result["hop"]
    out = [
        "",
        "## 5. Steady-state cost of the hop (HAProxy CPU per operation)",
        "",
        f"{hop['hosts']} loaded hosts; per run {hop['new_connections_per_run']:,} new TLS "
        f"connections, or {hop['keepalive_connections']} connections x "
        f"{hop['keepalive_requests_per_connection']:,} keep-alive requests; {hop['pairs']} A/B "
        "pairs per variant; ratio = median of paired (certagent path ÷ plain bind). CPU = "
        "utime+stime of the worker (/proc/<pid>/stat); the schedstat column is the same ratio "
        "from nanosecond on-CPU time.",
        "",
        "| variant | new conn: certagent µs | plain µs | ratio | (schedstat) | keep-alive "
        "req: certagent µs | plain µs | ratio | (schedstat) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in hop["variants"].items():
        n, k = v["new_connection"], v["keepalive_request"]
        label = f"{name} (measure only)" if v.get("informative_only") else name
        out.append(
            f"| {label} | {n['certagent_us']} | {n['plain_us']} | {_x(n['ratio'])} | "
            f"{_x(n['sched_ratio'])} | {k['certagent_us']} | {k['plain_us']} | "
            f"{_x(k['ratio'])} | {_x(k['sched_ratio'])} |"
        )
    return out


SECTIONS = (_run, _targets, _startup, _churn, _cold_warm, _storm, _hop)


def markdown(result: dict[str, Any], plot_name: str | None) -> str:
    """The report: the run, the targets, then one section per scenario."""
    out: list[str] = []
    for section in SECTIONS:
        out += section(result)
    if plot_name:
        out += ["", f"![benchmark plot]({plot_name})"]
    out += ["", "Raw figures: the JSON file beside this one.", ""]
    return "\n".join(out)
