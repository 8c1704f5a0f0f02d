"""The PNG of one run of the preload comparison: one panel per figure (the JSON is the source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> bool:
    """Write the six-panel PNG; False if matplotlib is not installed (``.[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    _startup_time(axes[0][0], result)
    _startup_rss(axes[0][1], result)
    _churn_rss(axes[0][2], result)
    _cold_warm(axes[1][0], result)
    _storm(axes[1][1], result)
    _hop(axes[1][2], result)
    meta = result["meta"]
    fig.suptitle(
        f"certagent vs preload — {meta['date']}, {meta['mode']}, {meta['key_type']}, "
        f"{meta['machine']['nproc']} CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def _startup_time(ax: Any, result: dict[str, Any]) -> None:
    rows = result["startup"]["rows"]
    ns = [r["n"] for r in rows]
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


def _startup_rss(ax: Any, result: dict[str, Any]) -> None:
    rows = result["startup"]["rows"]
    ns = [r["n"] for r in rows]
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


def _churn_rss(ax: Any, result: dict[str, Any]) -> None:
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


def _cold_warm(ax: Any, result: dict[str, Any]) -> None:
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


def _storm(ax: Any, result: dict[str, Any]) -> None:
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


def _hop(ax: Any, result: dict[str, Any]) -> None:
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
