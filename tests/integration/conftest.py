"""Fixtures for the integration tests: a real Redis, HAProxy 2.6 and ``certagent run``.

Everything listens on loopback, on ports the kernel says are free, with unix
sockets in a short ``/tmp/ca-*`` directory; every process started here is
stopped by its PID (SIGTERM, then SIGKILL after a bound), even when a test
fails.  Every wait is a bounded loop.

* ``redis_store`` -- a session-wide ``redis-server``, flushed for each test, with
  ``.url`` and ``.put(bundles)``.
* ``pki`` -- a session-wide test CA (root file for clients) that issues leaves.
* ``make_stack(store, capacity=..., fallback=..., env=...)`` -- ``certagent init``
  into a fresh directory, then HAProxy and the agent (debug log), as a
  :class:`Stack`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from agent import config
from agent.keycrypt import KeyRing, generate_key_line
from agent.pem import CertBundle, parse_bundle
from agent.store.redis import RedisStore
from tests import tlsclient
from tests.certs import CA, combined, issue, make_ca, shared_key

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
SLOT_PREFIX = "/certagent/slot-"
STOP_TIMEOUT = 10.0  # the agent drains for at most 5 s
START_TIMEOUT = 10.0

T = TypeVar("T")


# --- small process and polling helpers --------------------------------------------------


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (never 80/443/6379)."""
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in (80, 443, 6379):
            return port
    raise RuntimeError("no free port")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout``."""
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
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM ``proc`` by its PID, SIGKILL it if it is still there after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def certagent_argv() -> list[str]:
    """The ``certagent`` command of the venv running the tests."""
    script = Path(sys.executable).with_name("certagent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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


# --- certificates ------------------------------------------------------------------------


@dataclass
class PKI:
    """The session's test CA; leaves share one ECDSA key (signing stays fast)."""

    ca: CA
    cafile: Path

    def bundle(self, *names: str) -> CertBundle:
        chain, key = issue(self.ca, *names, key=shared_key())
        return parse_bundle(chain, key)

    def combined_pem(self, *names: str) -> bytes:
        return combined(*issue(self.ca, *names, key=shared_key()))


@dataclass(frozen=True)
class RedisFixture:
    """The session's Redis (emptied for each test) and the key file its records use."""

    url: str
    key_file: Path

    def open(self) -> RedisStore:
        kwargs: dict[str, Any] = {}
        if "keyring" in inspect.signature(RedisStore).parameters:  # keys encrypted at rest
            kwargs["keyring"] = KeyRing.from_file(self.key_file)
        return RedisStore(self.url, **kwargs)

    def put(self, bundles: Sequence[CertBundle]) -> None:
        """Store ``bundles`` with the agent's own RedisStore.put (one MULTI/EXEC each)."""

        async def main() -> None:
            store = self.open()
            try:
                for bundle in bundles:
                    await store.put(bundle)
            finally:
                await store.close()

        asyncio.run(main())


# --- the stack ---------------------------------------------------------------------------


