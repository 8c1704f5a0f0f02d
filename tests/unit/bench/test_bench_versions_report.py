"""bench.versions: summaries paired by repeat, targets, the report, options and digests."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import _configs
from bench.versions import __main__ as main
from bench.versions import builds, favour, lower, report, storm


def _row(build: str, repeat: int, haproxy_ms: float, warm: float | None = 5.0) -> dict[str, Any]:
    return {
        "build": build,
        "repeat": repeat,
        "haproxy_ms_per_host": haproxy_ms,
        "agent_ms_per_host": 0.5,
        "storm_s": 1.5,
        "served_after_last_arrival_s": 0.5,
        "warm_p99_ratio": warm,
        "warm_idle_p99_ms": 2.0,
        "warm_during_p99_ms": 10.0,
        "failed": 0,
        "wrong_cert": 0,
        "machine_busy_pct": 99.0,
        "loadavg_1m": [1.0, 1.5],
    }


ROWS = [
    _row("2.6", 1, 2.0), _row("3.2", 1, 1.0),
    _row("2.6", 2, 1.0), _row("3.2", 2, 0.8),
    _row("2.6", 3, 1.6), _row("3.2", 3, 0.8, warm=None),
]  # fmt: skip


def test_versions_ratios_are_paired_by_repeat_not_taken_between_medians() -> None:
    summary = report.summarise(ROWS, ["2.6", "3.2"])
    assert summary["2.6"]["haproxy_ms_per_host"]["median"] == 1.6
    assert summary["3.2"]["haproxy_ms_per_host"]["runs"] == [1.0, 0.8, 0.8]
    paired = summary["3.2"]["ratio_to_2.6"]["haproxy_ms_per_host"]
    assert paired["runs"] == [0.5, 0.8, 0.5]  # 1.0/2.0, 0.8/1.0, 0.8/1.6
    assert paired["median"] == 0.5
    assert "ratio_to_2.6" not in summary["2.6"]
    # a repeat without a figure is left out of the median, never counted as zero
    assert summary["3.2"]["warm_p99_ratio"]["median"] == 5.0
    assert summary["3.2"]["loadavg_1m"]["max"] == 1.5


def test_versions_targets_say_met_missed_or_not_measured() -> None:
    summary = report.summarise(ROWS, ["2.6", "3.2"])
    met = report.targets(summary, "2.6")
    assert met["3.2 haproxy_ms_per_host"] == {
        "what": "HAProxy CPU per new host <= 0.9 ms", "limit": 0.9, "value": 0.8, "met": True,
    }  # fmt: skip
    assert met["3.2 ratio:haproxy_ms_per_host"]["met"] is True
    assert met["2.6 haproxy_ms_per_host"]["met"] is True
    only_26 = report.targets(report.summarise(ROWS[::2], ["2.6"]), "2.6")
    assert only_26["3.2 warm_p99_ratio"]["met"] is None


def test_versions_markdown_flags_a_busy_machine_and_lists_every_build() -> None:
    rows = [dict(r, loadavg_1m=[9.0, 10.0]) for r in ROWS]
    summary = report.summarise(rows, ["2.6", "3.2"])
    meta = {
        "date": "2026-11-27T05:00:00Z",
        "revision": "abc",
        "machine": {"nproc": 2, "cpu_model": "x"},
        "client": "c",
        "sizes": {"capacity": 200, "hosts": 1000, "spread": 1.0, "repeats": 3},
        "builds": [{"label": "2.6", "describe": "HAProxy 2.6.12"},
                   {"label": "3.2", "describe": "HAProxy 3.2.26"}],
        "same_config": True,
        "command": "python -m bench.versions storm",
    }  # fmt: skip
    result = {"meta": meta, "summary": summary, "runs": rows,
              "targets": report.targets(summary, "2.6")}  # fmt: skip
    text = report.markdown(result)
    assert "| | 2.6 | 3.2 |" in text
    assert "| HAProxy CPU per new host, ms | 1.6 (1-2) | 0.8 (0.8-1) |" in text
    assert "a busy machine" in text
    assert "realtime" not in text
    meta["realtime"] = True
    assert "SCHED_RR" in report.markdown(result)


def test_versions_options_and_config_digest(tmp_path: Path) -> None:
    assert builds.parse_option("3.2=/opt/h/haproxy") == ("3.2", "/opt/h/haproxy")
    assert builds.parse_option("/usr/sbin/haproxy") == (None, "/usr/sbin/haproxy")
    digests = []
    for port, name in ((4431, "a"), (5521, "b")):
        d = tmp_path / name
        d.mkdir()
        (d / "haproxy.cfg").write_text(
            f"bind 127.0.0.1:{port}\ncrt-list {d}/list\nstats socket /tmp/ca-{name}/admin.sock\n"
        )
        digests.append(builds.config_digest(d / "haproxy.cfg", port, Path(f"/tmp/ca-{name}")))
    assert digests[0] == digests[1]
    (tmp_path / "b" / "haproxy.cfg").write_text("bind 127.0.0.1:5521\nlua-load x\n")
    assert builds.config_digest(tmp_path / "b" / "haproxy.cfg", 5521, Path("/x")) != digests[0]


def test_versions_pool_the_warm_samples_of_every_repeat() -> None:
    rows = [
        {**_row("3.2", n, 1.0), "warm_samples_ms": {"idle": [1.0] * 98 + [2.0, 2.0], "during": d}}
        for n, d in ((1, [5.0] * 100), (2, [5.0] * 99 + [50.0]))
    ]
    pooled = report.summarise(rows, ["3.2"])["3.2"]["warm_pooled"]
    # 200 samples each: the 99th percentile is the 198th smallest, not a single repeat's
    assert pooled == {
        "idle_samples": 200, "during_samples": 200,
        "idle_p99_ms": 2.0, "during_p99_ms": 5.0, "ratio": 2.5,
    }  # fmt: skip
    assert report.summarise(ROWS, ["2.6"])["2.6"]["warm_pooled"]["ratio"] is None


def test_versions_variant_adds_global_lines_and_agent_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("# generated\nglobal\n    log stderr local0\n\ndefaults\n")
    builds.add_global_lines(cfg, ("nbthread 1", "tune.runqueue-depth 20"))
    assert cfg.read_text() == (
        "# generated\nglobal\n    nbthread 1\n    tune.runqueue-depth 20\n"
        "    log stderr local0\n\ndefaults\n"
    )
    build = builds.Build("3.2x", "/bin/haproxy", "HAProxy 3.2.26", "5.4")
    args = main.parse_args(
        ["storm", "--global", "3.2x=nbthread 1", "--global", "2.6=nbthread 2",
         "--build-env", "3.2x=CERTAGENT_LOAD_BATCH=2"]
    )  # fmt: skip
    got = main.variant(build, args)
    assert got.global_lines == ("nbthread 1",)
    assert got.agent_env == (("CERTAGENT_LOAD_BATCH", "2"),)


def test_versions_preload_option_marks_named_builds_only() -> None:
    build = builds.Build("3.2pre", "/bin/haproxy", "HAProxy 3.2.26", "5.4")
    args = main.parse_args(["storm", "--preload", "3.2pre"])
    assert main.variant(build, args).preload is True
    assert main.variant(dataclasses.replace(build, label="3.2"), args).preload is False
    assert main.parse_args(["storm"]).preload == []


def test_versions_floor_is_certagent_over_the_preload_on_the_same_binary() -> None:
    rows = [
        {**_row("3.2", 1, 0.8, warm=9.0), "storm_s": 3.6},
        {**_row("3.2pre", 1, 0.4, warm=3.0), "storm_s": 3.0},
        {**_row("3.2", 2, 0.9, warm=8.0), "storm_s": 3.6},
        {**_row("3.2pre", 2, 0.45, warm=4.0), "storm_s": 3.0},
        _row("2.6", 1, 1.6, warm=18.0),
    ]
    path = "/opt/sid/haproxy"
    got = report.floors(
        rows,
        [
            {"label": "2.6", "path": "/usr/sbin/haproxy", "preload": False},
            {"label": "3.2", "path": path, "preload": False},
            {"label": "3.2pre", "path": path, "preload": True},
        ],
    )
    assert list(got) == ["3.2pre"]
    assert got["3.2pre"]["certagent"] == "3.2"
    assert got["3.2pre"]["warm_p99_ratio"]["runs"] == [3.0, 2.0]  # 9/3, 8/4: paired by repeat
    assert got["3.2pre"]["haproxy_ms_per_host"]["median"] == 2.0
    assert got["3.2pre"]["storm_s"]["median"] == 1.2
    assert report.floors(rows, [{"label": "3.2pre", "path": path, "preload": True}]) == {}


def test_plain_preload_config_drops_certagent_and_binds_fe_tls_publicly(tmp_path: Path) -> None:
    generated = (
        "global\n    log stdout format raw local0 info\n"
        ".if version_atleast(3.0)\n    lua-load-per-thread /d/certagent.lua\n"
        ".else\n    lua-load /d/certagent.lua\n.endif\n"
        "    ssl-default-bind-ciphers X\n\n"
        "frontend fe_sni\n    mode tcp\n    bind 127.0.0.1:4431\n"
        "    tcp-request content lua.certagent_ensure /r/agent.sock 6000\n"
        "    default_backend be_certagent_tls\n\n"
        "backend be_certagent_tls\n    mode tcp\n"
        "    server fe_tls unix@/r/tls.sock send-proxy-v2\n\n"
        "frontend fe_tls\n    mode http\n"
        "    bind unix@/r/tls.sock mode 600 accept-proxy ssl crt /d/default.pem "
        "crt-list /d/certagent.crtlist alpn h2,http/1.1\n"
        "    default_backend be_app\n\nbackend be_app\n    mode http\n"
    )
    got = _configs.plain_preload(generated, 4431, tmp_path / "all.crtlist")
    assert "lua" not in got and "fe_sni" not in got and "be_certagent_tls" not in got
    assert "unix@" not in got and "accept-proxy" not in got
    assert (
        f"    bind 127.0.0.1:4431 ssl crt /d/default.pem crt-list {tmp_path}/all.crtlist "
        "alpn h2,http/1.1\n" in got
    )
    assert "    ssl-default-bind-ciphers X\n" in got and "backend be_app\n" in got


def test_versions_build_nice_names_one_build_and_is_validated() -> None:
    build = builds.Build("3.2nice", "/bin/haproxy", "HAProxy 3.2.26", "5.4")
    args = main.parse_args(["storm", "--build-nice", "3.2nice=10", "--build-nice", "3.2rt=rt"])
    assert main.variant(build, args).agent_nice == "10"
    assert main.variant(dataclasses.replace(build, label="3.2rt"), args).agent_nice == "rt"
    assert main.variant(dataclasses.replace(build, label="3.2"), args).agent_nice is None
    for bad in ("3.2", "3.2=fast", "3.2=20", "=5"):
        with pytest.raises(SystemExit):
            lower.parse(bad)
    assert report._variant({"agent_nice": "rt"}) == (
        " with the agent at SCHED_RR one priority below HAProxy (--build-nice rt)"
    )


def test_versions_build_agent_runs_one_build_from_another_checkout(tmp_path: Path) -> None:
    build = builds.Build("3.2old", "/bin/haproxy", "HAProxy 3.2.26", "5.4")
    args = main.parse_args(["storm", "--build-agent", f"3.2old={tmp_path}/agent"])
    old = main.variant(build, args)
    assert old.agent_source == f"{tmp_path}/agent"
    assert main.variant(dataclasses.replace(build, label="3.2"), args).agent_source is None
    assert storm._source_env(old)["PYTHONPATH"].split(os.pathsep)[0] == f"{tmp_path}/agent"
    assert storm._source_env(dataclasses.replace(old, agent_source=None)) == {}
    assert report._variant({"agent_source": "/x/agent"}) == (
        " with the agent's code from /x/agent (--build-agent)"
    )


def test_versions_lower_sets_every_thread_of_a_process() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import threading, time\n"
         "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
         "time.sleep(30)"],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # CI's runner is in the kernel's default autogroup (its file reads empty) while the
        # child, in a session of its own, has a group: both cases are covered
        shown = favour.autogroup_nice(child.pid)
        try:
            lower.lower(child.pid, "7", realtime=False, rt_priority=5)
        except PermissionError:
            pytest.skip("writing /proc/<pid>/autogroup needs root")
        tids = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tids) == 2
        assert all(os.getpriority(os.PRIO_PROCESS, t) == 7 for t in tids)
        own = favour.autogroup_nice() or 0  # -20 under --favour; None: the default group
        group = None if shown is None else str(min(19, own + 7))
        assert lower.describe(child.pid) == {
            "policy": "other", "rt_priority": 0, "nice": 7, "autogroup": group
        }  # fmt: skip
        with pytest.raises(SystemExit):
            lower.lower(child.pid, lower.RT, realtime=False, rt_priority=5)
    finally:
        child.kill()
        child.wait()


def test_versions_autogroup_reads_none_where_the_kernel_shows_none() -> None:
    assert favour.autogroup_nice(2**22 + 1) is None  # above pid_max: no such process
    own = favour.autogroup_nice()
    assert own is None or -20 <= own <= 19
