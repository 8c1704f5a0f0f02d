"""certagent end-to-end demo on loopback: Redis + HAProxy + certagent, real TLS handshakes.

Run from the repository root (after ``bash scripts/install.sh``)::

    .venv/bin/python -m demo            # or: bash scripts/demo.sh
    .venv/bin/python -m demo --keep     # leave everything up until Ctrl-C

It starts a private ``redis-server`` on a free loopback port (never 6379),
writes a setup with ``certagent init`` into ``demo-run/``, stores ``--certs``
certificates for ``site-NNNN.demo.test`` (ECDSA P-256, one demo CA), starts
``haproxy -W -db`` and ``certagent run``, then makes verified TLS handshakes:
cold (host never seen), warm (second time), a concurrent burst, hosts whose
slot was recycled, and one unknown host (served the default certificate).
It prints a summary and stops every process it started, by PID.  Exit status
1 if any handshake went wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.pem import parse_bundle
from agent.store import open_store
from agent.store.redis import DEFAULT_PREFIX, Keys

REPO = Path(__file__).resolve().parent.parent
DOMAIN = "demo.test"
MARKER = ".certagent-demo"
HANDSHAKE_TIMEOUT = 10.0
START_TIMEOUT = 20.0


class DemoError(Exception):
    """Something the demo needs did not work; the message says what."""


def host(i: int) -> str:
    return f"site-{i:04d}.{DOMAIN}"


# --- certificates ---------------------------------------------------------------------


@dataclass(frozen=True)
class DemoPKI:
    ca_pem: bytes
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    leaf_key: ec.EllipticCurvePrivateKey
    leaf_key_pem: bytes


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_pki(now: dt.datetime) -> DemoPKI:
    """One self-signed demo CA and one leaf key that every demo certificate shares."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "certagent demo CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_key_pem = leaf_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return DemoPKI(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key=ca_key,
        ca_cert=ca_cert,
        leaf_key=leaf_key,
        leaf_key_pem=leaf_key_pem,
    )


def issue(pki: DemoPKI, name: str, now: dt.datetime) -> bytes:
    """PEM of a leaf certificate for ``name``, signed by the demo CA, with the shared key."""
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(pki.ca_cert.subject)
        .public_key(pki.leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(pki.ca_key.public_key()), False
        )
        .sign(pki.ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


async def fill_store(url: str, pki: DemoPKI, count: int) -> None:
    now = dt.datetime.now(dt.UTC)
    store = open_store(url)
    try:
        for i in range(1, count + 1):
            await store.put(parse_bundle(issue(pki, host(i), now), pki.leaf_key_pem))
    finally:
        await store.close()


# --- processes ------------------------------------------------------------------------


@dataclass
class Started:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Processes:
    """Every process the demo started; :meth:`stop_all` ends them by PID, newest first."""

    logdir: Path
    started: list[Started] = field(default_factory=list)
    extra_pids: dict[str, int] = field(default_factory=dict)  # e.g. HAProxy's worker

    def start(self, name: str, argv: Sequence[str]) -> Started:
        log = self.logdir / f"{name}.log"
        with open(log, "wb") as out:
            # Own session: a Ctrl-C in the terminal reaches only the demo, which then
            # stops its children in order.
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = Started(name, proc, log)
        self.started.append(started)
        return started

    def check_alive(self) -> None:
        for s in self.started:
            if s.proc.poll() is not None:
                raise DemoError(
                    f"{s.name} (pid {s.proc.pid}) exited with status {s.proc.returncode}:\n"
                    + tail(s.log)
                )

    def stop_all(self) -> list[str]:
        report = []
        for s in reversed(self.started):
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
                try:
                    s.proc.wait(10)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait(5)
            report.append(f"{s.name} pid {s.proc.pid}")
        for name, pid in self.extra_pids.items():
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
            report.append(f"{name} pid {pid}")
        return report


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "    (no log)"
    return "\n".join("    " + line for line in text[-lines:])


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in (80, 443, 6379):
            return port


def wait_for(what: str, probe: Callable[[], bool], procs: Processes) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        procs.check_alive()
        if probe():
            return
        time.sleep(0.05)
    raise DemoError(f"{what} did not come up within {START_TIMEOUT:.0f} s")


def unix_request(path: str, request: bytes, *, until_close: bool) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(request)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            if not until_close and chunk.endswith(b"\n"):
                break
    return b"".join(chunks)


def haproxy_info(admin_socket: str) -> dict[str, str]:
    reply = unix_request(admin_socket, b"show info\n", until_close=True).decode()
    info = {}
    for line in reply.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    return info


def agent_status(agent_socket: str) -> dict[str, object]:
    line = unix_request(agent_socket, b"status\n", until_close=False)
    status: dict[str, object] = json.loads(line)
    return status


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise DemoError(f"no VmRSS for pid {pid}")


def redis_up(port: int) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.exceptions.ConnectionError:
        return False
    finally:
        client.close()


def count_records(port: int) -> int:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        return sum(1 for _ in client.scan_iter(match=Keys(DEFAULT_PREFIX).cert("*"), count=1000))
    finally:
        client.close()


# --- handshakes -----------------------------------------------------------------------


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    fallback: str = ""
    distinct: int = 0
    seconds: float = 0.0


def handshake(ctx: ssl.SSLContext, port: int, name: str) -> float:
    """Seconds from connect() to a verified TLS handshake; then one HTTP request must get 200."""
    start = time.perf_counter()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        elapsed = time.perf_counter() - start
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while len(reply) < 12:
            chunk = tls.recv(4096)
            if not chunk:
                break
            reply += chunk
    if not reply.startswith(b"HTTP/1.1 200"):
        raise DemoError(f"HTTP reply {reply[:40]!r}")
    return elapsed


def run_phase(
    results: Results,
    phase: str,
    ctx: ssl.SSLContext,
    port: int,
    names: Sequence[str],
    workers: int = 1,
) -> None:
    times = results.latencies.setdefault(phase, [])

    def one(name: str) -> None:
        try:
            times.append(handshake(ctx, port, name))
        except (OSError, DemoError) as exc:  # ssl.SSLError and timeouts are OSErrors
            results.failures.append(f"{phase}: {name}: {exc}")

    if workers == 1:
        for name in names:
            one(name)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, names))