@dataclass
class Stack:
    """One ``certagent init`` directory with its HAProxy and agent processes."""

    directory: Path
    run_dir: Path
    port: int
    cafile: Path
    env: dict[str, str]
    settings: config.Settings = field(init=False)
    default_der: bytes = field(init=False)  # the fallback certificate clients may get
    haproxy: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None
    worker_pids: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.settings = config.load(self.config_path, environ={})
        pem = (self.directory / "default.pem").read_bytes()
        self.default_der = x509.load_pem_x509_certificate(pem).public_bytes(
            serialization.Encoding.DER
        )

    # paths
    @property
    def config_path(self) -> Path:
        return self.directory / "certagent.toml"

    @property
    def haproxy_cfg(self) -> Path:
        return self.directory / "haproxy.cfg"

    @property
    def agent_log_path(self) -> Path:
        return self.directory / "agent.log"

    @property
    def haproxy_log_path(self) -> Path:
        return self.directory / "haproxy.log"

    # HAProxy
    def start_haproxy(self) -> int:
        """Start HAProxy (master-worker) and wait until its worker answers and listens."""
        assert self.haproxy is None or self.haproxy.poll() is not None, "HAProxy already running"
        with open(self.haproxy_log_path, "ab") as log:
            self.haproxy = subprocess.Popen(
                [HAPROXY, "-W", "-db", "-f", str(self.haproxy_cfg)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = self.haproxy

        def ready() -> int | None:
            if proc.poll() is not None:
                pytest.fail(f"HAProxy exited with {proc.returncode}:\n{self.haproxy_log()}")
            pid = self.worker_pid()
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                pass
            return pid

        pid = wait_for(ready, START_TIMEOUT, "HAProxy to listen")
        self.worker_pids.add(pid)
        return pid

    def stop_haproxy(self) -> None:
        stop_process(self.haproxy)
        # The master takes its worker down with it; make sure, by PID.
        for pid in list(self.worker_pids):
            self._kill_leftover(pid)

    def restart_haproxy(self) -> int:
        self.stop_haproxy()
        return self.start_haproxy()

    def reload_haproxy(self) -> int:
        """SIGUSR2 to the master; wait for the new worker; return its PID."""
        assert self.haproxy is not None
        old = self.worker_pid()
        os.kill(self.haproxy.pid, signal.SIGUSR2)
        pid = wait_for(
            lambda: (p := self.worker_pid()) != old and p, START_TIMEOUT, "the reloaded worker"
        )
        self.worker_pids.add(pid)
        return pid

    def _kill_leftover(self, pid: int) -> None:
        """Kill ``pid`` only if it is still one of our HAProxy processes."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if str(self.haproxy_cfg).encode() not in cmdline:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)

    def admin(self, command: str) -> str:
        """One runtime-API command on a fresh connection to HAProxy's admin socket."""
        raw = unix_request(self.settings.haproxy_socket, command.encode() + b"\n")
        return raw.decode("utf-8", "replace")

    def worker_pid(self) -> int:
        for line in self.admin("show info").splitlines():
            if line.startswith("Pid: "):
                return int(line[5:])
        raise ValueError("no Pid in 'show info'")

    def worker_rss_kb(self) -> int:
        pid = self.worker_pid()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise ValueError(f"no VmRSS for {pid}")

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

    def haproxy_log(self) -> str:
        return self.haproxy_log_path.read_text(errors="replace")

    # agent
    def start_agent(self, *, wait: bool = True) -> subprocess.Popen[bytes]:
        assert self.agent is None or self.agent.poll() is not None, "agent already running"
        with open(self.agent_log_path, "ab") as log:
            self.agent = subprocess.Popen(
                [*certagent_argv(), "run", "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        if wait:
            proc = self.agent

            def synced() -> bool:
                if proc.poll() is not None:
                    pytest.fail(f"agent exited with {proc.returncode}:\n{self.agent_log()[-3000:]}")
                haproxy_up = self.haproxy is not None and self.haproxy.poll() is None
                return not haproxy_up or self.status()["haproxy_pid"] is not None

            wait_for(synced, START_TIMEOUT, "the agent to answer and adopt HAProxy's state")
        return self.agent

    def stop_agent(self) -> int | None:
        """SIGTERM the agent by PID (SIGKILL after a bound); return its exit code."""
        stop_process(self.agent)
        return None if self.agent is None else self.agent.returncode

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
        """Every runtime-API command the agent logged (``runtime-api> ...``), in order."""
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

    def close(self) -> None:
        try:
            self.stop_agent()
        finally:
            self.stop_haproxy()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def log_tails(self, lines: int = 60) -> str:
        agent = "\n".join(self.agent_log().splitlines()[-lines:])
        haproxy = "\n".join(self.haproxy_log().splitlines()[-lines:]) if self.haproxy else ""
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


# --- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the session on a free loopback port; yields its URL."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    with open(workdir / "redis.log", "wb") as log:
        proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(workdir),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:

        def pong() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited: {(workdir / 'redis.log').read_text()}")
            with redis.Redis.from_url(url, socket_timeout=1) as client:
                return bool(client.ping())

        wait_for(pong, START_TIMEOUT, "redis-server")
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data-key file for stores that encrypt private keys (``key_file`` setting)."""
    path = tmp_path_factory.mktemp("keys") / "certagent.keys"
    path.write_text(f"{generate_key_line('k1')}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def redis_store(redis_server: str, key_file: Path) -> RedisFixture:
    """The session's Redis, emptied for this test."""
    with redis.Redis.from_url(redis_server, socket_timeout=5) as client:
        client.flushall()
    return RedisFixture(redis_server, key_file)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    ca = make_ca("certagent integration CA")
    cafile = tmp_path_factory.mktemp("pki") / "root.pem"
    cafile.write_bytes(ca.root_pem)
    return PKI(ca, cafile)


StackFactory = Callable[..., Stack]


@pytest.fixture
def make_stack(
    tmp_path: Path, pki: PKI, key_file: Path, request: pytest.FixtureRequest
) -> Iterator[StackFactory]:
    """Build, start and (always) stop stacks: ``make_stack(store_url, capacity=100, ...)``."""
    stacks: list[Stack] = []

    def factory(
        store: str,
        *,
        capacity: int = 100,
        fallback: str = "default-cert",
        env: Mapping[str, str] | None = None,
        start: bool = True,
    ) -> Stack:
        directory = tmp_path / f"stack{len(stacks)}"
        run_dir = Path(tempfile.mkdtemp(prefix="ca-"))  # short: unix socket paths < 100 chars
        port = free_port()
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
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        # A clean environment: no CERTAGENT_* from the caller's shell leaks in.
        agent_env = {key: os.environ[key] for key in ("PATH", "PYTHONPATH") if key in os.environ}
        agent_env.update(
            {"CERTAGENT_LOG_LEVEL": "debug", "CERTAGENT_KEY_FILE": str(key_file), **(env or {})}
        )
        stack = Stack(directory, run_dir, port, pki.cafile, agent_env)
        stacks.append(stack)
        if start:
            stack.start_haproxy()
            stack.start_agent()
        return stack

    try:
        yield factory
    finally:
        report = getattr(request.node, "rep_call", None)
        with contextlib.ExitStack() as cleanup:  # closes every stack even if one fails to
            for stack in stacks:
                cleanup.callback(stack.close)
                if report is not None and report.failed:
                    print(stack.log_tails())  # shown under "Captured stdout teardown"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
