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

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certagent import config
from certagent.store.url import parse_store_url
from certagent.testing import tlsclient
from certagent.testing.processes import (
    SLOT_PREFIX,
    START_TIMEOUT,
    STOP_TIMEOUT,
    HAProxyProcess,
    StackError,
    certagent_argv,
    free_port,
    spawn,
    stop_process,
    tail,
    unix_request,
    wait_for,
)

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
    address: str = "127.0.0.1"  # where fe_sni listens (a loopback address)
    haproxy_binary: str | None = None  # default: :data:`HAPROXY`
    #: the ``certagent`` command this node runs (default: this venv's); an earlier
    #: release's (:mod:`certagent.testing.builds`) for a mixed-version fleet
    agent_cmd: list[str] | None = None
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
            self.haproxy_cfg,
            self.settings.haproxy_socket,
            self.port,
            logs / "haproxy.log",
            self.address,
            self.haproxy_binary,
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
        init_args: Sequence[str] = (),
        address: str = "127.0.0.1",
        haproxy_binary: str | None = None,
        agent_cmd: Sequence[str] | None = None,
    ) -> Stack:
        """``certagent init`` into ``directory`` (loopback, a free port); nothing started.

        ``run_dir`` (unix sockets) defaults to a fresh ``/tmp/ca-*`` that
        :meth:`close` removes; ``haproxy_binary`` (default :data:`HAPROXY`) is the HAProxy
        it runs; ``agent_cmd`` the ``certagent`` command that makes the directory and runs
        the agent and the CLI (default: this venv's).  The agent gets a clean environment: PATH,
        PYTHONPATH, ``CERTAGENT_KEY_FILE`` (if ``key_file``) and ``env``.  With a
        Redis store, ``key_file`` is also the configuration's data key (``init
        --data-key``), so ``certagent cert ... --config`` encrypts with the agent's key.
        """
        owns_run_dir = run_dir is None
        if (
            key_file is not None
            and parse_store_url(store).kind == "redis"
            and "--data-key" not in init_args
        ):
            init_args = [*init_args, "--data-key", str(key_file)]
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix="ca-"))
        port = port or free_port()
        try:
            subprocess.run(
                [
                    *(agent_cmd or certagent_argv()), "init", str(directory),
                    "--bind", f"{address}:{port}",
                    "--store", store,
                    "--capacity", str(capacity),
                    "--fallback", fallback,
                    "--run-dir", str(run_dir),
                    *init_args,
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
        stack = cls(
            directory,
            run_dir,
            port,
            cafile,
            agent_env,
            log_dir,
            address,
            haproxy_binary,
            list(agent_cmd) if agent_cmd is not None else None,
        )
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

    def marked_hosts(self) -> dict[str, str]:
        """Hosts fe_sni's table marks loaded (``gpt0`` > 0), each with its slot's name."""
        table = self.settings.usage_table
        out = {}
        for line in self.admin(f"show table {table} data.gpt0 gt 0").splitlines():
            match = re.match(r"0x[0-9a-f]+: key=(\S+) .*\bgpt0=(\d+)", line)
            if match:
                out[match.group(1)] = f"{self.settings.slot_prefix}{int(match.group(2)):05d}.pem"
        return out

    def consistency_problems(self) -> list[str]:
        """Where HAProxy's certificates, crt-list and marks disagree with the agent's status."""
        problems = []
        slots = self.slot_certs()
        lines = self.crt_list_lines()
        status = self.status(slots=True)
        if len(slots) != status["slots_used"]:
            problems.append(f"{len(slots)} slot certificates but slots_used={status['slots_used']}")
        if len(set(slots)) != len(slots):
            problems.append(f"duplicate certificate names: {sorted(slots)}")
        if len(set(lines)) != len(lines):
            problems.append(f"duplicate crt-list lines: {sorted(lines)}")
        if not set(lines) <= set(slots):
            problems.append(f"crt-list lines without a certificate: {set(lines) - set(slots)}")
        marked = self.marked_hosts()
        stray = {h: s for h, s in marked.items() if s not in lines}
        if stray:
            problems.append(f"hosts marked loaded in no crt-list slot: {stray}")
        agent_hosts = {h for slot in status["slots"] for h in slot["hosts"]}
        if set(marked) != agent_hosts:
            problems.append(f"HAProxy marks {sorted(marked)}, agent has {sorted(agent_hosts)}")
        return problems

    # agent
    @property
    def argv(self) -> list[str]:
        """The ``certagent`` command of this node (:attr:`agent_cmd`, or this venv's)."""
        return self.agent_cmd or certagent_argv()

    def start_agent(
        self, *, wait: bool = True, timeout: float = START_TIMEOUT
    ) -> subprocess.Popen[bytes]:
        """``certagent run``; with ``wait``, until it answers and has adopted HAProxy's state."""
        if self.agent is not None and self.agent.poll() is None:
            raise StackError("the agent is already running")
        self.agent = spawn(
            [*self.argv, "run", "--config", str(self.config_path)],
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
            status = self.status()
            adopted = not self.haproxy.running or status["haproxy_pid"] is not None
            # Until its name filter is ready the agent looks up at most 50 names a second
            # (a storm right after start would get the fallback): wait for it too, unless
            # the store is down (then it cannot be built).
            filtered = status["name_filter"]["ready"] or not status["store_up"]
            return adopted and filtered

        wait_for(
            synced, timeout, "the agent to answer, adopt HAProxy's state and have its name filter"
        )

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
            [*self.argv, command, "--config", str(self.config_path), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def command(self, *words: str) -> subprocess.CompletedProcess[str]:
        """``certagent <words...> --config <toml>``, e.g. ``("cert", "ls", "--json")``."""
        return subprocess.run(
            [*self.argv, *words, "--config", str(self.config_path)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def agent_request(self, line: bytes, timeout: float = 10.0) -> bytes:
        return unix_request(self.settings.agent_socket, line, timeout=timeout, line=True)

    def status(self, slots: bool = False) -> dict[str, Any]:
        """The agent's ``status`` (with every slot if ``slots``)."""
        result: dict[str, Any] = json.loads(
            self.agent_request(b"status slots\n" if slots else b"status\n")
        )
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
        return tlsclient.handshake(
            self.port, host, self.cafile, timeout=timeout, address=self.address
        )

    def hello(self, sni: bytes | None, timeout: float = 5.0) -> bytes | None:
        return tlsclient.raw_hello(self.port, sni, timeout=timeout, address=self.address)

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

    def wait_first(self, timeout: float = 5.0, count: int = 1) -> None:
        """Wait for the first ``count`` verified handshakes (the first one loads the host)."""
        deadline = time.monotonic() + timeout
        while self.ok < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.ok >= count, (self.ok, self.failures)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT)
        assert not self._thread.is_alive(), "prober thread did not stop"
