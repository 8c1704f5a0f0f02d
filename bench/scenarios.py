"""The five scenarios of issue 4; each compares HAProxy preloading with certagent, same run.

Every function takes the :class:`Bench` (processes, certificates, sizes) and
returns a JSON-ready dict.  Processes are started through :mod:`certagent.testing`
and registered with :meth:`Bench.track`, so the caller stops all of them by
PID whatever happens.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import _configs, _native
from bench._certs import Leaves, write_crt_list
from bench._load import (
    Counted,
    Prober,
    StormResult,
    keepalive_requests,
    new_connections,
    storm,
    summary_ms,
    timed_handshake,
    try_handshake,
)
from bench._proc import schedstat_ns
from certagent.testing import (
    HAProxyProcess,
    RedisFixture,
    RedisProcess,
    Stack,
    StackError,
    cpu_seconds,
    free_port,
    rss_kb,
)


@dataclass(frozen=True)
class Sizes:
    startup: tuple[int, ...]
    store_hosts: int
    churn_capacity: int
    churn_rounds: int
    churn_per_round: int
    churn_sample: int
    cold_warm: int
    storm_hosts: int
    storm_concurrency: int
    storm_spread: float
    idle_probe_seconds: float
    hop_hosts: int
    hop_new_connections: int
    hop_keepalive_connections: int
    hop_keepalive_requests: int
    hop_pairs: int
    variants: tuple[str, ...]

    @property
    def preload_max(self) -> int:
        return max(self.startup)


FULL = Sizes(
    startup=(1_000, 10_000, 100_000),
    store_hosts=100_000,
    churn_capacity=1_000,
    churn_rounds=20,
    churn_per_round=1_000,
    churn_sample=20,
    cold_warm=1_000,
    storm_hosts=1_000,
    storm_concurrency=200,
    storm_spread=1.0,
    idle_probe_seconds=2.0,
    hop_hosts=50,
    hop_new_connections=1_000,
    hop_keepalive_connections=20,
    hop_keepalive_requests=1_000,
    hop_pairs=9,
    variants=tuple(_configs.VARIANTS),
)

SMOKE = Sizes(
    startup=(200, 1_000),
    store_hosts=2_000,
    churn_capacity=50,
    churn_rounds=5,
    churn_per_round=100,
    churn_sample=5,
    cold_warm=100,
    storm_hosts=100,
    storm_concurrency=50,
    storm_spread=0.5,
    idle_probe_seconds=0.5,
    hop_hosts=10,
    hop_new_connections=100,
    hop_keepalive_connections=5,
    hop_keepalive_requests=40,
    hop_pairs=1,
    variants=tuple(_configs.VARIANTS),
)


@dataclass
class Bench:
    """What every scenario needs: scratch space, certificates, Redis, the sizes."""

    work: Path
    cafile: Path
    sizes: Sizes
    leaves: Leaves
    names: list[str]  # every host in the store; the first preload_max have PEM files
    cert_dir: Path
    default_cert: Path
    redis: RedisProcess
    store: RedisFixture
    ctx: ssl.SSLContext
    say: Callable[[str], None]
    rng: random.Random = field(default_factory=lambda: random.Random(4))
    _closers: list[Callable[[], object]] = field(default_factory=list)
    preload_big: HAProxyProcess | None = None
    native: Path | None = None  # bench/tlsload.c built, or None: the Python client is used

    @property
    def storm_client(self) -> str:
        """What the storm and the warm-host prober run on, as reports name it."""
        return _native.LABEL if self.native is not None else "Python asyncio"

    def prober(self, port: int, host: str) -> Prober | _native.NativeProber:
        """A warm-host prober (a context manager) on the storm's client."""
        if self.native is None:
            return Prober(port, host, self.cafile)
        return _native.NativeProber(self.native, port, host, self.cafile)

    def storm(self, port: int, hosts: Sequence[str]) -> StormResult:
        """A storm of verified handshakes for ``hosts`` on the storm's client."""
        c, spread = self.sizes.storm_concurrency, self.sizes.storm_spread
        if self.native is None:
            return asyncio.run(storm(port, hosts, self.ctx, c, spread))
        return asyncio.run(_native.storm_native(self.native, port, hosts, self.cafile, c, spread))

    # host ranges: churn, then cold/warm, storm, the storm again with load_batch 1
    def churn_round(self, r: int) -> list[str]:
        n = self.sizes.churn_per_round
        return self.names[r * n : (r + 1) * n]

    def _after_churn(self, skip: int, count: int) -> list[str]:
        start = self.sizes.churn_rounds * self.sizes.churn_per_round + skip
        hosts = self.names[start : start + count]
        if len(hosts) < count or start + count > self.sizes.preload_max:
            raise ValueError("the sizes ask for more hosts than the preload holds")
        return hosts

    def cold_warm_hosts(self) -> list[str]:
        return self._after_churn(0, self.sizes.cold_warm)

    def storm_hosts(self, which: int) -> list[str]:
        n = self.sizes.storm_hosts
        return self._after_churn(self.sizes.cold_warm + which * n, n)

    def track(self, closer: Callable[[], object]) -> None:
        self._closers.append(closer)

    def close_all(self) -> None:
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except (OSError, StackError) as exc:
                self.say(f"bench: stopping a process failed: {exc}")

    def new_stack(self, name: str, capacity: int, env: dict[str, str] | None = None) -> Stack:
        stack = Stack.create(
            self.work / name,
            store=self.redis.url,
            cafile=self.cafile,
            key_file=self.store.key_file,
            capacity=capacity,
            env=env,
        )
        self.track(stack.close)
        return stack

    def preload(self, count: int) -> HAProxyProcess:
        """An HAProxy (not started) whose one TLS bind preloads the first ``count`` hosts."""
        directory = self.work / f"preload-{count}"
        directory.mkdir(parents=True, exist_ok=True)
        crt_list = write_crt_list(directory / "certs.crtlist", self.cert_dir, self.names[:count])
        port = free_port()
        admin = directory / "admin.sock"
        cfg = _configs.preload_config(
            directory / "haproxy.cfg",
            port=port,
            admin_socket=str(admin),
            default_cert=self.default_cert,
            crt_list=crt_list,
            count=count,
        )
        proc = HAProxyProcess(cfg, str(admin), port, directory / "haproxy.log")
        self.track(proc.stop)
        return proc


