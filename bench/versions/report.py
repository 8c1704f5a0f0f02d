"""Medians and spreads per build, ratios to the first build, targets, and the Markdown."""

from __future__ import annotations

from typing import Any

from bench._load import percentile
from bench.scale.common import ratio, spread

#: Per-cell figures summarised per build (median, min, max, runs) and their digits.
FIGURES = {
    "haproxy_ms_per_host": 3,
    "agent_ms_per_host": 3,
    "storm_s": 2,
    "served_after_last_arrival_s": 2,
    "warm_p99_ratio": 2,
    "warm_idle_p99_ms": 2,
    "warm_during_p99_ms": 2,
    "warm_idle_samples": 0,
    "warm_during_samples": 0,
    "warm_p90_ratio": 2,
    "haproxy_net_ms_per_host": 3,
    "haproxy_probe_ms_per_s": 1,
    "prober_cpu_pct_idle": 1,
    "prober_cpu_pct_storm": 1,
    "failed": 0,
    "wrong_cert": 0,
    "machine_busy_pct": 1,
}
#: Figures compared with the first build, repeat by repeat (build / first).
RATIOS = (
    "haproxy_ms_per_host",
    "haproxy_net_ms_per_host",
    "agent_ms_per_host",
    "storm_s",
    "warm_p99_ratio",
)

#: Must show 5 of issue 18: (build, figure, limit, what it means).
TARGETS = (
    ("3.2", "haproxy_ms_per_host", 0.9, "HAProxy CPU per new host <= 0.9 ms"),
    ("3.2", "ratio:haproxy_ms_per_host", 0.6, "HAProxy CPU per new host <= x0.6 of 2.6's"),
    ("3.2", "warm_p99_ratio", 6.0, "warm-host p99 during the storm <= x6 of idle"),
    ("2.6", "haproxy_ms_per_host", 1.8, "no worse than before (1.5-1.8 ms per new host)"),
    ("2.6", "warm_p99_ratio", 13.0, "no worse than before (warm p99 x10-13 of idle)"),
    # the same, HAProxy's CPU less the warm prober's share and the p99 over pooled repeats
    ("3.2", "haproxy_net_ms_per_host", 0.9, "as above, less the prober's share"),
    ("3.2", "ratio:haproxy_net_ms_per_host", 0.6, "as above, less the prober's share"),
    ("3.2", "pooled:ratio", 6.0, "warm p99 <= x6 of idle, every repeat's samples pooled"),
    ("2.6", "haproxy_net_ms_per_host", 1.8, "as above, less the prober's share"),
    ("2.6", "pooled:ratio", 13.0, "warm p99 x10-13 of idle, every repeat's samples pooled"),
)


def summarise(rows: list[dict[str, Any]], labels: list[str]) -> dict[str, Any]:
    """Per build: each figure's spread over repeats, ratios to ``labels[0]`` paired by repeat."""
    out: dict[str, Any] = {}
    first = {r["repeat"]: r for r in rows if r["build"] == labels[0]}
    for label in labels:
        mine = [r for r in rows if r["build"] == label]
        entry: dict[str, Any] = {
            name: spread(
                [float(r[name] if r.get(name) is not None else "nan") for r in mine], digits
            )
            for name, digits in FIGURES.items()
        }
        entry["loadavg_1m"] = spread([max(r["loadavg_1m"]) for r in mine], 2)
        entry["warm_pooled"] = pooled(mine)
        if label != labels[0]:
            entry["ratio_to_" + labels[0]] = {
                name: spread(
                    [
                        r[name] / first[r["repeat"]][name]
                        for r in mine
                        if r["repeat"] in first and r.get(name) and first[r["repeat"]].get(name)
                    ],
                    2,
                )
                for name in RATIOS
            }
        out[label] = entry
    return out


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm host's p99 over every repeat's samples together, idle and during the storms."""
    idle = [x for r in rows for x in r.get("warm_samples_ms", {}).get("idle", [])]
    during = [x for r in rows for x in r.get("warm_samples_ms", {}).get("during", [])]
    p99 = {
        name: round(percentile(xs, 99), 2) if xs else None
        for name, xs in (("idle", idle), ("during", during))
    }
    return {
        "idle_samples": len(idle),
        "during_samples": len(during),
        "idle_p99_ms": p99["idle"],
        "during_p99_ms": p99["during"],
        "ratio": ratio(p99["during"], p99["idle"]),
    }


#: Figures a --preload build's floor is compared on (certagent's / the floor's, by repeat).
FLOOR_FIGURES = ("warm_p99_ratio", "haproxy_ms_per_host", "storm_s")


def floors(rows: list[dict[str, Any]], builds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``preload`` build (the floor): the first certagent build on the same binary, and
    each of :data:`FLOOR_FIGURES` as certagent's / the floor's, paired by repeat; the pooled
    warm p99 ratios too."""
    out: dict[str, Any] = {}
    for floor in (b for b in builds if b.get("preload")):
        same = [b for b in builds if not b.get("preload") and b["path"] == floor["path"]]
        if not same:
            continue
        base = {r["repeat"]: r for r in rows if r["build"] == floor["label"]}
        mine = [r for r in rows if r["build"] == same[0]["label"]]
        entry: dict[str, Any] = {"certagent": same[0]["label"]}
        for name in FLOOR_FIGURES:
            entry[name] = spread(
                [
                    r[name] / base[r["repeat"]][name]
                    for r in mine
                    if r["repeat"] in base and r.get(name) and base[r["repeat"]].get(name)
                ],
                2,
            )
        entry["pooled_warm_p99_ratio"] = ratio(
            pooled(mine)["ratio"], pooled(list(base.values()))["ratio"]
        )
        out[floor["label"]] = entry
    return out


