"""The storm of never-seen hosts, at a capacity below the storm's size, on each build.

One cell = one build, one repeat: a fresh stack from ``certagent init``, ``capacity``
resident hosts loaded through the agent's socket (so every new host recycles a slot),
then the warm-host prober (:mod:`bench.versions.warm`: ``probe.rate`` handshakes a second
with one resident host) through an idle phase and then ``hosts`` never-seen hosts within
``spread`` s.  Read over the storm: on-CPU time of HAProxy's master and worker, of the
agent and of the prober (/proc schedstat, every thread), the whole machine's busy share and
load average; over the idle phase, the same CPU (HAProxy's is then the prober's share).
With ``--python-client``: the Python prober every 10 ms, 1 s at idle, then the storm.
Cost grows with ``hosts``; the stack is stopped after each cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _configs
from bench._certs import write_crt_list
from bench._load import StormResult
from bench._proc import cpu_ticks
from bench.scale.common import Cpu, Env, Sizes, ensure_many, host, ratio
from bench.scale.storm import one_storm, probe
from bench.versions import lower, perf, warm
from bench.versions.builds import Build, add_global_lines, config_digest
from bench.versions.warm import ProbeSettings
from certagent.testing import Stack

#: ``--realtime``: the SCHED_RR priority of the bench and everything it starts; the warm-host
#: prober runs one above (a quiet machine's scheduler favours a process that mostly sleeps).
RT_PRIORITY = 5
#: ``--preload`` builds: every certificate's PEM file, under the run's work directory
PEM_DIR = "pem"
WRONG_CERT = "not verified"  # tlsload's and the Python client's error for a wrong certificate


@dataclass(frozen=True)
class StormSizes:
    capacity: int = 200  # as in haproxy-3.x-facts.md
    hosts: int = 1_000
    spread: float = 1.0
    repeats: int = 3
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    @classmethod
    def smoke(cls) -> StormSizes:
        return cls(capacity=20, hosts=40, spread=0.2, repeats=2, probe=ProbeSettings(100, 8, 0.5))

    def scale_sizes(self) -> Sizes:
        return Sizes(
            repeats=self.repeats,
            storm_capacity=self.capacity,
            storm_hosts=self.hosts,
            storm_spread=self.spread,
        )


def resident_hosts(sizes: StormSizes) -> list[str]:
    return [host("s", i) for i in range(sizes.capacity)]


def wave_hosts(sizes: StormSizes, repeat: int, index: int) -> list[str]:
    """Never-seen names of one cell (distinct in every cell, so no store state is shared)."""
    return [host(f"w{repeat}v{index}x", i) for i in range(sizes.hosts)]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_for_load(limit: float, longest: float, poll: float = 5.0) -> float:
    """Sleep until the 1-minute load average is at most ``limit`` (at most ``longest`` s);
    the seconds waited."""
    started = time.monotonic()
    while loadavg() > limit and time.monotonic() - started < longest:
        time.sleep(poll)
    return round(time.monotonic() - started, 1)


def _start(
    env: Env,
    build: Build,
    name: str,
    capacity: int,
    agent_env: dict[str, str],
    preloaded: list[str],
    realtime: bool = False,
) -> Stack:
    """A stack from ``certagent init``; for a ``preload`` build, HAProxy alone on the
    generated configuration less certagent (:func:`bench._configs.plain_preload`),
    ``preloaded`` in its crt-list."""
    stack = Stack.create(
        env.work / name,
        store=env.redis.url,
        cafile=env.pki.cafile,
        key_file=env.store.key_file,
        capacity=capacity,
        haproxy_binary=build.path,
        env={**agent_env, **dict(build.agent_env), **_source_env(build)},
    )
    env.stacks.append(stack)
    add_global_lines(stack.haproxy_cfg, build.global_lines)
    if build.preload:
        listed = stack.directory / "preload.crtlist"
        crt_list = write_crt_list(listed, env.work / PEM_DIR, preloaded)
        cfg = _configs.plain_preload(stack.haproxy_cfg.read_text(), stack.port, crt_list)
        stack.haproxy_cfg.write_text(cfg)
    stack.start_haproxy()
    if not build.preload:
        agent = stack.start_agent()
        if build.agent_nice is not None:
            lower.lower(agent.pid, build.agent_nice, realtime, RT_PRIORITY)
    return stack


def _source_env(build: Build) -> dict[str, str]:
    """``PYTHONPATH`` for a ``--build-agent`` build: its checkout's code before this one's."""
    if build.agent_source is None:
        return {}
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": build.agent_source + (os.pathsep + rest if rest else "")}


def go_realtime() -> None:
    """SCHED_RR for this process and every process it starts from now on (needs root)."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(RT_PRIORITY))
    except PermissionError as exc:
        raise SystemExit(
            "bench.versions: --realtime needs root (or CAP_SYS_NICE): run it with sudo"
        ) from exc