# --- helpers -----------------------------------------------------------------------------


def _mb(kb: int) -> float:
    return round(kb / 1024, 1)


def _session_cache_kb(pid: int) -> int:
    """Resident KB of HAProxy's shared-memory TLS session cache (``tune.ssl.cachesize``):
    the worker's shared anonymous mapping, filled as new sessions are stored."""
    total, in_cache = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            in_cache = head[1] == "rw-s" and line.endswith("/dev/zero (deleted)")
        elif in_cache and head[0] == "Rss:":
            total += int(head[1])
    return total


def _table_entries(stack: Stack) -> int:
    """Entries in the usage stick table, from the header of ``show table``."""
    header = stack.admin(f"show table {stack.settings.usage_table}").partition("\n")[0]
    used = header.rpartition("used:")[2].strip()
    return int(used) if used.isdigit() else -1


def _first_verified(
    port: int, host: str, ctx: ssl.SSLContext, t0: float, timeout: float, alive: Callable[[], None]
) -> float:
    """Seconds from ``t0`` to the first verified handshake for ``host``; poll every 5 ms."""
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        alive()
        if try_handshake(port, host, ctx) is not None:
            return time.perf_counter() - t0
        time.sleep(0.005)
    raise StackError(f"no verified handshake for {host} within {timeout:.0f} s")



def _cpu_sample(pid: int) -> tuple[float, int]:
    return cpu_seconds(pid), schedstat_ns(pid)


# --- 1. startup --------------------------------------------------------------------------