def targets(summary: dict[str, Any], baseline: str) -> dict[str, Any]:
    """Each target met or missed, on the medians; absent builds are reported as such."""
    result: dict[str, Any] = {}
    for label, figure, limit, what in TARGETS:
        key = f"{label} {figure}"
        entry = summary.get(label)
        if entry is None:
            result[key] = {"what": what, "limit": limit, "value": None, "met": None}
            continue
        if figure.startswith("ratio:"):
            value = entry.get("ratio_to_" + baseline, {}).get(figure[6:], {}).get("median")
        elif figure.startswith("pooled:"):
            value = entry.get("warm_pooled", {}).get(figure[7:])
        else:
            value = entry[figure]["median"]
        met = None if value is None else value <= limit
        result[key] = {"what": what, "limit": limit, "value": value, "met": met}
    return result


def _cell(s: dict[str, Any]) -> str:
    if s["median"] is None:
        return "-"
    return f"{s['median']:g} ({s['min']:g}-{s['max']:g})"


def _variant(build: dict[str, Any]) -> str:
    parts = [f"`{line}`" for line in build.get("global_lines", ())]
    parts += [f"`{k}={v}`" for k, v in build.get("agent_env", ())]
    if (nice := build.get("agent_nice")) is not None:
        parts.append(
            "the agent at SCHED_RR one priority below HAProxy (--build-nice rt)"
            if nice == "rt"
            else f"the agent at nice {nice}, its autogroup {nice} below the bench's (--build-nice)"
        )
    if (source := build.get("agent_source")) is not None:
        parts.append(f"the agent's code from {source} (--build-agent)")
    if build.get("preload"):
        parts.insert(0, "no certagent: every certificate preloaded in a plain crt-list (--preload)")
    return " with " + ", ".join(parts) if parts else ""


def _pooled(p: dict[str, Any]) -> str:
    if p["ratio"] is None:
        return "-"
    return (
        f"{p['ratio']:g} ({p['during_p99_ms']:g} / {p['idle_p99_ms']:g} ms; "
        f"{p['during_samples']:,} / {p['idle_samples']:,})"
    )


def _probe_note(meta: dict[str, Any]) -> str:
    probe = meta["sizes"].get("probe")
    if probe is None or meta["client"].startswith("Python"):
        return "Warm host: one handshake every 10 ms (the Python prober), 1 s idle, then the storm."
    return (
        f"Warm host: {probe['rate']:g} verified full handshakes started per second on a fixed "
        f"schedule (at most {probe['connections']} in flight), from {probe['idle_s']:g} s before "
        "the storm to its end; its p99 during the storm counts the handshakes started between "
        "the storm's first arrival and its last host served, the idle p99 those of an equally "
        "long stretch just before the storm."
    )


def _load_note(result: dict[str, Any]) -> str:
    loads = [x for r in result["runs"] for x in r["loadavg_1m"]]
    cpus = result["meta"]["machine"]["nproc"] or 1
    note = f"Load average (1 min) during the run: {min(loads):g}-{max(loads):g} on {cpus} CPUs"
    if result["meta"].get("realtime"):
        return note + (
            "; the bench and everything it started ran at SCHED_RR priority 5, the warm-host"
            " prober at 6 (`--realtime`): the other load could not take their CPU."
        )
    if result["meta"].get("favour"):
        note += (
            "; the bench and everything it started ran in autogroups at nice -20 (`--favour`):"
            " other sessions' work got the CPU only when the bench left it"
        )
    elif max(loads) > 1.5 * cpus:
        return note + ": **a busy machine; absolute figures are inflated, compare the ratios**."
    return note + "."


