"""The processes of the issuance bench: Redis, pebble (+ its DNS) and one node, stopped by PID."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from certagent.testing import RedisProcess, Stack, StackError, write_key_file
from certagent.testing.pebble import Pebble

#: names the agent may order for (``acme_allow_suffixes``); pebble's DNS says 127.0.0.1
SUFFIX = "issuance.bench.test"


def acme_args(ca: Pebble) -> list[str]:
    """``certagent init`` options for on-demand issuance from ``ca``, HTTP-01 on its port."""
    return [
        "--acme-directory", ca.directory_url,
        "--acme-ca-file", str(ca.ca_file),
        "--acme-email", f"bench@{SUFFIX}",
        "--acme-challenge", "http-01",
        "--http-bind", f"127.0.0.1:{ca.http_port}",
    ]  # fmt: skip


@dataclass
class Rig:
    """One node (HAProxy + agent) on a private Redis, issuing from a private pebble."""

    work: Path
    capacity: int
    concurrency: int
    log_level: str = "info"
    redis: RedisProcess | None = None
    pebble: Pebble | None = None
    stack: Stack | None = None
    stopped: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        """pebble's root (new at every start): the only CA the bench client trusts."""
        return self.work / "pebble-root.pem"

    def start(self) -> Rig:
        self.redis = RedisProcess(self.work / "redis").start()
        # the CA at its fastest: no validation sleeps (Pebble's default), no nonce
        # rejection, no authorization reuse (new names would not reuse one anyway)
        self.pebble = Pebble(self.work / "pebble", nonce_reject=0, authz_reuse=0).start()
        self.root.write_bytes(self.pebble.roots_pem())
        self.stack = Stack.create(
            self.work / "node",
            store=self.redis.url,
            cafile=self.root,
            key_file=write_key_file(self.work / "data.key"),
            capacity=self.capacity,
            port=self.pebble.tls_port,
            init_args=acme_args(self.pebble),
            env={
                "CERTAGENT_ACME_ALLOW_SUFFIXES": SUFFIX,
                "CERTAGENT_ACME_CONCURRENCY": str(self.concurrency),
                "CERTAGENT_LOG_LEVEL": self.log_level,
            },
        )
        self.stack.start_haproxy()
        self.stack.start_agent()
        return self

    def pids(self) -> dict[str, int]:
        """The processes whose CPU is read: the node, its store and the CA."""
        assert self.stack is not None and self.stack.agent is not None
        assert self.redis is not None and self.redis.proc is not None
        assert self.pebble is not None and self.pebble.proc and self.pebble.dns_proc
        return {
            "agent": self.stack.agent.pid,
            "haproxy": self.stack.worker_pid(),
            "redis": self.redis.proc.pid,
            "pebble": self.pebble.proc.pid,
            "pebble_dns": self.pebble.dns_proc.pid,
        }

    def check_alive(self) -> None:
        if self.stack is not None:
            self.stack.check_alive()
        if self.pebble is not None and not self.pebble.running:
            raise StackError(f"pebble exited:\n{self.pebble.log_tails()}")

    def close(self) -> list[str]:
        """Stop everything by PID (each even if another fails); what was running."""
        report: list[str] = []
        if self.stack is not None:
            try:
                report += self.stack.close()
            except (OSError, StackError) as exc:
                report.append(f"node: {exc}")
        if self.pebble is not None:
            report += self.pebble.stop()
        if self.redis is not None:
            report += self.redis.stop()
        return report