def startup(bench: Bench) -> dict[str, Any]:
    """Process start to the first verified handshake of a random host; worker RSS then."""
    rows = []
    for n in bench.sizes.startup:
        host = bench.rng.choice(bench.names[:n])
        stack = bench.new_stack(f"startup-{n}", capacity=bench.sizes.churn_capacity)
        t0 = time.perf_counter()
        stack.haproxy.start(wait=False)
        stack.start_agent(wait=False)
        agent_s = _first_verified(stack.port, host, bench.ctx, t0, 60.0, stack.check_alive)
        stack.haproxy.worker_pids.add(stack.worker_pid())
        agent_rss = stack.worker_rss_kb()
        agent_py_rss = rss_kb(stack.agent.pid) if stack.agent else 0
        stack.close()

        bench.say(f"bench: startup: preloading {n} certificates ...")
        pre = bench.preload(n)
        t0 = time.perf_counter()
        pre.start(wait=False)
        preload_s = _first_verified(pre.port, host, bench.ctx, t0, 1200.0, pre.check_alive)
        pre.worker_pids.add(pre.worker_pid())
        preload_rss = pre.worker_rss_kb()
        if n == bench.sizes.preload_max:
            bench.preload_big = pre  # kept for the preload side of scenarios 2-4
        else:
            pre.stop()
        row = {
            "n": n,
            "preload_s": round(preload_s, 3),
            "preload_rss_mb": _mb(preload_rss),
            "certagent_s": round(agent_s, 3),
            "certagent_haproxy_rss_mb": _mb(agent_rss),
            "certagent_agent_rss_mb": _mb(agent_py_rss),
            "speedup": round(preload_s / agent_s, 1),
        }
        bench.say(f"bench: startup: {row}")
        rows.append(row)
    return {"store_hosts": len(bench.names), "rows": rows}


# --- 2. memory under churn ---------------------------------------------------------------


def churn(bench: Bench) -> dict[str, Any]:
    """Rounds of distinct hosts through a pool of ``capacity`` slots; RSS after each round."""
    sizes = bench.sizes
    pre = bench.preload_big
    assert pre is not None
    stack = bench.new_stack("churn", capacity=sizes.churn_capacity)
    stack.start_haproxy()
    stack.start_agent()
    empty_rss = stack.worker_rss_kb()
    rounds = []
    for r in range(sizes.churn_rounds):
        hosts = bench.churn_round(r)
        started = time.perf_counter()
        cold = [try_handshake(stack.port, h, bench.ctx) for h in hosts[: sizes.churn_sample]]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(stack.ensure, hosts[sizes.churn_sample :]))
        sample = bench.rng.sample(hosts, sizes.churn_sample)
        warm = [try_handshake(stack.port, h, bench.ctx) for h in sample]
        preload = [try_handshake(pre.port, h, bench.ctx) for h in sample]
        status = stack.status()
        row = {
            "round": r + 1,
            "certagent_rss_mb": _mb(stack.worker_rss_kb()),
            "certagent_session_cache_mb": round(_session_cache_kb(stack.worker_pid()) / 1024, 2),
            "usage_table_entries": _table_entries(stack),
            "preload_rss_mb": _mb(pre.worker_rss_kb()),
            "cold_handshakes_ok": sum(x is not None for x in cold),
            "ensure_ok": sum(a == "ok" for a in answers),
            "ensure_other": len(answers) - sum(a == "ok" for a in answers),
            "warm_handshakes_ok": sum(x is not None for x in warm),
            "preload_handshakes_ok": sum(x is not None for x in preload),
            "slots_used": status["slots_used"],
            "recycles": status["loader"].get("recycles"),
            "seconds": round(time.perf_counter() - started, 2),
        }
        bench.say(f"bench: churn: {row}")
        rounds.append(row)
    stack.close()
    after_fill = rounds[0]["certagent_rss_mb"]
    later = [row["certagent_rss_mb"] for row in rounds[1:]] or [after_fill]
    deviation = max(abs(v - after_fill) for v in later) / after_fill * 100
    # the same without the TLS session cache, which every new session fills up to its size
    rest = [row["certagent_rss_mb"] - row["certagent_session_cache_mb"] for row in rounds]
    rest_deviation = max(abs(v - rest[0]) for v in rest[1:] or rest) / rest[0] * 100
    pre_values = [row["preload_rss_mb"] for row in rounds]
    return {
        "capacity": sizes.churn_capacity,
        "store_hosts": len(bench.names),
        "rounds": sizes.churn_rounds,
        "hosts_per_round": sizes.churn_per_round,
        "handshakes_sampled_per_round": sizes.churn_sample,
        "certagent_empty_rss_mb": _mb(empty_rss),
        "certagent_rss_after_round1_mb": after_fill,
        "certagent_rss_last_mb": rounds[-1]["certagent_rss_mb"],
        "certagent_max_deviation_pct": round(deviation, 2),
        "certagent_max_deviation_without_session_cache_pct": round(rest_deviation, 2),
        "certagent_session_cache_mb": [
            rounds[0]["certagent_session_cache_mb"],
            rounds[-1]["certagent_session_cache_mb"],
        ],
        "usage_table_entries_last": rounds[-1]["usage_table_entries"],
        "preload_rss_mb": pre_values[-1],
        "preload_max_deviation_pct": round(
            max(abs(v - pre_values[0]) for v in pre_values) / pre_values[0] * 100, 2
        ),
        "per_round": rounds,
    }


