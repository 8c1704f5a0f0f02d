"""Real Redis, HAProxy 2.6 and ``certagent run`` processes on loopback.

One harness for the integration tests (``tests/integration/conftest.py`` wraps
it in fixtures), the demo (``demo/run.py``) and the benchmarks (``bench/``).
No pytest here: every failure is a :class:`StackError` whose message says what
went wrong, with a log tail where one helps.

Rules every caller gets for free:

* everything listens on loopback, on ports the kernel says are free (never
  80, 443 or 6379), with unix sockets in a short directory (paths < 100 chars);
* every wait is a bounded loop;
* every process started here is stopped by its PID -- SIGTERM, then SIGKILL
  after a bound -- and HAProxy's worker is killed by PID only if its command
  line still names our configuration;
* children run in their own session, so a Ctrl-C in the terminal reaches only
  the Python process, which then stops them in order.

The pieces::

    redis = RedisProcess(workdir).start()                # redis-server, free port
    pki = PKI.create(workdir / "root.pem")               # test CA, shared leaf key
    store = RedisFixture(redis.url, write_key_file(workdir / "keys"))
    store.put([pki.bundle("a.example.test")])            # the agent's own RedisStore.put
    stack = Stack.create(workdir / "s", store=redis.url, cafile=pki.cafile,
                         key_file=store.key_file, capacity=100)
    stack.start_haproxy(); stack.start_agent()
    stack.handshake("a.example.test")                    # verified TLS
    stack.close(); redis.stop()

:class:`HAProxyProcess` runs any HAProxy configuration with an admin socket
(the benchmarks use it for preload configurations too).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent import config
from agent.keycrypt import KeyRing, generate_key_line
from agent.pem import CertBundle, parse_bundle
from agent.store.redis import RedisStore
from tests import tlsclient
from tests.certs import CA, KeyType, combined, issue, make_ca, shared_key

__all__ = [
    "HAPROXY",
    "PKI",
    "REDIS_SERVER",
    "SLOT_PREFIX",
    "HAProxyProcess",
    "Prober",
    "RedisFixture",
    "RedisProcess",
    "Stack",
    "StackError",
    "certagent_argv",
    "cpu_seconds",
    "free_port",
    "pid_alive",
    "rss_kb",
    "stop_process",
    "tail",
    "unix_request",
    "wait_for",
    "write_key_file",
]

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
SLOT_PREFIX = "/certagent/slot-"
STOP_TIMEOUT = 10.0  # the agent drains for at most 5 s
START_TIMEOUT = 10.0
_FORBIDDEN_PORTS = (80, 443, 6379)
_CLK_TCK = os.sysconf("SC_CLK_TCK")

T = TypeVar("T")


class StackError(Exception):
    """A process did not start, died, or did not answer in time; the message says which."""


# --- small process and polling helpers --------------------------------------------------


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (never 80/443/6379)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _FORBIDDEN_PORTS:
            return port
    raise StackError("no free loopback port")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``probe`` until it returns something truthy; StackError after ``timeout``.

    OSError, ValueError, KeyError and Redis errors from ``probe`` count as "not
    yet"; a :class:`StackError` from it (a process died) ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
        except (OSError, ValueError, KeyError, redis.RedisError) as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            raise StackError(
                f"timed out after {timeout}s waiting for {what} (last error: {last_error})"
            )
        time.sleep(interval)


def spawn(
    argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, stdout and stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = STOP_TIMEOUT) -> bool:
    """SIGTERM ``proc`` by its PID, SIGKILL it if still there after ``timeout``.

    Returns True if it was running (and is now stopped).
    """
    if proc is None or proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
    return True


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def rss_kb(pid: int) -> int:
    """VmRSS of ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of stat(5)); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def certagent_argv() -> list[str]:
    """The ``certagent`` command of the venv running this Python."""
    script = Path(sys.executable).with_name("certagent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


def unix_request(path: str, data: bytes, *, timeout: float = 5.0, line: bool = False) -> bytes:
    """Send ``data`` on a fresh unix-socket connection; read one line, or until EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(data)
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if line and chunk.endswith(b"\n"):
                break
        return b"".join(chunks)


def tail(path: Path, lines: int = 15, indent: str = "    ") -> str:
    """The last ``lines`` lines of a log file, indented; ``(no log)`` if it is missing."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"{indent}(no log)"
    return "\n".join(indent + line for line in text[-lines:])


def _kill_pid_if(pid: int, marker: str, timeout: float = STOP_TIMEOUT) -> bool:
    """SIGTERM then SIGKILL ``pid``, only while its command line contains ``marker``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if marker.encode() not in cmdline or not pid_alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    return True


# --- Redis -------------------------------------------------------------------------------


class RedisProcess:
    """A private ``redis-server`` on a free loopback port, no persistence."""

    def __init__(self, workdir: Path, *, log_path: Path | None = None) -> None:
        self.workdir = workdir
        self.log_path = log_path or workdir / "redis.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = START_TIMEOUT) -> RedisProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise StackError(f"redis-server pid {self.proc.pid} is already running")
        if not Path(REDIS_SERVER).exists():
            raise StackError(f"redis-server is not installed ({REDIS_SERVER})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = spawn(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
            ],
            self.log_path,
        )  # fmt: skip
        proc = self.proc

        def pong() -> bool:
            if proc.poll() is not None:
                raise StackError(
                    f"redis-server exited with {proc.returncode}:\n{tail(self.log_path)}"
                )
            with redis.Redis.from_url(self.url, socket_timeout=1) as client:
                return bool(client.ping())

        try:
            wait_for(pong, timeout, "redis-server")
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, timeout: float = 5.0) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=timeout)

    def flushall(self) -> None:
        with self.client() as client:
            client.flushall()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(
                f"redis-server (pid {self.proc.pid}) exited with status {self.proc.returncode}:\n"
                + tail(self.log_path)
            )

    def stop(self) -> list[str]:
        """Stop it by PID; the list names what was running (for a report)."""
        if self.proc is None:
            return []
        stop_process(self.proc)
        return [f"redis pid {self.proc.pid}"]

    def __enter__(self) -> RedisProcess:
        return self if self.proc is not None and self.proc.poll() is None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_key_file(path: Path, kid: str = "k1") -> Path:
    """A data-key file (``key_file`` setting) with one fresh AES-256 key, mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{generate_key_line(kid)}\n")
    return path


@dataclass(frozen=True)
class RedisFixture:
    """A Redis store (URL) and the key file its records are encrypted with."""

    url: str
    key_file: Path

    def open(self) -> RedisStore:
        return RedisStore(self.url, keyring=KeyRing.from_file(self.key_file))

    def flushall(self) -> None:
        with redis.Redis.from_url(self.url, socket_timeout=5) as client:
            client.flushall()

    def put(self, bundles: Iterable[CertBundle], *, concurrency: int = 1) -> int:
        """Store ``bundles`` with the agent's own ``RedisStore.put`` (MULTI/EXEC each).

        ``concurrency`` puts run at once (the benchmarks fill 100k records).
        Returns how many were stored.
        """

        async def main() -> int:
            store = self.open()
            done = 0
            try:
                batch: list[CertBundle] = []
                for bundle in bundles:
                    batch.append(bundle)
                    if len(batch) >= concurrency:
                        await asyncio.gather(*(store.put(b) for b in batch))
                        done += len(batch)
                        batch = []
                if batch:
                    await asyncio.gather(*(store.put(b) for b in batch))
                    done += len(batch)
            finally:
                await store.close()
            return done

        return asyncio.run(main())


# --- certificates ------------------------------------------------------------------------


@dataclass
class PKI:
    """A test CA (root written to ``cafile`` for clients); leaves share one key (fast)."""

    ca: CA
    cafile: Path
    key_type: KeyType = "ec"

    @classmethod
    def create(cls, cafile: Path, name: str = "certagent test CA", key_type: KeyType = "ec") -> PKI:
        ca = make_ca(name, key_type=key_type)
        cafile.parent.mkdir(parents=True, exist_ok=True)
        cafile.write_bytes(ca.root_pem)
        return cls(ca, cafile, key_type)

    def chain_and_key(self, *names: str) -> tuple[bytes, bytes]:
        return issue(self.ca, *names, key=shared_key(self.key_type))

    def bundle(self, *names: str) -> CertBundle:
        return parse_bundle(*self.chain_and_key(*names))

    def combined_pem(self, *names: str) -> bytes:
        return combined(*self.chain_and_key(*names))


# --- HAProxy -----------------------------------------------------------------------------


class HAProxyProcess:
    """``haproxy -W -db -f CFG`` (master-worker); CFG must have an admin ``stats socket``."""

    def __init__(self, cfg: Path, admin_socket: str, port: int, log_path: Path) -> None:
        self.cfg = cfg
        self.admin_socket = admin_socket
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.worker_pids: set[int] = set()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, wait: bool = True, timeout: float = START_TIMEOUT) -> int | None:
        """Start it; with ``wait``, return the worker PID once it answers and listens."""
        if self.running:
            raise StackError("HAProxy is already running")
        self.proc = spawn([HAPROXY, "-W", "-db", "-f", str(self.cfg)], self.log_path)
        return self.wait_ready(timeout) if wait else None

    def wait_ready(self, timeout: float = START_TIMEOUT) -> int:
        """Wait until the worker answers ``show info`` and the TCP port accepts."""
        proc = self.proc
        if proc is None:
            raise StackError("HAProxy was not started")

        def ready() -> int | None:
            if proc.poll() is not None:
                raise StackError(f"HAProxy exited with {proc.returncode}:\n{self.log()[-3000:]}")
            pid = self.worker_pid()
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
            return pid

        pid = wait_for(ready, timeout, "HAProxy to listen", interval=0.01)
        self.worker_pids.add(pid)
        return pid

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(
                f"haproxy (pid {self.proc.pid}) exited with status {self.proc.returncode}:\n"
                + tail(self.log_path)
            )

    def stop(self) -> list[str]:
        """Stop the master by PID, then any worker left (by PID, if still ours)."""
        report = []
        if self.proc is not None:
            stop_process(self.proc)
            report.append(f"haproxy pid {self.proc.pid}")
        for pid in sorted(self.worker_pids):
            _kill_pid_if(pid, str(self.cfg))
            report.append(f"haproxy worker pid {pid}")
        self.worker_pids.clear()
        return report

    def restart(self) -> int:
        self.stop()
        pid = self.start()
        assert pid is not None
        return pid

    def reload(self, timeout: float = START_TIMEOUT) -> int:
        """SIGUSR2 to the master; wait for the new worker; return its PID."""
        if self.proc is None:
            raise StackError("HAProxy was not started")
        old = self.worker_pid()
        os.kill(self.proc.pid, signal.SIGUSR2)
        pid = wait_for(lambda: (p := self.worker_pid()) != old and p, timeout, "the new worker")
        self.worker_pids.add(pid)
        return pid

    def admin(self, command: str, timeout: float = 5.0) -> str:
        """One runtime-API command on a fresh connection to the admin socket."""
        raw = unix_request(self.admin_socket, command.encode() + b"\n", timeout=timeout)
        return raw.decode("utf-8", "replace")

    def info(self) -> dict[str, str]:
        out = {}
        for line in self.admin("show info").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out

    def worker_pid(self) -> int:
        for line in self.admin("show info").splitlines():
            if line.startswith("Pid: "):
                return int(line[5:])
        raise ValueError("no Pid in 'show info'")

    def worker_rss_kb(self) -> int:
        return rss_kb(self.worker_pid())

    def worker_cpu_seconds(self, pid: int | None = None) -> float:
        return cpu_seconds(pid if pid is not None else self.worker_pid())

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