def markdown(result: dict[str, Any]) -> str:
    meta, summary = result["meta"], result["summary"]
    labels = list(summary)
    base = labels[0]
    lines = [
        f"# HAProxy builds side by side: storm of {meta['sizes']['hosts']:,} new hosts",
        "",
        f"{meta['date']}, revision {meta['revision']}, {meta['machine']['nproc']} CPUs "
        f"({meta['machine']['cpu_model']}); client: {meta['client']}.",
        f"Capacity {meta['sizes']['capacity']}, {meta['sizes']['hosts']:,} never-seen hosts "
        f"within {meta['sizes']['spread']} s, {meta['sizes']['repeats']} repeats per build, "
        "interleaved. Median (min-max) of the repeats; ratios to "
        f"{base} are paired by repeat.",
        "",
        _probe_note(meta),
        "",
        _load_note(result),
        "",
        "Builds: "
        + "; ".join(f"**{b['label']}** {b['describe']}{_variant(b)}" for b in meta["builds"])
        + ".",
        f"Same generated configuration on every build: {meta['same_config']}.",
        "",
        "| | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    rows = (
        ("HAProxy CPU per new host, ms", "haproxy_ms_per_host"),
        ("… less the warm prober's share (measured at idle), ms", "haproxy_net_ms_per_host"),
        ("agent CPU per new host, ms", "agent_ms_per_host"),
        ("storm, first arrival to last served, s", "storm_s"),
        ("served after the last arrival, s", "served_after_last_arrival_s"),
        ("warm-host p99 during / idle", "warm_p99_ratio"),
        ("warm-host p99 idle, ms", "warm_idle_p99_ms"),
        ("warm-host p99 during the storm, ms", "warm_during_p99_ms"),
        ("warm-host p90 during / idle", "warm_p90_ratio"),
        ("warm-host samples: idle", "warm_idle_samples"),
        ("warm-host samples: during the storm", "warm_during_samples"),
        ("warm prober's own CPU, % of one CPU: idle", "prober_cpu_pct_idle"),
        ("warm prober's own CPU, % of one CPU: storm", "prober_cpu_pct_storm"),
        ("HAProxy CPU for the warm probes at idle, ms/s", "haproxy_probe_ms_per_s"),
        ("failed handshakes", "failed"),
        ("certificate not valid for the host (the default one)", "wrong_cert"),
        ("machine busy during the storm, %", "machine_busy_pct"),
        ("load average (1 min)", "loadavg_1m"),
    )
    for title, key in rows:
        lines.append(f"| {title} | " + " | ".join(_cell(summary[b][key]) for b in labels) + " |")
    lines.append(
        "| warm-host p99 during / idle, every repeat's samples pooled (samples) | "
        + " | ".join(_pooled(summary[b]["warm_pooled"]) for b in labels)
        + " |"
    )
    for name in RATIOS:
        cells = ["1"] + [_cell(summary[b]["ratio_to_" + base][name]) for b in labels[1:]]
        lines.append(f"| {name} / {base}'s | " + " | ".join(cells) + " |")
    for label, f in result.get("floors", {}).items():
        cells = ", ".join(f"{name} {_cell(f[name])}" for name in FLOOR_FIGURES)
        lines += [
            "",
            f"**Floor**: {f['certagent']} (certagent) / {label} (the same HAProxy preloading every "
            f"certificate, no agent, no Lua, no hop), paired by repeat: {cells}; pooled warm "
            f"p99 ratio {f['pooled_warm_p99_ratio']}.",
        ]
    profiled = [r for r in result["runs"] if "by_object_pct" in r.get("perf", {})]
    if profiled:
        lines += [
            "",
            "## Where HAProxy's worker spent its CPU during the storm (perf, % of samples)",
            "",
        ]
        for label in labels:
            shares = [r["perf"]["by_object_pct"] for r in profiled if r["build"] == label]
            objects = sorted(
                {o for s in shares for o in s}, key=lambda o: -max(s.get(o, 0) for s in shares)
            )
            text = ", ".join(
                f"{o} " + "/".join(f"{s.get(o, 0):g}" for s in shares) for o in objects
            )
            lines.append(f"- {label} (one figure per repeat): {text}")
    lines += ["", "## Targets (issue 18, Must show 5)", ""]
    for key, t in result["targets"].items():
        mark = {True: "met", False: "**missed**", None: "not measured"}[t["met"]]
        lines.append(f"- {key}: {t['value']} (limit {t['limit']}): {mark} - {t['what']}")
    lines += ["", "Reproduce: `" + meta["command"] + "`", ""]
    return "\n".join(lines)
