"""Redis high availability on loopback: a Sentinel set and a Redis Cluster, by PID.

Same rules as :mod:`certagent.testing.processes`: free loopback ports (never
6379), bounded waits, every process stopped by its PID.  Both are empty and
without persistence.

* :class:`SentinelSet` -- 1 master, 1 replica and 3 sentinels (``redis-server
  CONF --sentinel``; there is no ``redis-sentinel`` binary here) with short
  timeouts: a killed master is noticed after 1 s and a replica promoted a
  second or two later.  ``url`` is a ``redis+sentinel://`` store URL.
* :class:`ClusterSet` -- 3 masters (no replicas) sharing the 16384 slots,
  made with CLUSTER ADDSLOTSRANGE and CLUSTER MEET.  ``url`` is a
  ``redis+cluster://`` store URL.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote, urlencode

import redis

from certagent.testing.processes import (
    PORT_ATTEMPTS,
    REDIS_SERVER,
    START_TIMEOUT,
    StackError,
    free_port,
    spawn,
    stop_process,
    tail,
    wait_for,
)

__all__ = ["ClusterSet", "RedisNode", "SentinelSet"]

SERVICE = "certagent"
_SLOTS = 16384


class RedisNode:
    """One ``redis-server`` (or sentinel) process started from a config file."""

    def __init__(
        self, workdir: Path, name: str, port: int, lines: list[str], password: str | None = None
    ) -> None:
        self.workdir = workdir / name
        self.name = name
        self.port = port
        self.lines = lines + ([f"requirepass {password}"] if password else [])
        self.password = password
        self.log_path = self.workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise StackError(f"{self.name} was not started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, sentinel: bool = False) -> None:
        if not Path(REDIS_SERVER).exists():
            raise StackError(f"redis-server is not installed ({REDIS_SERVER})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / f"{self.name}.conf"  # a sentinel rewrites its file
        conf.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.workdir}",
                    'save ""',
                    "appendonly no",
                    *self.lines,
                ]
            )
            + "\n"
        )
        argv = [REDIS_SERVER, str(conf)] + (["--sentinel"] if sentinel else [])
        self.proc = spawn(argv, self.log_path)

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout, password=self.password
        )

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(
                f"{self.name} (pid {self.proc.pid}) exited with {self.proc.returncode}:\n"
                + tail(self.log_path)
            )

    def wait_ping(self, timeout: float = START_TIMEOUT) -> None:
        def pong() -> bool:
            self.check_alive()
            with self.client(1.0) as client:
                return bool(client.ping())

        wait_for(pong, timeout, f"{self.name} on port {self.port}")

    def kill(self) -> int:
        """SIGKILL by PID (a crash, not a shutdown); returns the PID."""
        pid = self.pid
        if self.running:
            os.kill(pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(5)
        return pid

    def stop(self) -> list[str]:
        if self.proc is None:
            return []
        stop_process(self.proc)
        return [f"{self.name} pid {self.proc.pid}"]


class _Allocating(Protocol):
    def _allocate(self) -> None: ...


_S = TypeVar("_S", bound=_Allocating)


def _with_fresh_ports(which: _S, start: Callable[[float], _S], timeout: float) -> _S:
    """``start(timeout)``; if a node found its port taken (an ephemeral port of some other
    connection, picked after :func:`free_port` chose it), again on fresh ports."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start(timeout)
        except StackError as exc:  # start() stopped every node it had started
            if "Address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                raise
            which._allocate()
    raise AssertionError("unreachable")  # pragma: no cover