# --- the stack ---------------------------------------------------------------------------


@dataclass
class Stack:
    """One ``certagent init`` directory with its HAProxy and agent processes."""

    directory: Path
    run_dir: Path
    port: int
    cafile: Path
    env: dict[str, str]
    log_dir: Path | None = None  # default: ``directory``
    settings: config.Settings = field(init=False)
    default_der: bytes = field(init=False)  # the fallback certificate clients may get
    haproxy: HAProxyProcess = field(init=False)
    agent: subprocess.Popen[bytes] | None = None
    _owns_run_dir: bool = False

    def __post_init__(self) -> None:
        self.settings = config.load(self.config_path, environ={})
        pem = (self.directory / "default.pem").read_bytes()
        self.default_der = x509.load_pem_x509_certificate(pem).public_bytes(
            serialization.Encoding.DER
        )
        logs = self.log_dir or self.directory
        logs.mkdir(parents=True, exist_ok=True)
        self.haproxy = HAProxyProcess(
            self.haproxy_cfg, self.settings.haproxy_socket, self.port, logs / "haproxy.log"
        )

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        store: str,
        cafile: Path,
        key_file: Path | None = None,
        capacity: int = 100,
        fallback: str = "default-cert",
        run_dir: Path | None = None,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> Stack:
        """``certagent init`` into ``directory`` (loopback, a free port); nothing started.

        ``run_dir`` (unix sockets) defaults to a fresh ``/tmp/ca-*`` that
        :meth:`close` removes.  The agent gets a clean environment: PATH,
        PYTHONPATH, ``CERTAGENT_KEY_FILE`` (if ``key_file``) and ``env``.
        """
        owns_run_dir = run_dir is None
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix="ca-"))
        port = port or free_port()
        try:
            subprocess.run(
                [
                    *certagent_argv(), "init", str(directory),
                    "--bind", f"127.0.0.1:{port}",
                    "--store", store,
                    "--capacity", str(capacity),
                    "--fallback", fallback,
                    "--run-dir", str(run_dir),
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            if owns_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise StackError(
                f"certagent init failed: {exc.stderr.decode(errors='replace')}"
            ) from exc
        except BaseException:
            if owns_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        agent_env = {key: os.environ[key] for key in ("PATH", "PYTHONPATH") if key in os.environ}
        if key_file is not None:
            agent_env["CERTAGENT_KEY_FILE"] = str(key_file)
        agent_env.update(env or {})
        stack = cls(directory, run_dir, port, cafile, agent_env, log_dir)
        stack._owns_run_dir = owns_run_dir
        return stack

    # paths
    @property
    def config_path(self) -> Path:
        return self.directory / "certagent.toml"

    @property
    def haproxy_cfg(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def agent_log_path(self) -> Path:
        return (self.log_dir or self.directory) / "certagent.log"

    @property
    def haproxy_log_path(self) -> Path:
        return self.haproxy.log_path

    # HAProxy
    def start_haproxy(self, timeout: float = START_TIMEOUT) -> int:
        """Start HAProxy (master-worker) and wait until its worker answers and listens."""
        pid = self.haproxy.start(timeout=timeout)
        assert pid is not None
        return pid

    def stop_haproxy(self) -> list[str]:
        return self.haproxy.stop()

    def restart_haproxy(self) -> int:
        return self.haproxy.restart()

    def reload_haproxy(self) -> int:
        return self.haproxy.reload()

    def admin(self, command: str) -> str:
        return self.haproxy.admin(command)

    def worker_pid(self) -> int:
        return self.haproxy.worker_pid()

    def worker_rss_kb(self) -> int:
        return self.haproxy.worker_rss_kb()

    def haproxy_log(self) -> str:
        return self.haproxy.log()

    def ssl_certs(self) -> list[str]:
        """Certificate names HAProxy holds (``show ssl cert``), ``*`` of a transaction removed."""
        return [
            line.lstrip("*")
            for line in self.admin("show ssl cert").splitlines()
            if line.strip() and not line.startswith("#")
        ]

    def slot_certs(self) -> list[str]:
        return [n for n in self.ssl_certs() if n.startswith(SLOT_PREFIX)]

    def crt_list_lines(self) -> list[str]:
        reply = self.admin(f"show ssl crt-list {self.settings.crt_list}")
        return [line for line in reply.splitlines() if line.strip() and not line.startswith("#")]

    def map_entries(self) -> dict[str, str]:
        out = {}
        for line in self.admin(f"show map {self.settings.map_file}").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0].startswith("0x"):
                out[parts[1]] = parts[2]
        return out

    def consistency_problems(self) -> list[str]:
        """Disagreements between HAProxy's certificates, crt-list and map and the agent's status."""
        problems = []
        slots = self.slot_certs()
        lines = self.crt_list_lines()
        status = self.status()
        if len(slots) != status["slots_used"]:
            problems.append(f"{len(slots)} slot certificates but slots_used={status['slots_used']}")
        if len(set(slots)) != len(slots):
            problems.append(f"duplicate certificate names: {sorted(slots)}")
        if len(set(lines)) != len(lines):
            problems.append(f"duplicate crt-list lines: {sorted(lines)}")
        if not set(lines) <= set(slots):
            problems.append(f"crt-list lines without a certificate: {set(lines) - set(slots)}")
        mapped = self.map_entries()
        stray = {h: s for h, s in mapped.items() if s not in lines}
        if stray:
            problems.append(f"map entries pointing at no crt-list slot: {stray}")
        agent_hosts = {h for slot in status["slots"] for h in slot["hosts"]}
        if set(mapped) != agent_hosts:
            problems.append(f"HAProxy maps {sorted(mapped)}, agent has {sorted(agent_hosts)}")
        return problems

    # agent
    def start_agent(
        self, *, wait: bool = True, timeout: float = START_TIMEOUT
    ) -> subprocess.Popen[bytes]:
        """``certagent run``; with ``wait``, until it answers and has adopted HAProxy's state."""
        if self.agent is not None and self.agent.poll() is None:
            raise StackError("the agent is already running")
        self.agent = spawn(
            [*certagent_argv(), "run", "--config", str(self.config_path)],
            self.agent_log_path,
            self.env,
        )
        if wait:
            self.wait_agent(timeout)
        return self.agent

    def wait_agent(self, timeout: float = START_TIMEOUT) -> None:
        proc = self.agent
        if proc is None:
            raise StackError("the agent was not started")

        def synced() -> bool:
            if proc.poll() is not None:
                raise StackError(
                    f"agent exited with {proc.returncode}:\n{self.agent_log()[-3000:]}"
                )
            return not self.haproxy.running or self.status()["haproxy_pid"] is not None

        wait_for(synced, timeout, "the agent to answer and adopt HAProxy's state")

    def stop_agent(self) -> int | None:
        """SIGTERM the agent by PID (SIGKILL after a bound); return its exit code."""
        stop_process(self.agent)
        return None if self.agent is None else self.agent.returncode

    def check_alive(self) -> None:
        """StackError (with a log tail) if HAProxy or the agent has exited."""
        self.haproxy.check_alive()
        if self.agent is not None and self.agent.poll() is not None:
            raise StackError(
                f"certagent (pid {self.agent.pid}) exited with status {self.agent.returncode}:\n"
                + tail(self.agent_log_path)
            )

    def cli(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``certagent <command> --config <toml> ...`` with the agent's environment."""
        return subprocess.run(
            [*certagent_argv(), command, "--config", str(self.config_path), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def agent_request(self, line: bytes, timeout: float = 10.0) -> bytes:
        return unix_request(self.settings.agent_socket, line, timeout=timeout, line=True)

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.agent_request(b"status\n"))
        return result

    def ensure(self, host: str | bytes) -> str:
        raw = host.encode() if isinstance(host, str) else host
        return self.agent_request(b"ensure " + raw + b"\n").decode().strip()

    def agent_log(self) -> str:
        try:
            return self.agent_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def runtime_commands(self) -> list[str]:
        """Every runtime-API command the agent logged (``runtime-api> ...``, debug level)."""
        marker = "runtime-api> "
        return [
            line.split(marker, 1)[1] for line in self.agent_log().splitlines() if marker in line
        ]

    def serving_count(self, host: str) -> int:
        """How many times the agent logged loading ``host`` (one INFO line per load)."""
        needle = f" serving {host} from "
        return sum(needle in line for line in self.agent_log().splitlines())

    # clients
    def handshake(self, host: str, timeout: float = 5.0) -> tlsclient.CertInfo:
        return tlsclient.handshake(self.port, host, self.cafile, timeout=timeout)

    def hello(self, sni: bytes | None, timeout: float = 5.0) -> bytes | None:
        return tlsclient.raw_hello(self.port, sni, timeout=timeout)

    def close(self) -> list[str]:
        """Stop the agent, then HAProxy, by PID; the list names what was running."""
        report = []
        try:
            if self.agent is not None:
                stop_process(self.agent)
                report.append(f"certagent pid {self.agent.pid}")
        finally:
            report += self.stop_haproxy()
            if self._owns_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        return report

    def log_tails(self, lines: int = 60) -> str:
        agent = "\n".join(self.agent_log().splitlines()[-lines:])
        haproxy = "\n".join(self.haproxy_log().splitlines()[-lines:])
        return (
            f"--- agent log tail ({self.agent_log_path})\n{agent}\n"
            f"--- haproxy log tail ({self.haproxy_log_path})\n{haproxy}"
        )


class Prober:
    """A background thread doing a verified handshake for ``host`` every ``interval`` s."""

    def __init__(self, stack: Stack, host: str, interval: float = 0.1) -> None:
        self.stack, self.host, self.interval = stack, host, interval
        self.ok = 0
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"prober-{host}", daemon=True)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                info = self.stack.handshake(self.host)
                if self.host not in info.san:
                    raise AssertionError(f"got a certificate for {info.san}")
            except (OSError, AssertionError) as exc:  # ssl.SSLError is an OSError
                self.failures.append(f"{started:.3f}: {exc!r}")
            else:
                self.ok += 1
                self.latencies.append(time.monotonic() - started)
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def wait_first(self, timeout: float = 5.0) -> None:
        """Wait for the first verified handshake (the host's one load)."""
        deadline = time.monotonic() + timeout
        while self.ok == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.ok > 0, self.failures

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT)
        assert not self._thread.is_alive(), "prober thread did not stop"