def check_fallback(results: Results, ctx: ssl.SSLContext, port: int, name: str) -> str:
    """A host absent from the store gets the default certificate, which must not verify."""
    try:
        handshake(ctx, port, name)
    except ssl.SSLCertVerificationError as exc:
        return f"default certificate served ({exc.verify_message})"
    except (OSError, DemoError) as exc:
        results.failures.append(f"fallback: {name}: unexpected {exc}")
        return f"unexpected: {exc}"
    results.failures.append(f"fallback: {name}: handshake verified, expected the default cert")
    return "unexpected: verified"


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


# --- the demo -------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    workdir: Path
    run_dir: Path
    redis_dir: Path
    logdir: Path

    @property
    def config(self) -> Path:
        return self.workdir / "certagent.toml"

    @property
    def ca(self) -> Path:
        return self.workdir / "demo-ca.pem"

    @property
    def admin_socket(self) -> str:
        return str(self.run_dir / "admin.sock")

    @property
    def agent_socket(self) -> str:
        return str(self.run_dir / "agent.sock")


def prepare_workdir(workdir: Path) -> None:
    if workdir.exists() and any(workdir.iterdir()) and not (workdir / MARKER).exists():
        raise DemoError(f"{workdir} exists and was not made by the demo; pick another --workdir")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("made by demo/run.py; deleted and rewritten on every run\n")


def rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


@dataclass
class Signals:
    """SIGTERM and SIGINT both raise KeyboardInterrupt (which libraries let through)."""

    received: int = 0

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)

    @staticmethod
    def ignore() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)


def say(msg: str) -> None:
    print(msg, flush=True)


@dataclass(frozen=True)
class Stack:
    """What :func:`start_stack` brought up."""

    redis_port: int
    tls_port: int
    worker_pid: int
    records: int