# --- 3. cold vs warm ---------------------------------------------------------------------


def cold_warm(bench: Bench, stack: Stack) -> dict[str, Any]:
    """Each never-seen host: a cold handshake, then a warm one; then, in a second pass,
    one against the preload.  (Interleaving the preload's handshakes, on a process holding
    2.5 GB of certificates, slowed the cold ones by ≈0.25 ms in ad-hoc runs: cache
    pollution that a production HAProxy would not see.)"""
    pre = bench.preload_big
    assert pre is not None
    cold: list[float] = []
    warm: list[float] = []
    preload: list[float] = []
    added: list[float] = []
    failures = 0
    hosts = bench.cold_warm_hosts()
    for host in hosts:
        try:
            c = timed_handshake(stack.port, host, bench.ctx)
            w = timed_handshake(stack.port, host, bench.ctx)
        except (OSError, ValueError):
            failures += 1
            continue
        cold.append(c)
        warm.append(w)
        added.append(c - w)
    for host in hosts:
        try:
            preload.append(timed_handshake(pre.port, host, bench.ctx))
        except (OSError, ValueError):
            failures += 1
    result = {
        "hosts": bench.sizes.cold_warm,
        "failures": failures,
        "certagent_cold_ms": summary_ms(cold),
        "certagent_warm_ms": summary_ms(warm),
        "preload_ms": summary_ms(preload),
        "added_ms": summary_ms(added),
    }
    bench.say(f"bench: cold/warm: {result}")
    return result


# --- 4. cold storm -----------------------------------------------------------------------


def _counters(stack: Stack | None) -> dict[str, int]:
    """The agent's ensure and loader counters (for what happened during a storm)."""
    if stack is None:
        return {}
    status = stack.status()
    ensure = {f"ensure_{k}": v for k, v in status["ensure"].items()}
    return ensure | {f"loader_{k}": v for k, v in status["loader"].items()}


def _storm_against(
    bench: Bench,
    port: int,
    hosts: Sequence[str],
    warm_host: str,
    haproxy_pid: int,
    stack: Stack | None = None,
) -> dict[str, Any]:
    with bench.prober(port, warm_host) as idle:
        time.sleep(bench.sizes.idle_probe_seconds)
    before = _counters(stack)
    pids = {"haproxy": haproxy_pid} | ({"agent": stack.agent.pid} if stack and stack.agent else {})
    cpu_before = {name: schedstat_ns(pid) for name, pid in pids.items()}
    with bench.prober(port, warm_host) as during:
        result = bench.storm(port, hosts)
    # on-CPU time of HAProxy's worker (and the agent) during the storm, per host
    cpu = {
        f"{name}_cpu_ms_per_host": round(
            (schedstat_ns(pid) - cpu_before[name]) / 1e6 / len(hosts), 3
        )
        for name, pid in pids.items()
    }
    after = _counters(stack)
    idle_ms = summary_ms(idle.samples)
    during_ms = summary_ms(during.samples)
    return {
        "agent_counters": {
            k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)
        },
        "hosts": len(hosts),
        "verified": result.ok,
        "failed": result.failed,
        "success_pct": round(100 * result.ok / len(hosts), 2),
        "errors": result.errors,
        "launch_span_s": round(result.launch_span, 3),
        "duration_s": round(result.seconds, 3),
        "latency_ms": summary_ms(result.latencies),
        "warm_idle_ms": idle_ms,
        "warm_during_ms": during_ms,
        "warm_probe_failures": idle.failures + during.failures,
        "warm_p99_ratio": round(during_ms["p99"] / idle_ms["p99"], 2),
        "cpu": cpu,
    }


