"""The Markdown report and the plot of one benchmark run (the JSON is the source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _fmt(value: float, digits: int = 2) -> str:
    return f"{value:,.{digits}f}"


def _opt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else _fmt(value, digits)


def _churn_breakdown(c: dict[str, Any]) -> list[str]:
    """What of the churn's RSS change is the TLS session cache filling (runs since run 4)."""
    cache = c.get("certagent_session_cache_mb")
    if not cache:
        return []
    return [
        f"Of that RSS, HAProxy's shared TLS session cache (`tune.ssl.cachesize`, filled by every"
        f" new session up to its fixed size) went from {cache[0]} to {cache[1]} MB; without it"
        f" the largest deviation from round 1 is"
        f" {c['certagent_max_deviation_without_session_cache_pct']} %. Usage stick-table entries"
        f" after the last round: {c['usage_table_entries_last']:,}.",
        "",
    ]


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"x{ratio}"


def _ok(flag: bool) -> str:
    return "met" if flag else "**missed**"


def markdown(result: dict[str, Any], plot_name: str | None) -> str:
    meta = result["meta"]
    m = meta["machine"]
    out = [
        f"# certagent benchmark, {meta['date']} ({meta['mode']}, {meta['key_type']})",
        "",
        f"`{meta['command']}` at {meta.get('revision', '?')} — {meta['duration_s']:.0f} s."
        f" Machine: {m['nproc']} CPUs "
        f"({m['cpu_model']}), {m['mem_total_gb']} GB RAM, Linux {m['kernel']}; "
        f"{m['haproxy']}; {m['redis']}; Python {m['python']}.",
        "",
        f"Certificates: {meta['certificates']}",
        "",
        f"Storm client and warm-host prober: {meta.get('storm_client', 'Python asyncio')}.",
        "",
    ]
    t = result["targets"]
    out += [
        "## Targets (issue 4), measured in this run",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    for row in t.values():
        out.append(f"| {row['target']} | {row['measured']} | {_ok(row['met'])} |")
    missed = [row for row in t.values() if not row["met"] and row.get("limit")]
    if missed:
        out += ["", "What limits the targets missed in this run:", ""]
        out += [f"- {row['target']}: {row['limit']}." for row in missed]

    s = result["startup"]
    out += [
        "",
        "## 1. Startup: process start to the first verified handshake of a random host",
        "",
        "| certificates | preload | preload RSS | certagent | certagent HAProxy RSS"
        " | agent RSS | speed-up |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in s["rows"]:
        out.append(
            f"| {r['n']:,} | {_fmt(r['preload_s'])} s | {_fmt(r['preload_rss_mb'], 1)} MB"
            f" | {_fmt(r['certagent_s'], 3)} s | {_fmt(r['certagent_haproxy_rss_mb'], 1)} MB"
            f" | {_fmt(r['certagent_agent_rss_mb'], 1)} MB | x{_fmt(r['speedup'], 0)} |"
        )

    c = result["churn"]
    out += [
        "",
        f"## 2. Memory under churn: capacity {c['capacity']:,}, {c['store_hosts']:,} hosts in the"
        f" store, {c['rounds']} rounds of {c['hosts_per_round']:,} distinct hosts",
        "",
        f"certagent HAProxy worker RSS: {c['certagent_empty_rss_mb']} MB empty, "
        f"{c['certagent_rss_after_round1_mb']} MB after round 1 (pool full), "
        f"{c['certagent_rss_last_mb']} MB after round {c['rounds']}; largest deviation from "
        f"round 1: {c['certagent_max_deviation_pct']} %. Preload (all "
        f"{result['startup']['rows'][-1]['n']:,} certificates): {c['preload_rss_mb']} MB, "
        f"largest deviation {c['preload_max_deviation_pct']} %.",
        "",
        *_churn_breakdown(c),
        "| round | certagent RSS MB | of it TLS session cache MB | usage-table entries"
        " | preload RSS MB | slots used | recycles"
        " | verified handshakes (cold / warm / preload) | ensure not ok |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sample = c["handshakes_sampled_per_round"]
    for r in c["per_round"]:
        out.append(
            f"| {r['round']} | {r['certagent_rss_mb']}"
            f" | {_opt(r.get('certagent_session_cache_mb'))}"
            f" | {_opt(r.get('usage_table_entries'), 0)}"
            f" | {r['preload_rss_mb']} | {r['slots_used']}"
            f" | {r['recycles']} | {r['cold_handshakes_ok']}/{sample} · "
            f"{r['warm_handshakes_ok']}/{sample} · {r['preload_handshakes_ok']}/{sample}"
            f" | {r['ensure_other']} |"
        )

    cw = result["cold_warm"]
    out += [
        "",
        f"## 3. Cold vs warm: {cw['hosts']:,} never-seen hosts, one at a time"
        f" ({cw['failures']} failures)",
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
        v = cw[key]
        out.append(f"| {label} | {v['p50']} | {v['p90']} | {v['p99']} | {v['max']} |")

    st = result["storm"]
    out += [
        "",
        f"## 4. Cold storm: {st['certagent']['hosts']:,} distinct new hosts started within "
        f"{st['spread_s']} s, {st['concurrency']} at once",
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
        v = st[key]
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
        counters = st[key].get("agent_counters")
        if counters:
            listed = ", ".join(f"{k} {v}" for k, v in counters.items())
            out += ["", f"Agent counters during the storm ({label}): {listed}."]

    h = result["hop"]
    out += [
        "",
        "## 5. Steady-state cost of the hop (HAProxy CPU per operation)",
        "",
        f"{h['hosts']} loaded hosts; per run {h['new_connections_per_run']:,} new TLS "
        f"connections, or {h['keepalive_connections']} connections x "
        f"{h['keepalive_requests_per_connection']:,} keep-alive requests; {h['pairs']} A/B "
        "pairs per variant; ratio = median of paired (certagent path ÷ plain bind). CPU = "
        "utime+stime of the worker (/proc/<pid>/stat); the schedstat column is the same ratio "
        "from nanosecond on-CPU time.",
        "",
        "| variant | new conn: certagent µs | plain µs | ratio | (schedstat) | keep-alive "
        "req: certagent µs | plain µs | ratio | (schedstat) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, v in h["variants"].items():
        n, k = v["new_connection"], v["keepalive_request"]
        label = f"{name} (measure only)" if v.get("informative_only") else name
        out.append(
            f"| {label} | {n['certagent_us']} | {n['plain_us']} | {_x(n['ratio'])} | "
            f"{_x(n['sched_ratio'])} | {k['certagent_us']} | {k['plain_us']} | "
            f"{_x(k['ratio'])} | {_x(k['sched_ratio'])} |"
        )
    if plot_name:
        out += ["", f"![benchmark plot]({plot_name})"]
    out += ["", "Raw figures: the JSON file beside this one.", ""]
    return "\n".join(out)


def plot(result: dict[str, Any], path: Path) -> bool:
    """Write the four-panel PNG; False if matplotlib is not installed (``.[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    rows = result["startup"]["rows"]
    ns = [r["n"] for r in rows]

    ax = axes[0][0]
    ax.plot(ns, [r["preload_s"] for r in rows], "o-", label="preload")
    ax.plot(ns, [r["certagent_s"] for r in rows], "s-", label="certagent")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="certificates",
        ylabel="seconds",
        title="1. start to first verified handshake",
    )
    ax.legend()

    ax = axes[0][1]
    ax.plot(ns, [r["preload_rss_mb"] for r in rows], "o-", label="preload")
    ax.plot(ns, [r["certagent_haproxy_rss_mb"] for r in rows], "s-", label="certagent HAProxy")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="certificates",
        ylabel="worker RSS (MB)",
        title="1. HAProxy RSS after start",
    )
    ax.legend()

    ax = axes[0][2]
    c = result["churn"]
    rounds = [r["round"] for r in c["per_round"]]
    ax.plot(rounds, [r["preload_rss_mb"] for r in c["per_round"]], "o-", label="preload")
    ax.plot(rounds, [r["certagent_rss_mb"] for r in c["per_round"]], "s-", label="certagent")
    ax.set(
        yscale="log",
        xlabel="round",
        ylabel="worker RSS (MB)",
        title=f"2. churn: capacity {c['capacity']}, {c['hosts_per_round']} new hosts/round",
    )
    ax.legend()

    ax = axes[1][0]
    cw = result["cold_warm"]
    labels = ["p50", "p90", "p99"]
    x = range(len(labels))
    for i, (key, label) in enumerate(
        (
            ("certagent_cold_ms", "certagent cold"),
            ("certagent_warm_ms", "certagent warm"),
            ("preload_ms", "preload"),
        )
    ):
        ax.bar([j + i * 0.27 for j in x], [cw[key][p] for p in labels], 0.27, label=label)
    ax.set_xticks([j + 0.27 for j in x], labels)
    ax.set(ylabel="handshake ms", title="3. cold vs warm, one at a time")
    ax.legend()

    ax = axes[1][1]
    st = result["storm"]
    keys = [
        ("certagent", "certagent\nbatch 32"),
        ("certagent_batch_1", "certagent\nbatch 1"),
        ("preload", "preload"),
    ]
    x = range(len(keys))
    ax.bar(
        [j - 0.2 for j in x],
        [st[k]["warm_idle_ms"]["p99"] for k, _ in keys],
        0.4,
        label="warm host p99, idle",
    )
    ax.bar(
        [j + 0.2 for j in x],
        [st[k]["warm_during_ms"]["p99"] for k, _ in keys],
        0.4,
        label="warm host p99, during storm",
    )
    for j, (k, _) in enumerate(keys):
        ax.annotate(f"{st[k]['success_pct']:.0f}% ok", (j, 0), ha="center", va="bottom")
    ax.set_xticks(list(x), [label for _, label in keys])
    ax.set(ylabel="ms", title=f"4. storm of {st['certagent']['hosts']} new hosts")
    ax.legend()

    ax = axes[1][2]
    v = result["hop"]["variants"]
    names = list(v)
    x = range(len(names))
    ax.bar(
        [j - 0.2 for j in x],
        [v[n]["new_connection"]["ratio"] or 0 for n in names],
        0.4,
        label="per new TLS connection",
    )
    ax.bar(
        [j + 0.2 for j in x],
        [v[n]["keepalive_request"]["ratio"] or 0 for n in names],
        0.4,
        label="per keep-alive request",
    )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set(
        ylabel="HAProxy CPU, certagent ÷ plain",
        ylim=(0.8, None),
        title="5. cost of the hop, by config variant",
    )
    ax.legend()

    meta = result["meta"]
    fig.suptitle(
        f"certagent vs preload — {meta['date']}, {meta['mode']}, {meta['key_type']}, "
        f"{meta['machine']['nproc']} CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