def cell(
    env: Env,
    build: Build,
    sizes: StormSizes,
    repeat: int,
    index: int,
    native: Path | None,
    profile: bool = False,
    realtime: bool = False,
    agent_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One storm on one build; a JSON-ready row (with ``profile``: a perf summary of the
    HAProxy worker over the storm, which costs some CPU of its own).  A ``preload`` build's
    certificates must be in ``env.work / PEM_DIR`` (:func:`bench._certs.write_preload_files`)."""
    resident, wave = resident_hosts(sizes), wave_hosts(sizes, repeat, index)
    stack = _start(
        env,
        build,
        f"r{repeat}-{index}",
        sizes.capacity,
        agent_env or {},
        resident + wave,
        realtime,
    )
    try:
        if stack.agent is not None:
            asyncio.run(ensure_many(stack.settings.agent_socket, resident))
        assert stack.haproxy.proc is not None
        pids = {"haproxy": stack.worker_pid(), "haproxy_master": stack.haproxy.proc.pid}
        if stack.agent is not None:
            pids["agent"] = stack.agent.pid
        load_before = loadavg()
        profiled: dict[str, Any] = {}
        sampling = (
            perf.recording(pids["haproxy"], env.work / f"perf-{repeat}-{index}.data", profiled)
            if profile
            else contextlib.nullcontext()
        )
        if native is None:
            res, cpu, machine_busy, phases = _python_storm(
                env, stack, resident[0], wave, sizes, pids, sampling
            )
        else:
            res, cpu, machine_busy, phases = _native_storm(
                env, stack, resident[0], wave, sizes, native, pids, sampling, realtime
            )
        row = {
            "build": build.label,
            "repeat": repeat + 1,
            "verified": res.ok,
            "failed": res.failed,
            "wrong_cert": sum(n for k, n in res.errors.items() if k.startswith(WRONG_CERT)),
            "errors": res.errors,
            "storm_s": round(res.seconds, 3),
            "served_after_last_arrival_s": round(res.seconds - res.launch_span, 3),
            "agent_ms_per_host": (
                round(cpu.ms["agent"] / sizes.hosts, 3) if "agent" in cpu.ms else None
            ),
            **_haproxy_cpu(cpu, phases.idle_cpu, sizes.hosts),
            **_warm_figures(phases, cpu),
            "recycles": stack.status()["loader"]["recycles"] if stack.agent else None,
            # the warm host's connections that asked the agent (fe_sni logs only those):
            # more than none means its slot was recycled and it was loaded again
            "warm_host_asked": (log := stack.haproxy_log()).count(f"sni={resident[0]} certagent="),
            "asked_ok": log.count("certagent=ok"),
            "machine_busy_pct": round(100 * machine_busy, 1),
            "loadavg_1m": [load_before, loadavg()],
            "config_digest": config_digest(stack.haproxy_cfg, stack.port, stack.run_dir),
        }
        if profile:
            row["perf"] = profiled
        if stack.agent is not None and build.agent_nice is not None:
            row["agent_priority"] = lower.describe(stack.agent.pid)
        return row
    finally:
        env.close(stack)


def _measured_storm(
    env: Env,
    stack: Stack,
    wave: list[str],
    sizes: StormSizes,
    native: Path | None,
    pids: dict[str, int],
) -> tuple[StormResult, Cpu, float]:
    """The storm, with the on-CPU time of ``pids`` and the machine's busy share over it."""
    cpu, (busy0, total0) = Cpu(pids).start(), cpu_ticks()
    res = one_storm(env, stack, wave, native, sizes.scale_sizes())
    busy1, total1 = cpu_ticks()
    return res, cpu.stop(), (busy1 - busy0) / max(1, total1 - total0)


def _native_storm(
    env: Env,
    stack: Stack,
    warm_host: str,
    wave: list[str],
    sizes: StormSizes,
    native: Path,
    pids: dict[str, int],
    sampling: contextlib.AbstractContextManager[object],
    realtime: bool,
) -> tuple[StormResult, Cpu, float, warm.Phases]:
    """The dense warm-host prober (:mod:`bench.versions.warm`) through idle and storm."""

    def above(pid: int) -> None:
        if realtime:
            os.sched_setscheduler(pid, os.SCHED_RR, os.sched_param(RT_PRIORITY + 1))

    prober = warm.probing(native, stack.port, warm_host, env.pki.cafile, pids, sizes.probe, above)
    with prober as (phases, mark, with_prober):
        with sampling:
            res, cpu, busy = _measured_storm(env, stack, wave, sizes, native, with_prober)
        mark(res.t0, res.seconds)
    return res, cpu, busy, phases


def _python_storm(
    env: Env,
    stack: Stack,
    warm_host: str,
    wave: list[str],
    sizes: StormSizes,
    pids: dict[str, int],
    sampling: contextlib.AbstractContextManager[object],
) -> tuple[StormResult, Cpu, float, warm.Phases]:
    """``--python-client``: the Python prober every 10 ms, 1 s idle, then the storm."""
    idle = probe(env, stack, warm_host, None, lambda: time.sleep(1.0))
    got: list[tuple[StormResult, Cpu, float]] = []

    def body() -> None:
        with sampling:
            got.append(_measured_storm(env, stack, wave, sizes, None, pids))

    during = probe(env, stack, warm_host, None, body)
    res, cpu, busy = got[0]
    return res, cpu, busy, warm.Phases(idle=idle, during=during)


def _haproxy_cpu(cpu: Cpu, idle: Cpu | None, hosts: int) -> dict[str, Any]:
    """HAProxy's CPU (master and worker) per new host; with an idle reading, also the
    prober's share (HAProxy's idle CPU per second, times the storm's length) and the rest."""
    ms = cpu.ms["haproxy"] + cpu.ms["haproxy_master"]
    out: dict[str, Any] = {"haproxy_ms_per_host": round(ms / hosts, 3)}
    if idle is not None and idle.seconds > 0:
        per_s = (idle.ms["haproxy"] + idle.ms["haproxy_master"]) / idle.seconds
        out["haproxy_probe_ms_per_s"] = round(per_s, 1)
        out["haproxy_net_ms_per_host"] = round((ms - per_s * cpu.seconds) / hosts, 3)
    return out


def _warm_figures(phases: warm.Phases, cpu: Cpu) -> dict[str, Any]:
    idle, during = warm.stats_ms(phases.idle), warm.stats_ms(phases.during)
    out: dict[str, Any] = {
        "warm_idle_p99_ms": idle["p99"],
        "warm_during_p99_ms": during["p99"],
        "warm_p99_ratio": ratio(during["p99"], idle["p99"]),
        "warm_idle_samples": idle["count"],
        "warm_during_samples": during["count"],
        "warm_idle_p50_ms": idle["p50"],
        "warm_during_p50_ms": during["p50"],
        "warm_p90_ratio": ratio(during["p90"], idle["p90"]),
        "warm_failures": phases.failures,
        # every sample, for pooling over repeats (report.summarise) and later analysis
        "warm_samples_ms": {
            "idle": [round(1000 * x, 2) for x in phases.idle],
            "during": [round(1000 * x, 2) for x in phases.during],
            "during_started_ms": [round(1000 * x, 1) for x in phases.during_at],
        },
    }
    if phases.idle_cpu is not None:
        idle_cpu = phases.idle_cpu
        out["prober_late"] = phases.late
        out["prober_cpu_pct_idle"] = round(100 * idle_cpu.ms["prober"] / 1000 / idle_cpu.seconds, 1)
        out["prober_cpu_pct_storm"] = round(100 * cpu.ms["prober"] / 1000 / cpu.seconds, 1)
    return out
