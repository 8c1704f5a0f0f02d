"""``python -m bench --smoke``: every scenario at tiny sizes, in a subprocess, bounded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench import _native

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_bench_smoke_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    # an earlier result of the same day: kept as it is, the run goes to "-2"
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    earlier = tmp_path / f"{today}-smoke.json"
    earlier.write_text("{}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=360,  # < 1 min on a quiet machine, 110 s at a load average of 10 on 2 CPUs
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)

    assert list(result)[:2] == ["meta", "targets"]
    assert {"startup", "churn", "cold_warm", "storm", "hop"} <= set(result)
    assert result["meta"]["mode"] == "smoke"
    assert result["meta"]["storm_client"] in (_native.LABEL, "Python asyncio")
    assert {"nproc", "cpu_model", "mem_total_gb"} <= set(result["meta"]["machine"])
    assert {
        "startup",
        "churn_rss",
        "cold_p50",
        "cold_p99",
        "storm_success",
        "storm_warm",
        "hop_connection",
        "hop_request",
    } <= set(result["targets"])
    assert all(row["limit"] for row in result["targets"].values())  # shown when missed

    rows = result["startup"]["rows"]
    assert [r["n"] for r in rows] == [200, 1000]
    assert all(r["preload_s"] > 0 and r["certagent_s"] > 0 for r in rows)
    churn = result["churn"]
    assert len(churn["per_round"]) == churn["rounds"] == 5
    sampled = churn["handshakes_sampled_per_round"]
    assert all(r["warm_handshakes_ok"] == sampled for r in churn["per_round"])
    # the sampled handshakes stored TLS sessions; recycled hosts left the usage table
    assert all(r["certagent_session_cache_mb"] > 0 for r in churn["per_round"])
    assert all(0 < r["usage_table_entries"] <= churn["capacity"] for r in churn["per_round"])
    assert result["cold_warm"]["failures"] == 0
    assert result["cold_warm"]["certagent_cold_ms"]["count"] == 100
    for side in ("certagent", "certagent_batch_1", "preload"):
        assert {"success_pct", "latency_ms", "warm_idle_ms", "warm_during_ms"} <= set(
            result["storm"][side]
        )
    assert result["storm"]["preload"]["success_pct"] == 100
    variants = result["hop"]["variants"]
    assert "baseline" in variants
    for v in variants.values():
        assert v["new_connection"]["certagent_us"] > 0
        assert v["keepalive_request"]["ops_per_run"] == 5 * 40

    stem = result["meta"]["date"] + "-smoke"
    assert earlier.read_text() == "{}\n"
    if result["meta"]["date"] == today:  # (the run did not cross midnight)
        stem += "-2"
    assert json.loads((tmp_path / f"{stem}.json").read_text()) == result
    assert "## 5. Steady-state cost of the hop" in (tmp_path / f"{stem}.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(600)
def test_scale_bench_smoke_runs_every_scenario_and_never_overwrites(tmp_path: Path) -> None:
    """``python -m bench.scale --smoke``: every scale scenario at tiny sizes, twice."""
    runs = []
    for only in ([], ["--only", "hit_ratio"]):  # the second run only has to write again
        proc = subprocess.run(
            [sys.executable, "-m", "bench.scale", "--smoke", "--out", str(tmp_path), *only],
            cwd=REPO,
            capture_output=True,
            text=True,
            # every scenario (Sentinel and Cluster sets start twice): 174 s at a load average
            # of 10 on 2 CPUs; then hit_ratio alone
            timeout=420,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout))
    result = runs[0]
    assert {"capacity", "new_host", "storm", "reload", "idle", "idle_ha", "store_kinds",
            "hit_ratio"} <= set(result)  # fmt: skip
    kinds = result["store_kinds"]
    assert set(kinds["rows"]) == {"redis", "sentinel", "cluster"}
    for kind, row in kinds["rows"].items():
        assert row["handshakes"]["ok"] == result["meta"]["sizes"]["recycles"] * 2, kind
        assert len(row["store_ms_per_recycle"]["runs"]) == 2
    assert len(kinds["rows"]["sentinel"]["store_processes"]) == 5  # 2 Redis + 3 sentinels
    assert kinds["ratio_to_redis"]["cluster"]["agent_ms_per_recycle"] is not None
    for kind in ("sentinel", "cluster"):
        ha = result["idle_ha"][kind]
        assert len(ha["agent_plus_haproxy_ms_per_s"]["runs"]) == 2
        assert ha["store_ms_per_s"]["median"] > 0
    assert {"recycle_agent", "recycle_haproxy", "cold_latency", "new_host", "storm", "reload",
            "idle", "idle_ha"} <= set(result["targets"])  # fmt: skip
    for row in result["capacity"]["rows"]:
        assert row["handshakes"]["ok"] == result["meta"]["sizes"]["recycles"] * 2
        assert set(row["memory_mb"]) == {"haproxy", "agent", "redis"}
        assert len(row["agent_ms_per_recycle"]["runs"]) == 2  # every repeat, not the best
    assert result["storm"]["default_cert"] == 0 and result["reload"]["failed"] == 0
    assert result["hit_ratio"]["zipf"]["exact_lru"] > 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len([n for n in written if n.endswith(".json")]) == 2  # the second did not overwrite
    assert len([n for n in written if n.endswith(".md")]) == 2


def test_agent_profile_quick_measures_every_process_and_sorts_samples_into_phases(
    tmp_path: Path,
) -> None:
    from bench.profile_agent import LOOP, WAITING, phases

    raw = "\n".join(
        [
            "main (certagent);Loader._write (runtime/loader.py:1);write (libc.so.6) 5",
            "main (certagent);Ensurer._load (service/ensure.py:3);"
            "RedisStore.lookup_all (store/redis.py:2);parse_bundle (certs/pem.py:9) 3",
            "main (certagent);run (uvloop/__init__.py:92);epoll_pwait (libc.so.6) 7",
            "main (certagent);run (uvloop/__init__.py:92);accept4 (libc.so.6) 2",
        ]
    )
    assert phases(raw) == {
        WAITING: 7,
        "load plan and pool bookkeeping": 5,
        "record parsing and key check (PEM, x509, key match)": 3,
        LOOP: 2,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bench.profile_agent", "--quick", "--repeats", "2",
         "--py-spy", "", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)["result"]
    assert result["failed_handshakes"] == 0 and result["recycles"] >= 200
    for name in ("agent", "haproxy", "redis"):
        assert len(result["ms_per_recycle"][name]["runs"]) == 2
    assert result["ms_per_recycle"]["agent"]["median"] > 0
    assert list(tmp_path.iterdir()) == []  # --quick writes no result file


@pytest.mark.timeout(300)
def test_profile_load_quick_answers_every_question() -> None:
    """``python -m bench.profile_load --quick``: HAProxy driven through the agent's own client."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.profile_load", "--quick", "--no-perf", "--budget", "240"],
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert "error" not in result
    params = result["params"]
    assert list(result["q1"]) == ["K=200", "K=2000"] and result["k_large_used"] == 2000
    for at_k in result["q1"].values():
        assert len(at_k["measured"]) == 19 and len(at_k["derived"]) == 6
        assert all(len(m["samples_us"]) == params["reps"] for m in at_k["measured"].values())
        assert at_k["measured"]["set+commit+abort (recycled slot)"]["median_us"] > 0
    variants = result["q2"]["variants"]
    assert len(variants) == 15
    assert variants["ec-pkcs8-last"]["set_ratio_to_agent_today"]["median"] == 1  # the agent's form
    assert result["q2"]["issuers_chain_path_verified_handshake"]["served_leaf_matches"]
    for key_type in ("ECDSA P-256", "RSA-2048"):
        assert len(result["q3"][key_type]["first_handshake"]["samples_us"]) == params["hs_rounds"]
    handshakes = 2 * 3 * params["hs_rounds"] * params["hs_hosts"]  # key types x #1 #2 #3
    assert sum(result["q3"]["tls_versions"].values()) == handshakes
    assert result["q4"] == {"skipped": "--no-perf"}
