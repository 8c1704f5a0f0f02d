"""The HAProxy under measurement: its config, its pool of slots, maps and table, its meter.

Names: slot ``i`` is ``/certagent/slot-<i>`` serving ``h<i>.pool.test``, which has an
entry in the pool map and in the stick table; the dense map (a control for map costs)
holds ``d<i>.dense.test``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench._proc import schedstat_ns
from bench.profile_load.payloads import Certs
from bench.profile_load.session import Meter, RuntimeSession, check_replies
from bench.profile_load.settings import Budget, Params, say
from certagent.testing import HAProxyProcess, free_port, rss_kb, stop_process

SLOT = "/certagent/slot-"
TABLE = "fe"  # the stick table lives in the frontend of the same name
FILL_BATCH = 32  # slots per pipelined write while filling


def slot(i: int) -> str:
    return f"{SLOT}{i:06d}"


def host(i: int) -> str:
    return f"h{i:06d}.pool.test"


def dense_key(i: int) -> str:
    return f"d{i:06d}.dense.test"


CONFIG = """\
# bench/profile_load: a minimal HAProxy for runtime-API cost measurements
global
    stats socket {sock} mode 600 level admin
    stats timeout 1d
    ssl-default-bind-options ssl-min-ver TLSv1.2
    # a leaf sent without its chain gets the intermediate from here (q2 ec-leafonly-issuers)
    issuers-chain-path {workdir}/issuers

defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend {table}
    bind 127.0.0.1:{port} ssl crt {workdir}/default.pem crt-list {crtlist}
    stick-table type string len 253 size {table_size} expire 1h store gpt0,conn_cnt
    # references the map, so 'add map' / 'del map' work; no server: closed after the handshake
    use_backend be if {{ ssl_fc_sni,lower,map({mapfile}) -m found }}
    use_backend be if {{ ssl_fc_sni,lower,map({workdir}/dense.map) -m found }}
    default_backend be

backend be
    mode tcp
