"""q4: ``perf record`` of the HAProxy worker during streams of loads and of handshakes.

Three streams into one listed slot (``set`` alone, and the agent's set + commit +
abort, ECDSA and RSA), then the first and the second RSA-2048 handshakes on fresh
certificates; each profile is read by :mod:`.perf_samples`.  Skipped, saying why,
without ``perf`` or with ``--no-perf``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench._proc import schedstat_ns
from bench.profile_load.handshakes import handshakes, load_fresh
from bench.profile_load.payloads import AGENT_FORM, payload_variants
from bench.profile_load.perf_samples import haproxy_callsites, perf_summary, profile_diff
from bench.profile_load.rig import ProfiledHAProxy, slot
from bench.profile_load.settings import say
from certagent.testing import stop_process

BATCH = 20  # loads per pipelined write in a profiled stream

ABOUT = {
    "call_graph": "dwarf (16 KB of stack per sample, unwound with .eh_frame)",
    "symbols": "haproxy, libcrypto and libssl are stripped: only exported symbols resolve. "
    "'self' folds time spent in unexported functions into the nearest exported caller "
    "(marked '~'); 'entry' is the library function HAProxy called (its call site, from "
    "objdump of /usr/sbin/haproxy), so every sample is attributed to one "
    "HAProxy->library call.",
}


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def perf_profiles(rig: ProfiledHAProxy) -> dict[str, Any]:
    perf = shutil.which("perf")
    if not rig.want_perf:
        return {"skipped": "--no-perf"}
    if perf is None:
        return {"skipped": "perf is not installed"}
    probe = _run([perf, "stat", "-e", "task-clock", "true"], 30)
    if probe.returncode != 0:
        return {"skipped": f"perf stat failed: {probe.stderr[-300:]}"}
    hardware = _run([perf, "stat", "-e", "instructions", "true"], 30)
    hardware_ok = "<not supported>" not in hardware.stderr and hardware.returncode == 0
    callsites = haproxy_callsites()
    out: dict[str, Any] = {
        "perf": _run([perf, "--version"], 10).stdout.strip(),
        "event": "cpu-clock at 999 Hz"
        + (
            ""
            if hardware_ok
            else " (software timer; hardware counters are not supported in this VM)"
        ),
        **ABOUT,
        "profiles": {},
    }
    out["profiles"] |= _load_streams(rig, perf, callsites)
    first, second = _rsa_handshakes(rig, perf, callsites)
    out["profiles"]["RSA-2048 handshakes, first on a fresh certificate"] = first
    out["profiles"]["RSA-2048 handshakes, second"] = second
    out["rsa_first_minus_second_us_per_handshake"] = profile_diff(first, second)
    for profile in out["profiles"].values():
        profile.pop("_incl_counts", None)
        profile.pop("_ops", None)
    return out


def _load_streams(
    rig: ProfiledHAProxy, perf: str, callsites: dict[int, str]
) -> dict[str, dict[str, Any]]:
    """Profiles of ``perf_seconds`` of back-to-back loads into one slot, by kind."""
    variants = payload_variants(rig.certs)
    target = slot(0)
    streams = {
        "set ssl cert (EC P-256 PKCS#8, leaf+inter, key last)": (
            variants[AGENT_FORM]["payload"],
            False,
        ),
        "set+commit+abort (EC P-256 PKCS#8, leaf+inter, key last)": (
            variants[AGENT_FORM]["payload"],
            True,
        ),
        "set+commit+abort (RSA-2048 PKCS#8, leaf+inter, key last)": (
            variants["rsa-pkcs8-last"]["payload"],
            True,
        ),
    }
    seconds = rig.params.perf_seconds
    profiles: dict[str, dict[str, Any]] = {}
    for i, (title, (payload, full_load)) in enumerate(streams.items()):
        rig.budget.check(f"q4 profile {i}", seconds + 30)
        rig.alive()
        say(f"q4: perf record {seconds:.1f}s during a stream of {title}")
        one = api.load(target, payload) if full_load else [api.set_cert(target, payload)]
        ops = 0
        data = rig.workdir / f"perf-{i}.data"
        with perf_record(rig, perf, data):
            cpu_before, started = schedstat_ns(rig.pid), time.monotonic()
            while time.monotonic() - started < seconds:
                rig.session.run(one * BATCH, "q4 stream")
                if not full_load:
                    rig.session.run([api.abort_open(target)], "q4 abort")
                ops += BATCH
            cpu_ms = (schedstat_ns(rig.pid) - cpu_before) / 1e6
        profile = perf_summary(perf, data, callsites, ops)
        profile["ops"] = ops
        profile["haproxy_cpu_us_per_op_while_profiled"] = round(cpu_ms * 1000 / max(ops, 1), 1)
        profiles[title] = profile
        with contextlib.suppress(OSError):
            data.unlink()
    return profiles


def _rsa_handshakes(
    rig: ProfiledHAProxy, perf: str, callsites: dict[int, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first handshake on a fresh RSA certificate vs the second: what is set up lazily?"""
    n = min(rig.params.k_small - 1, rig.params.perf_handshakes)
    rig.budget.check("q4 handshake profiles", 40)
    say(f"q4: perf record during {n} first and {n} second RSA-2048 handshakes")
    hosts = load_fresh(rig, [slot(i) for i in range(1, 1 + n)], "rsa", "q4-rsa-")
    profiles = []
    for which in ("first", "second"):
        data = rig.workdir / f"perf-hs-{which}.data"
        with perf_record(rig, perf, data):
            cpu_us, _ms = handshakes(rig, hosts)
        profile = perf_summary(perf, data, callsites, n)
        profile["haproxy_cpu_us_per_handshake_while_profiled"] = round(cpu_us, 1)
        profiles.append(profile)
        with contextlib.suppress(OSError):
            data.unlink()
    return profiles[0], profiles[1]


@contextlib.contextmanager
def perf_record(rig: ProfiledHAProxy, perf: str, data: Path) -> Iterator[None]:
    """``perf record -p <worker>`` for the block's duration; stopped by SIGINT to its PID."""
    log_path = rig.workdir / (data.name + ".log")
    log = open(log_path, "wb")  # noqa: SIM115
    rig.perf_proc = subprocess.Popen(
        [perf, "record", "-q", "-F", "999", "--call-graph", "dwarf,16384",
         "-p", str(rig.pid), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # attach
        if rig.perf_proc.poll() is not None:
            raise RuntimeError("perf record exited: " + log_path.read_text()[-500:])
        yield
    finally:
        proc, rig.perf_proc = rig.perf_proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                stop_process(proc, timeout=5)
        log.close()
