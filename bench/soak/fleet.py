"""The soak's fleet: a Redis (or a Sentinel set), pebble, imported certificates, N nodes.

Every node is ``certagent init`` with the agent's defaults except what the harness
needs: loopback ports and paths, the CA's directory URL and trust bundle, and the
permission policy allowing the on-demand names (``CERTAGENT_ACME_ALLOW_SUFFIXES``).
Node 0 listens on pebble's HTTP-01 port; the other nodes answer the challenges it
publishes through the store, as any fleet does.  Every process is started through
:mod:`certagent.testing` and stopped by its PID.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._certs import Leaves
from bench.soak.config import ONDEMAND_SUFFIX, SoakConfig, imported_host
from certagent.testing import (
    PKI,
    RedisFixture,
    RedisProcess,
    SentinelSet,
    Stack,
    StackError,
    free_port,
    write_key_file,
)
from certagent.testing.pebble import Pebble

AGENT_START_TIMEOUT = 60.0  # a loaded 2-CPU machine starts an agent in seconds, not 10


@dataclass
class Fleet:
    config: SoakConfig
    say: Callable[[str], None]
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-soak-")))
    redis: RedisProcess | None = None
    sentinels: SentinelSet | None = None
    pebble: Pebble | None = None
    pki: PKI | None = None
    store: RedisFixture | None = None
    stacks: list[Stack] = field(default_factory=list)

    # --- start -------------------------------------------------------------------------

    def start(self) -> Fleet:
        cfg = self.config
        key_file = write_key_file(self.work / "data.key")
        if cfg.sentinel:
            self.sentinels = SentinelSet(self.work / "sentinel").start()
            self.store = RedisFixture(self.sentinels.url, key_file, self.sentinels.flushall)
        else:
            self.redis = RedisProcess(self.work / "redis").start()
            self.store = RedisFixture(self.redis.url, key_file)
        self.say(f"bench.soak: store {self.store.url}")
        self.pebble = Pebble(self.work / "pebble", validity=cfg.lifetime).start()
        self.pki = PKI.create(self.work / "imported-ca.pem", name="certagent soak import CA")
        if cfg.imported:
            leaves = Leaves(self.pki)
            stored = self.store.put(
                (leaves.bundle(imported_host(i)) for i in range(cfg.imported)), concurrency=64
            )
            self.say(f"bench.soak: {stored} imported certificates stored")
        for i in range(cfg.nodes):
            self._node(i)
        return self

    def _node(self, index: int) -> None:
        ca, store, pki = self.pebble, self.store, self.pki
        assert ca is not None and store is not None and pki is not None
        first = index == 0  # the node pebble validates against (HTTP-01)
        http = ca.http_port if first else free_port()
        stack = Stack.create(
            self.work / f"node{index}",
            store=store.url,
            cafile=pki.cafile,
            key_file=store.key_file,
            capacity=self.config.capacity,
            port=ca.tls_port if first else None,
            init_args=[
                "--acme-directory", ca.directory_url,
                "--acme-ca-file", str(ca.ca_file),
                "--acme-email", "ops@soak.test",
                "--http-bind", f"127.0.0.1:{http}",
            ],
            env={"CERTAGENT_ACME_ALLOW_SUFFIXES": ONDEMAND_SUFFIX},
        )  # fmt: skip
        self.stacks.append(stack)  # before it starts: close() stops whatever did
        stack.start_haproxy(timeout=AGENT_START_TIMEOUT)
        stack.start_agent(timeout=AGENT_START_TIMEOUT)
        pid = stack.agent.pid if stack.agent is not None else None
        self.say(f"bench.soak: node{index} on 127.0.0.1:{stack.port} (agent pid {pid})")

    # --- what runs ---------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        """Every process the system needs, by role, as of now (PIDs change on restarts)."""
        out: dict[str, int] = {}
        for i, stack in enumerate(self.stacks):
            if stack.agent is not None and stack.agent.poll() is None:
                out[f"node{i}.agent"] = stack.agent.pid
            if stack.haproxy.proc is not None and stack.haproxy.running:
                out[f"node{i}.haproxy_master"] = stack.haproxy.proc.pid
                try:
                    out[f"node{i}.haproxy_worker"] = stack.worker_pid()
                except (OSError, ValueError) as exc:  # mid-reload: sampled next time
                    self.say(f"bench.soak: node{i}'s HAProxy worker not sampled: {exc}")
        if self.redis is not None and self.redis.proc is not None:
            out["redis"] = self.redis.proc.pid
        if self.sentinels is not None:
            for node in self.sentinels.processes:
                if node.running:
                    out[f"redis.{node.name}"] = node.pid
        if self.pebble is not None:
            for role, proc in (
                ("pebble", self.pebble.proc),
                ("challtestsrv", self.pebble.dns_proc),
            ):
                if proc is not None and proc.poll() is None:
                    out[role] = proc.pid
        return out

    def check_alive(self) -> list[str]:
        """What has died that should not have (HAProxy; an agent outside a kill)."""
        problems = []
        for i, stack in enumerate(self.stacks):
            try:
                stack.haproxy.check_alive()
            except StackError as exc:
                problems.append(f"node{i}: {exc}")
        return problems

    # --- stop --------------------------------------------------------------------------

    def close(self, keep: bool = False) -> list[str]:
        """Stop everything started here, by PID; remove the scratch folder unless ``keep``."""
        report: list[str] = []
        for stack in self.stacks:
            try:
                report += stack.close()
            except (OSError, StackError) as exc:
                self.say(f"bench.soak: stopping {stack.directory.name} failed: {exc}")
        if self.pebble is not None:
            report += self.pebble.stop()
        if self.sentinels is not None:
            report += self.sentinels.stop()
        if self.redis is not None:
            report += self.redis.stop()
        if keep:
            self.say(f"bench.soak: kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)
        return report