def cold_storm(bench: Bench, stack: Stack) -> dict[str, Any]:
    """New hosts started within ``storm_spread`` s, ``storm_concurrency`` at once; a warm
    host probed every 10 ms from another process, idle and during the storm."""
    pre = bench.preload_big
    assert pre is not None
    warm_host = bench.cold_warm_hosts()[0]
    out: dict[str, Any] = {
        "concurrency": bench.sizes.storm_concurrency,
        "spread_s": bench.sizes.storm_spread,
    }
    out["certagent"] = _storm_against(
        bench, stack.port, bench.storm_hosts(0), warm_host, stack.worker_pid(), stack
    )
    bench.say(f"bench: storm: certagent {out['certagent']}")
    out["preload"] = _storm_against(
        bench, pre.port, bench.storm_hosts(0), warm_host, pre.worker_pid()
    )
    bench.say(f"bench: storm: preload {out['preload']}")
    # The same storm with loads sent to HAProxy one at a time (load_batch 1): fewer
    # loads per second, so more CPU left for the hosts already served.
    stack.stop_agent()
    stack.env["CERTAGENT_LOAD_BATCH"] = "1"
    stack.start_agent()
    out["certagent_batch_1"] = _storm_against(
        bench, stack.port, bench.storm_hosts(1), warm_host, stack.worker_pid(), stack
    )
    bench.say(f"bench: storm: certagent, load_batch 1 {out['certagent_batch_1']}")
    return out


def latency(bench: Bench) -> tuple[dict[str, Any], dict[str, Any]]:
    """Scenarios 3 and 4 on one fresh stack with room for every host they load."""
    sizes = bench.sizes
    stack = bench.new_stack("latency", capacity=sizes.cold_warm + 2 * sizes.storm_hosts + 100)
    stack.start_haproxy()
    stack.start_agent()
    try:
        return cold_warm(bench, stack), cold_storm(bench, stack)
    finally:
        stack.close()


# --- 5. steady-state cost of the hop -----------------------------------------------------


def _measure_new(bench: Bench, port: int, hosts: Sequence[str], pid: int) -> dict[str, float]:
    before = _cpu_sample(pid)
    counted = asyncio.run(new_connections(port, hosts, bench.ctx, bench.sizes.hop_new_connections))
    time.sleep(0.1)  # let HAProxy finish the last closes
    after = _cpu_sample(pid)
    return _per_operation(counted, before, after, "new connections")


def _measure_keepalive(bench: Bench, port: int, hosts: Sequence[str], pid: int) -> dict[str, float]:
    sizes = bench.sizes
    counted, before, after = asyncio.run(
        keepalive_requests(
            port,
            hosts,
            bench.ctx,
            sizes.hop_keepalive_connections,
            sizes.hop_keepalive_requests,
            lambda: _cpu_sample(pid),
        )
    )
    return _per_operation(counted, before, after, "keep-alive requests")


def _per_operation(
    counted: Counted, before: tuple[float, int], after: tuple[float, int], what: str
) -> dict[str, float]:
    """HAProxy CPU per operation between two :func:`_cpu_sample` readings; all must succeed."""
    if counted.failed:
        raise StackError(f"{counted.failed} {what} failed: {counted.errors}")
    return {
        "ops": counted.ok,
        "cpu_us": (after[0] - before[0]) / counted.ok * 1e6,
        "sched_us": (after[1] - before[1]) / counted.ok / 1e3,
        "client_s": counted.seconds,
    }