def start_stack(args: argparse.Namespace, layout: Layout, procs: Processes) -> Stack:
    """Redis, ``certagent init``, the certificates, HAProxy and ``certagent run``."""
    redis_port = free_port()
    tls_port = free_port()
    while tls_port == redis_port:
        tls_port = free_port()
    store_url = f"redis://127.0.0.1:{redis_port}/0"

    say(f"demo: redis-server on 127.0.0.1:{redis_port} (data in {layout.redis_dir})")
    procs.start(
        "redis",
        [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(redis_port),
            "--dir", str(layout.redis_dir),
            "--save", "",
            "--appendonly", "no",
        ],
    )  # fmt: skip
    wait_for("redis-server", lambda: redis_up(redis_port), procs)

    say(
        f"demo: certagent init {rel(layout.workdir)} --bind 127.0.0.1:{tls_port} "
        f"--store {store_url} --capacity {args.capacity} --run-dir {layout.run_dir}"
    )
    subprocess.run(
        [
            sys.executable, "-m", "agent", "init", str(layout.workdir),
            "--bind", f"127.0.0.1:{tls_port}",
            "--store", store_url,
            "--capacity", str(args.capacity),
            "--run-dir", str(layout.run_dir),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip

    started = time.monotonic()
    pki = make_pki(dt.datetime.now(dt.UTC))
    layout.ca.write_bytes(pki.ca_pem)
    asyncio.run(fill_store(store_url, pki, args.certs))
    say(
        f"demo: stored {args.certs} certificates {host(1)} .. {host(args.certs)} in "
        f"{time.monotonic() - started:.1f} s (ECDSA P-256, one demo CA; every leaf reuses "
        "one key, for speed)"
    )

    cfg = layout.workdir / "haproxy.cfg"
    say(f"demo: haproxy -W -db -f {rel(cfg)}")
    procs.start("haproxy", ["haproxy", "-W", "-db", "-f", str(cfg)])
    wait_for("HAProxy", lambda: _probe(lambda: haproxy_info(layout.admin_socket)), procs)
    worker_pid = int(haproxy_info(layout.admin_socket)["Pid"])
    procs.extra_pids["haproxy worker"] = worker_pid

    say(f"demo: certagent run --config {rel(layout.config)}")
    procs.start("certagent", [sys.executable, "-m", "agent", "run", "--config", str(layout.config)])
    wait_for(
        "certagent (synchronised with HAProxy)",
        lambda: _probe(lambda: agent_status(layout.agent_socket)["haproxy_pid"] is not None),
        procs,
    )
    return Stack(redis_port, tls_port, worker_pid, count_records(redis_port))


PHASE_LABELS = {
    "cold": "cold (never seen)",
    "warm": "warm (second time)",
    "burst": "cold, concurrent",
    "revisit": "cold again (slot recycled)",
}


def run_handshakes(args: argparse.Namespace, layout: Layout, port: int) -> Results:
    """Cold then warm one at a time, a concurrent cold burst, recycled hosts, one unknown host."""
    ctx = ssl.create_default_context(cafile=str(layout.ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    results = Results()
    seq = [host(i) for i in range(1, args.hosts + 1)]
    burst = [host(i) for i in range(args.hosts + 1, args.hosts + args.hosts // 2 + 1)]
    revisit = seq[: min(50, len(seq))]
    started = time.monotonic()
    say(f"demo: handshakes: {len(seq)} hosts cold then warm, one at a time ...")
    for name in seq:
        run_phase(results, "cold", ctx, port, [name])
        run_phase(results, "warm", ctx, port, [name])
    say(f"demo: handshakes: {len(burst)} new hosts, {args.workers} at a time ...")
    run_phase(results, "burst", ctx, port, burst, workers=args.workers)
    say(f"demo: handshakes: {len(revisit)} of the first hosts again (slots recycled since) ...")
    run_phase(results, "revisit", ctx, port, revisit)
    results.fallback = check_fallback(results, ctx, port, f"not-in-store.{DOMAIN}")
    results.distinct = len(seq) + len(burst)
    results.seconds = time.monotonic() - started
    return results


def summary(args: argparse.Namespace, stack: Stack, results: Results, layout: Layout) -> str:
    status = agent_status(layout.agent_socket)
    ensure, loader = status["ensure"], status["loader"]
    if not isinstance(ensure, dict) or not isinstance(loader, dict):
        raise DemoError(f"unexpected status reply: {status}")
    rss_kib = vm_rss_kib(stack.worker_pid)
    verified = sum(len(v) for v in results.latencies.values())
    out = [
        "",
        "=== certagent demo summary " + "=" * 45,
        f"store            {stack.records} certificates in Redis 127.0.0.1:{stack.redis_port} "
        "(one demo CA, ECDSA P-256, one shared leaf key)",
        f"handshakes       {verified} verified (Python ssl, demo CA, check_hostname, then"
        f" HTTP 200) to {results.distinct} hosts in {results.seconds:.1f} s",
        "",
        f"  {'latency (ms)':<28}{'count':>6}{'p50':>8}{'p90':>8}{'p99':>8}",
    ]
    for phase, label in PHASE_LABELS.items():
        ms = [v * 1000 for v in results.latencies.get(phase, [])]
        if phase == "burst":
            label = f"cold, {args.workers} at once"
        if ms:
            out.append(
                f"  {label:<28}{len(ms):>6}{percentile(ms, 50):>8.2f}"
                f"{percentile(ms, 90):>8.2f}{percentile(ms, 99):>8.2f}"
            )
    out += [
        f"  {'host not in the store':<28}{1:>6}  {results.fallback}",
        "",
        f"slots            {status['slots_used']} / {status['capacity']} loaded "
        f"({results.distinct} hosts asked for: least recently used slots recycled)",
        "agent ensure     " + ", ".join(f"{k} {v}" for k, v in ensure.items()),
        "agent loader     " + ", ".join(f"{k} {v}" for k, v in loader.items()),
        f"HAProxy worker   pid {stack.worker_pid}, VmRSS {rss_kib / 1024:.1f} MiB",
        f"failures         {len(results.failures)}",
    ]
    out += [f"  {line}" for line in results.failures[:10]]
    if results.failures:
        out.append(f"  (see {rel(layout.logdir)}/certagent.log and haproxy.log)")
    return "\n".join(out)


def try_it(args: argparse.Namespace, layout: Layout, stack: Stack) -> str:
    name = host(42)
    certagent_bin = Path(sys.executable).parent / "certagent"
    return (
        "\nTry it by hand"
        + ("" if args.keep else " (run the demo with --keep to leave it up)")
        + ":"
        f"\n  openssl s_client -connect 127.0.0.1:{stack.tls_port} -servername {name}"
        f" -CAfile {layout.ca}"
        f"\n  curl --cacert {layout.ca} --resolve {name}:{stack.tls_port}:127.0.0.1"
        f" https://{name}:{stack.tls_port}/"
        f"\n  {rel(certagent_bin)} status --config {rel(layout.config)}"
        f"\nLogs: {rel(layout.logdir)}/"
    )


def demo(args: argparse.Namespace, layout: Layout, procs: Processes) -> int:
    """Run the demo; 0 if every handshake went as expected.  With --keep, wait for Ctrl-C."""
    started = time.monotonic()
    stack = start_stack(args, layout, procs)
    results = run_handshakes(args, layout, stack.tls_port)
    procs.check_alive()
    say(summary(args, stack, results, layout))
    say(f"elapsed          {time.monotonic() - started:.1f} s")
    say(try_it(args, layout, stack))
    rc = 1 if results.failures else 0
    if args.keep:
        say("\nEverything stays up until Ctrl-C.")
        try:
            while True:
                procs.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            say("\ndemo: stopping")
    return rc


def _probe(fn: Callable[[], object]) -> bool:
    try:
        return bool(fn())
    except (OSError, ValueError, KeyError):
        return False


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", action="store_true", help="after the summary, run until Ctrl-C")
    p.add_argument("--certs", type=int, default=1000, help="certificates to store (1000)")
    p.add_argument("--capacity", type=int, default=200, help="certagent capacity (200)")
    p.add_argument(
        "--hosts", type=int, default=300, help="hosts asked cold then warm, one at a time (300)"
    )
    p.add_argument("--workers", type=int, default=16, help="concurrent clients in the burst (16)")
    p.add_argument("--workdir", type=Path, default=REPO / "demo-run", help="(./demo-run)")
    args = p.parse_args(argv)
    if not 1 <= args.certs <= 9999:
        p.error("--certs must be 1..9999")
    if args.hosts < 1 or args.hosts + args.hosts // 2 > args.certs:
        p.error("--hosts H needs 1 <= H and H + H/2 <= --certs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir.resolve()
    run_dir = Path(tempfile.mkdtemp(prefix="certagent-demo-", dir="/tmp"))
    redis_dir = Path(tempfile.mkdtemp(prefix="certagent-demo-redis-", dir="/tmp"))
    procs = Processes(workdir / "logs")
    signals = Signals()
    rc = 1
    try:
        signals.install()
        prepare_workdir(workdir)
        procs.logdir.mkdir()
        rc = demo(args, Layout(workdir, run_dir, redis_dir, procs.logdir), procs)
    except KeyboardInterrupt:
        say(f"\ndemo: {signal.Signals(signals.received or signal.SIGINT).name}: stopping")
        rc = 128 + (signals.received or signal.SIGINT)
    except (DemoError, subprocess.CalledProcessError, OSError) as exc:
        say(f"demo: error: {exc}")
        rc = 1
    finally:
        signals.ignore()  # no second Ctrl-C may cut the clean-up short
        if procs.started:
            say("demo: stopped " + ", ".join(procs.stop_all()))
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(redis_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