class SentinelSet:
    """1 master, 1 replica, 3 sentinels watching service ``certagent``."""

    def __init__(
        self,
        workdir: Path,
        *,
        down_after_ms: int = 1000,
        failover_ms: int = 3000,
        password: str | None = None,
        sentinel_password: str | None = None,
    ):
        """``password``: ``requirepass`` on every process, the sentinels too unless they
        have ``sentinel_password`` of their own."""
        self.workdir = workdir
        self.service = SERVICE
        self.password = password
        self.sentinel_password = sentinel_password
        self._timing = (down_after_ms, failover_ms)
        self._allocate()

    def _allocate(self) -> None:
        """Nodes on fresh free ports (again after a port was taken before its node bound it)."""
        workdir, password = self.workdir, self.password
        sentinel_password = self.sentinel_password or password
        down_after_ms, failover_ms = self._timing
        master_port = free_port()
        auth = [f"masterauth {password}"] if password else []
        self.master = RedisNode(workdir, "master", master_port, auth, password)
        self.replica = RedisNode(
            workdir,
            "replica",
            free_port(),
            [f"replicaof 127.0.0.1 {master_port}", *auth],
            password,
        )
        self.sentinels = [
            RedisNode(
                workdir,
                f"sentinel{i}",
                free_port(),
                [
                    f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2",
                    f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
                    f"sentinel failover-timeout {SERVICE} {failover_ms}",
                    f"sentinel parallel-syncs {SERVICE} 1",
                    *([f"sentinel auth-pass {SERVICE} {password}"] if password else []),
                ],
                sentinel_password,
            )
            for i in range(3)
        ]

    @property
    def nodes(self) -> list[RedisNode]:
        return [self.master, self.replica]

    @property
    def processes(self) -> list[RedisNode]:
        """Every process of the set: the data nodes, then the sentinels."""
        return [*self.nodes, *self.sentinels]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        userinfo = f":{quote(self.password, safe='')}@" if self.password else ""
        url = f"redis+sentinel://{userinfo}{hosts}/{self.service}/0"
        if self.sentinel_password:
            return f"{url}?{urlencode({'sentinel_password': self.sentinel_password})}"
        return f"{url}?sentinel_auth=yes" if self.password else url

    def start(self, timeout: float = 20.0) -> SentinelSet:
        return _with_fresh_ports(self, self._start, timeout)

    def _start(self, timeout: float) -> SentinelSet:
        try:
            for node in self.nodes:
                node.start()
                node.wait_ping()
            wait_for(self._replica_in_sync, timeout, "the replica to sync with the master")
            for sentinel in self.sentinels:
                sentinel.start(sentinel=True)
            for sentinel in self.sentinels:
                sentinel.wait_ping()
                wait_for(partial(self._sentinel_ready, sentinel), timeout, f"{sentinel.name} ready")
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_in_sync(self) -> bool:
        with self.replica.client() as client:
            info = client.info("replication")
        return bool(info.get("master_link_status") == "up")

    def _sentinel_ready(self, sentinel: RedisNode) -> bool:
        sentinel.check_alive()
        with sentinel.client() as client:
            state = client.sentinel_master(self.service)
        return int(state["num-slaves"]) >= 1 and int(state["num-other-sentinels"]) >= 2

    def master_port(self) -> int:
        """The master's port as the sentinels name it."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            with sentinel.client() as client:
                addr = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            if addr:
                return int(addr[1])
        raise StackError("no sentinel names a master")

    def current_master(self) -> RedisNode:
        port = self.master_port()
        return next(n for n in self.nodes if n.port == port)

    def wait_replicated(self, timeout: float = 5.0) -> None:
        """Every write so far reached the replica (``WAIT 1``), or StackError."""
        with self.current_master().client() as client:
            acked = client.execute_command("WAIT", 1, int(timeout * 1000))
        if int(acked) < 1:
            raise StackError("the replica did not acknowledge the writes")

    def kill_master(self) -> RedisNode:
        """SIGKILL the current master by its PID; returns it."""
        master = self.current_master()
        master.kill()
        return master

    def wait_promoted(self, old: RedisNode, timeout: float = 20.0) -> RedisNode:
        """Wait until the sentinels name another master that says it is one."""

        def promoted() -> RedisNode | None:
            port = self.master_port()
            if port == old.port:
                return None
            node = next(n for n in self.nodes if n.port == port)
            with node.client() as client:
                role = client.execute_command("ROLE")
            return node if role[0] == b"master" else None

        return wait_for(promoted, timeout, "a replica promoted by the sentinels", interval=0.05)

    def flushall(self) -> None:
        with self.current_master().client(5.0) as client:
            client.flushall()
        self.wait_replicated()

    def stop(self) -> list[str]:
        report: list[str] = []
        for node in [*self.sentinels, *self.nodes]:
            report += node.stop()
        return report

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ClusterSet:
    """A Redis Cluster of ``masters`` masters, each with ``replicas`` replicas, on loopback.

    ``nodes`` lists the masters first, then the replicas (``replicas`` per master,
    in the masters' order); roles change across a failover, so ask :meth:`masters_now`.
    """

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 0) -> None:
        self.workdir = workdir
        self.masters = masters
        self.replicas = replicas
        self._allocate()

    def _allocate(self) -> None:
        """Nodes on fresh free ports (again after a port was taken before its node bound it)."""
        workdir = self.workdir
        self.nodes: list[RedisNode] = []
        self.bus_ports: list[int] = []
        for i in range(self.masters * (1 + self.replicas)):
            port = free_port()
            self.bus_ports.append(free_port())
            self.nodes.append(
                RedisNode(
                    workdir,
                    f"node{i}",
                    port,
                    [
                        "cluster-enabled yes",
                        f"cluster-config-file nodes-{port}.conf",
                        f"cluster-port {self.bus_ports[-1]}",
                        "cluster-node-timeout 2000",
                        "cluster-require-full-coverage yes",
                    ],
                )
            )

    @property
    def processes(self) -> list[RedisNode]:
        """Every process of the cluster (each node, master or replica)."""
        return list(self.nodes)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 20.0) -> ClusterSet:
        return _with_fresh_ports(self, self._start, timeout)

    def _start(self, timeout: float) -> ClusterSet:
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                node.wait_ping()
            masters = self.nodes[: self.masters]
            share = _SLOTS // len(masters)
            for i, node in enumerate(masters):
                last = _SLOTS - 1 if i == len(masters) - 1 else (i + 1) * share - 1
                with node.client() as client:
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
            with self.nodes[0].client() as client:
                for other, bus in zip(self.nodes[1:], self.bus_ports[1:], strict=True):
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port, bus)
            if self.replicas:
                wait_for(self._all_known, timeout, "every node to know the others", interval=0.05)
                for i, replica in enumerate(self.nodes[self.masters :]):
                    with masters[i // self.replicas].client() as client:
                        master_id = client.execute_command("CLUSTER", "MYID").decode()
                    with replica.client() as client:
                        client.execute_command("CLUSTER", "REPLICATE", master_id)
            wait_for(self._ready, timeout, "the cluster to be ok on every node", interval=0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _all_known(self) -> bool:
        for node in self.nodes:
            node.check_alive()
            with node.client() as client:
                nodes = client.execute_command("CLUSTER", "NODES").decode().splitlines()
            if len(nodes) != len(self.nodes) or any("handshake" in line for line in nodes):
                return False
        return True

    def _ready(self) -> bool:
        for node in self.nodes:
            node.check_alive()
            with node.client() as client:
                info = client.execute_command("CLUSTER", "INFO").decode()
                known = len(client.execute_command("CLUSTER", "NODES").decode().splitlines())
                if node in self.nodes[self.masters :]:
                    link = client.info("replication").get("master_link_status")
                    if link != "up":
                        return False
            if "cluster_state:ok" not in info or known != len(self.nodes):
                return False
        return True

    def masters_now(self) -> list[RedisNode]:
        """The running nodes that are masters now."""
        found = []
        for node in self.nodes:
            if node.running:
                with node.client() as client:
                    if client.info("replication").get("role") == "master":
                        found.append(node)
        return found

    def owner_of(self, key: str) -> RedisNode:
        """The master that serves ``key``'s slot now, as the first running master sees it."""
        with self.masters_now()[0].client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            shards = client.execute_command("CLUSTER", "SLOTS")
        for first, last, master, *_ in shards:
            if int(first) <= slot <= int(last):
                return next(n for n in self.nodes if n.port == int(master[1]))
        raise RuntimeError(f"no master serves the slot of {key!r}")

    def wait_replicated(self, timeout: float = 5.0) -> None:
        """Every master's writes are on its replicas (WAIT on each master)."""
        if not self.replicas:
            return
        for node in self.masters_now():
            with node.client(timeout + 1) as client:
                got = client.execute_command("WAIT", self.replicas, int(timeout * 1000))
            if int(got) < self.replicas:
                raise RuntimeError(f"{node.name}: {got} of {self.replicas} replicas in sync")

    def kill_master(self, index: int = 0) -> RedisNode:
        """SIGKILL node ``index`` by its PID: a replica of it takes over its slots after the
        node timeout (2 s); without replicas its slots go down."""
        node = self.nodes[index]
        node.kill()
        return node

    def wait_promoted(self, old: RedisNode, timeout: float = 20.0) -> RedisNode:
        """A replica of ``old`` once it is a master and the cluster is ok again."""

        def promoted() -> RedisNode | None:
            for node in self.masters_now():
                if node in self.nodes[self.masters :]:
                    with node.client() as client:
                        info = client.execute_command("CLUSTER", "INFO").decode()
                    if "cluster_state:ok" in info:
                        return node
            return None

        found: RedisNode = wait_for(promoted, timeout, f"a replica of {old.name} promoted")
        return found

    def all_keys(self) -> list[bytes]:
        """Every key on every master (small test data sets only)."""
        found: list[bytes] = []
        for node in self.masters_now():
            with node.client() as client:
                found += client.keys("*")
        return found

    def flushall(self) -> None:
        for node in self.masters_now():  # replicas refuse writes; they follow
            with node.client(5.0) as client:
                client.flushall()

    def stop(self) -> list[str]:
        report: list[str] = []
        for node in self.nodes:
            report += node.stop()
        return report

    def __enter__(self) -> ClusterSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
