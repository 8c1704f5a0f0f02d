"""What every scenario of the preload comparison needs: sizes, processes, certificates.

Every scenario takes the :class:`Bench` and returns a JSON-ready dict.  Processes are
started through :mod:`certagent.testing` and registered with :meth:`Bench.track`, so
the caller stops all of them by PID whatever happens.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import _configs, _native
from bench._certs import Leaves, write_crt_list
from bench._load import Prober, StormResult, storm
from certagent.testing import (
    HAProxyProcess,
    RedisFixture,
    RedisProcess,
    Stack,
    StackError,
    free_port,
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


def mb(kb: int) -> float:
    """KB to MB, one decimal (the reports' memory unit)."""
    return round(kb / 1024, 1)
