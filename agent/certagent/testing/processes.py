"""Real Redis and HAProxy processes on loopback, and the small helpers around them.

Rules every caller gets for free: everything listens on loopback, on ports the
kernel says are free (never 80, 443 or 6379); every wait is a bounded loop;
every process started here is stopped by its PID -- SIGTERM, then SIGKILL after
a bound -- and HAProxy's worker is killed by PID only if its command line still
names our configuration; children run in their own session, so a Ctrl-C in the
terminal reaches only the Python process, which then stops them in order.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import redis

from certagent.runtime.build import HAProxyBuild, parse_build

#: The HAProxy every test, the demo and the bench start: ``$CERTAGENT_TEST_HAPROXY``
#: (scripts/test.sh's version matrix sets it to Debian's 3.0, 3.2 or 3.4 build), else PATH's.
HAPROXY = (
    os.environ.get("CERTAGENT_TEST_HAPROXY") or shutil.which("haproxy") or "/usr/sbin/haproxy"
)
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
SLOT_PREFIX = "/certagent/slot-"
STOP_TIMEOUT = 10.0  # the agent drains for at most 5 s
START_TIMEOUT = 10.0
_FORBIDDEN_PORTS = (80, 443, 6379)
_CLK_TCK = os.sysconf("SC_CLK_TCK")

T = TypeVar("T")


class StackError(Exception):
    """A process did not start, died, or did not answer in time; the message says which."""


@functools.cache
def haproxy_build() -> HAProxyBuild:
    """What :data:`HAPROXY` is: its version, OpenSSL and Lua (from ``haproxy -vv``)."""
    try:
        out = subprocess.run([HAPROXY, "-vv"], capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"{HAPROXY} -vv failed: {exc}") from exc
    return parse_build(out.stdout.decode("utf-8", "replace"))

# --- small process and polling helpers --------------------------------------------------


#: Starts tried on fresh ports when a chosen free port was taken before the bind.
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A loopback port nobody listens on right now, for TCP and UDP (never 80/443/6379).

    Chosen at random below the kernel's ephemeral range (``ip_local_port_range``), where
    outgoing connections take their ports: a port the kernel hands out for ``bind(0)`` can
    be taken by any process's next connection before the caller binds it (seen once: an
    HAProxy frontend failing with "Address already in use" while other work ran).  A port
    handed out once is not handed out again by this process.
    """
    low, high = _PORT_RANGE
    for _ in range(200):
        port = _random.randrange(low, high)
        if port in _FORBIDDEN_PORTS or port in _handed_out:
            continue
        if not _bindable(port):
            continue
        _handed_out.add(port)
        return port
    raise StackError(f"no free loopback port in {low}-{high - 1}")


def _bindable(port: int) -> bool:
    """Whether ``port`` is free on loopback for TCP and UDP (HTTP/3 listens on both)."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _port_range() -> tuple[int, int]:
    """Ports below the ephemeral range: [10000, its start), or 10000-32767 if unreadable.

    Under pytest-xdist each worker (and what it starts) takes its own slice of that range,
    so that two workers never pick the same port between its check and its bind.
    """
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    return worker_slice(10000, max(first, 20000), os.environ)


def worker_slice(low: int, high: int, env: Mapping[str, str]) -> tuple[int, int]:
    """[low, high) cut in equal slices, one per pytest-xdist worker (all of it outside xdist)."""
    worker, count = env.get("PYTEST_XDIST_WORKER", ""), env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return low, high
    index, total = int(worker[2:]), int(count)
    if total < 1 or index >= total:
        return low, high
    size = (high - low) // total
    return low + index * size, low + (index + 1) * size


_PORT_RANGE = _port_range()
_random = random.SystemRandom()
_handed_out: set[int] = set()


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
    return [str(script)] if script.exists() else [sys.executable, "-m", "certagent"]


def cli_start_seconds(env: dict[str, str] | None = None) -> float:
    """How long ``certagent run`` takes to start and exit on this machine now.

    It imports what an agent imports, reads a config file that does not exist and
    exits 1.  Tests that bound how fast an agent starts or refuses to start measure
    this first and allow it on top, so a loaded machine's slow start is not a failure.
    """
    started = time.monotonic()
    done = subprocess.run(
        [*certagent_argv(), "run", "--config", "/nonexistent/certagent.toml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and "not found" in done.stderr, done.stderr
    return took


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

    def start(self, timeout: float = START_TIMEOUT, *, port: int | None = None) -> RedisProcess:
        """Start it on ``port`` (default: a free one); an empty Redis, no persistence.

        A free port chosen here can be taken before redis-server binds it (another
        connection's ephemeral port): then it starts again on another one.
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start(timeout, port)
            except StackError as exc:
                if port is not None or attempt == PORT_ATTEMPTS:
                    raise
                if "Address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, timeout: float, port: int | None) -> RedisProcess:
        if self.proc is not None and self.proc.poll() is None:
            raise StackError(f"redis-server pid {self.proc.pid} is already running")
        if not Path(REDIS_SERVER).exists():
            raise StackError(f"redis-server is not installed ({REDIS_SERVER})")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
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


# --- HAProxy -----------------------------------------------------------------------------


class HAProxyProcess:
    """``haproxy -W -db -f CFG`` (master-worker); CFG must have an admin ``stats socket``."""

    def __init__(
        self,
        cfg: Path,
        admin_socket: str,
        port: int,
        log_path: Path,
        address: str = "127.0.0.1",
        binary: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.binary = binary or HAPROXY  # which HAProxy to run (default: :data:`HAPROXY`)
        self.admin_socket = admin_socket
        self.port = port
        self.address = address
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
        marked = os.environ.get("CERTAGENT_TEST_NO_HAPROXY")  # set by tests/conftest.py
        if marked:
            raise StackError(f"{marked} is marked no_haproxy (tests/conftest.py) but starts it")
        self.proc = spawn([self.binary, "-W", "-db", "-f", str(self.cfg)], self.log_path)
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
            with socket.create_connection((self.address, self.port), timeout=1):
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