"""


def write_config(
    workdir: Path, port: int, table_size: int, default_pem: bytes, intermediate_pem: bytes
) -> tuple[Path, str, str, str]:
    """haproxy.cfg and the files it names; returns (config, socket, crt-list, pool map)."""
    sock = str(workdir / "admin.sock")
    crtlist = str(workdir / "pool.crtlist")
    mapfile = str(workdir / "hosts.map")
    (workdir / "dense.map").write_text("")
    (workdir / "default.pem").write_bytes(default_pem)
    Path(crtlist).write_text("")
    Path(mapfile).write_text("")
    (workdir / "issuers").mkdir()
    (workdir / "issuers" / "pool-intermediate.pem").write_bytes(intermediate_pem)
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(
        CONFIG.format(
            sock=sock,
            workdir=workdir,
            table=TABLE,
            port=port,
            crtlist=crtlist,
            table_size=table_size,
            mapfile=mapfile,
        )
    )
    return cfg, sock, crtlist, mapfile


class ProfiledHAProxy:
    """HAProxy, one admin session to it, and a pool of K listed slots (each with a map
    entry and a table entry) that grows during the run; the questions' shared state."""

    def __init__(self, params: Params, workdir: Path, budget: Budget, perf: bool) -> None:
        self.params = params
        self.workdir = workdir
        self.budget = budget
        self.want_perf = perf
        self.certs = Certs(workdir)
        self.port = free_port()
        self.table_size = 2 * params.k_large
        default_pem = self.certs.pem("default.profile.test")
        self.cfg, self.sock, self.crtlist, self.mapfile = write_config(
            workdir, self.port, self.table_size, default_pem, self.certs.ca.chain_pem
        )
        self.haproxy = HAProxyProcess(self.cfg, self.sock, self.port, workdir / "haproxy.log")
        self.pid = 0
        self._session: RuntimeSession | None = None
        self._meter: Meter | None = None
        self.k = 0  # listed slots (each with a map entry and a table entry)
        self.densemap = str(workdir / "dense.map")
        self.dense_k = 0
        self.extra_slots: list[str] = []  # listed slots added by the 'add ssl crt-list' case
        self._serial = 0
        self.result: dict[str, Any] = {}
        self.perf_proc: subprocess.Popen[bytes] | None = None
        self.tls_versions: dict[str, int] = {}

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        pid = self.haproxy.start()
        assert pid is not None
        self.pid = pid
        self._session = RuntimeSession(self.sock)
        self._meter = Meter(self._session, pid)
        threads = len(os.listdir(f"/proc/{pid}/task"))
        say(
            f"HAProxy worker pid {pid} ({threads} threads), port {self.port}, "
            f"table size {self.table_size}"
        )

    def stop(self) -> list[str]:
        """Stop perf (if recording), the session and HAProxy; what was stopped, by PID."""
        stopped = []
        if self.perf_proc is not None and stop_process(self.perf_proc, timeout=10):
            stopped.append(f"perf pid {self.perf_proc.pid}")
        if self._session is not None:
            self._session.close()
        stopped += self.haproxy.stop()
        return stopped

    def alive(self) -> None:
        self.haproxy.check_alive()
        if not Path(f"/proc/{self.pid}").exists():
            raise RuntimeError(f"HAProxy worker {self.pid} is gone:\n{self.haproxy.log()[-2000:]}")

    @property
    def session(self) -> RuntimeSession:
        assert self._session is not None, "start() first"
        return self._session

    @property
    def meter(self) -> Meter:
        assert self._meter is not None, "start() first"
        return self._meter

    def unique(self, prefix: str) -> str:
        """A name never used before in this run: ``<prefix><serial>``."""
        self._serial += 1
        return f"{prefix}{self._serial:06d}"

    def fresh_pem(self, prefix: str) -> bytes:
        """A certificate for a never-seen name (HAProxy caches nothing about it)."""
        return self.certs.pem(self.unique(prefix) + ".test")

    # --- the pool -----------------------------------------------------------------------

    def _fill_steps(self, first: int, end: int) -> list[api.Step]:
        steps: list[api.Step] = []
        for i in range(first, end):
            s, h = slot(i), host(i)
            steps += [
                api.new_cert(s),
                api.set_cert(s, self.certs.pem(h)),
                api.commit_cert(s),
                api.add_to_crtlist(self.crtlist, s),
                api.add_map(self.mapfile, h, s),
                api.set_gpt0(TABLE, h, 1),
            ]
        return steps

    def _next_fill(self, first: int, target: int) -> list[api.Step]:
        """The fill commands of the batch starting at slot ``first`` (none past ``target``)."""
        return self._fill_steps(first, min(target, first + FILL_BATCH)) if first < target else []

    def grow(self, target: int, deadline_left: float = 0.0) -> dict[str, Any]:
        """Add listed slots (new+set+commit+add crt-list) + map + table entries up to ``target``.

        The next batch's certificates are made while HAProxy runs the current one.
        Stops early, keeping what it has, if less than ``deadline_left`` s of budget remain.
        """
        start_k, started, cpu_before = self.k, time.monotonic(), schedstat_ns(self.pid)
        next_report = time.monotonic() + 15
        first = self.k
        pending = self._next_fill(first, target)
        stopped_early = False
        while pending:
            count = len(pending) // 6
            after = first + count
            replies, following = self.session.send_while(
                pending, functools.partial(self._next_fill, after, target)
            )
            check_replies(pending, replies, f"filling slots {first}..{after}")
            self.k = after
            first, pending = after, following
            if time.monotonic() > next_report:
                next_report = time.monotonic() + 15
                rate = (self.k - start_k) / (time.monotonic() - started)
                say(f"  pool {self.k:,} slots ({rate:.0f}/s), RSS {rss_kb(self.pid) / 1024:.0f} MB")
            if pending and self.budget.left() < deadline_left:
                stopped_early = True  # the built-but-unsent batch is dropped
                say(f"  stopping the fill at {self.k:,} slots to stay within the time budget")
                break
        seconds = time.monotonic() - started
        added = max(self.k - start_k, 1)
        return {
            "from_k": start_k,
            "to_k": self.k,
            "seconds": round(seconds, 2),
            "wall_ms_per_slot": round(seconds * 1000 / added, 3),
            "haproxy_cpu_ms_per_slot": round(
                (schedstat_ns(self.pid) - cpu_before) / 1e6 / added, 3
            ),
            "rss_mb": round(rss_kb(self.pid) / 1024, 1),
            "stopped_early": stopped_early,
        }

    def fill_dense_map(self, k: int) -> None:
        """Grow the control map to ``k`` entries in one burst (pipelined 'add map')."""
        steps = [api.add_map(self.densemap, dense_key(i), "x") for i in range(self.dense_k, k)]
        self.session.run(steps, "dense map fill")
        self.dense_k = max(self.dense_k, k)