def _ratio(x: float, y: float) -> float | None:
    return x / y if x > 0 and y > 0 else None  # None: too few clock ticks (smoke sizes)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _paired(a: list[dict[str, float]], b: list[dict[str, float]]) -> dict[str, Any]:
    ratios = [_ratio(x["cpu_us"], y["cpu_us"]) for x, y in zip(a, b, strict=True)]
    sched = [_ratio(x["sched_us"], y["sched_us"]) for x, y in zip(a, b, strict=True)]
    return {
        "ops_per_run": int(a[0]["ops"]),
        "certagent_us": round(statistics.median(x["cpu_us"] for x in a), 2),
        "plain_us": round(statistics.median(y["cpu_us"] for y in b), 2),
        "ratios": [None if r is None else round(r, 3) for r in ratios],
        "ratio": _median(ratios),
        "sched_ratio": _median(sched),
        "certagent_sched_us": round(statistics.median(x["sched_us"] for x in a), 2),
        "plain_sched_us": round(statistics.median(y["sched_us"] for y in b), 2),
    }


def hop(bench: Bench) -> dict[str, Any]:
    """HAProxy CPU per new TLS connection and per keep-alive request, certagent path (A,
    via fe_sni and the unix-socket hop) vs a plain TLS bind preloading the same
    certificates (B), in the same HAProxy process, alternated A/B/A/B; the median of the
    paired ratios.  One HAProxy + agent per config variant, all running; the variants are
    measured in turn within each pair round (rotating the order), so slow drifts of the
    machine hit every variant alike."""
    sizes = bench.sizes
    hosts = bench.cold_warm_hosts()[: sizes.hop_hosts]
    runs: list[tuple[str, Stack, int, int]] = []
    for name in sizes.variants:
        stack = bench.new_stack(f"hop-{name}", capacity=sizes.hop_hosts + 10)
        plain_list = write_crt_list(stack.directory / "plain.crtlist", bench.cert_dir, hosts)
        plain_port = free_port()
        cfg = _configs.VARIANTS[name](stack.haproxy_cfg.read_text())
        stack.haproxy_cfg.write_text(_configs.with_plain_frontend(cfg, plain_port, plain_list))
        stack.start_haproxy()
        stack.start_agent()
        for host in hosts:  # loads each host, then checks the plain bind serves it too
            timed_handshake(stack.port, host, bench.ctx)
            timed_handshake(plain_port, host, bench.ctx)
        runs.append((name, stack, plain_port, stack.worker_pid()))
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {"new_a": [], "new_b": [], "ka_a": [], "ka_b": []} for name, *_ in runs
    }
    for pair in range(sizes.hop_pairs):
        shift = pair % len(runs)
        for name, stack, plain_port, pid in runs[shift:] + runs[:shift]:
            got = samples[name]
            got["new_a"].append(_measure_new(bench, stack.port, hosts, pid))
            got["new_b"].append(_measure_new(bench, plain_port, hosts, pid))
            got["ka_a"].append(_measure_keepalive(bench, stack.port, hosts, pid))
            got["ka_b"].append(_measure_keepalive(bench, plain_port, hosts, pid))
        bench.say(f"bench: hop: pair round {pair + 1}/{sizes.hop_pairs} done")
    variants: dict[str, Any] = {}
    for name, stack, _, _ in runs:
        got = samples[name]
        variants[name] = {
            "informative_only": name in _configs.INFORMATIVE,
            "new_connection": _paired(got["new_a"], got["new_b"]),
            "keepalive_request": _paired(got["ka_a"], got["ka_b"]),
        }
        stack.close()
        bench.say(
            f"bench: hop {name}: new connection x{variants[name]['new_connection']['ratio']}"
            f", keep-alive request x{variants[name]['keepalive_request']['ratio']}"
        )
    return {
        "hosts": len(hosts),
        "pairs": sizes.hop_pairs,
        "new_connections_per_run": sizes.hop_new_connections,
        "keepalive_connections": sizes.hop_keepalive_connections,
        "keepalive_requests_per_connection": sizes.hop_keepalive_requests,
        "variants": variants,
    }
