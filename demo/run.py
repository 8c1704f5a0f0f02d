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
Then, if Debian's ``pebble`` is there (``scripts/install.sh`` installs it), a
few never-seen names under ``ondemand.demo.test`` get a certificate from it on
their first connection (:mod:`demo.ondemand`; skipped, with a message, if pebble
cannot start).  It prints a summary and stops every process it started, by PID.
Exit status 1 if any handshake went wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from certagent.store.redis import DEFAULT_PREFIX, Keys
from certagent.testing import (
    PKI,
    RedisFixture,
    RedisProcess,
    Stack,
    StackError,
    free_port,
    tlsclient,
)
from demo import ondemand

REPO = Path(__file__).resolve().parent.parent
DOMAIN = "demo.test"
MARKER = ".certagent-demo"
HANDSHAKE_TIMEOUT = 10.0
START_TIMEOUT = 20.0


class DemoError(Exception):
    """Something the demo needs did not work; the message says what."""


def host(i: int) -> str:
    return f"site-{i:04d}.{DOMAIN}"


def count_records(redis: RedisProcess) -> int:
    with redis.client() as client:
        return sum(1 for _ in client.scan_iter(match=Keys(DEFAULT_PREFIX).cert("*"), count=1000))


# --- handshakes -----------------------------------------------------------------------


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    fallback: str = ""
    cli_add: str = ""
    distinct: int = 0
    seconds: float = 0.0


def handshake(ctx: ssl.SSLContext, port: int, name: str) -> float:
    """Seconds from connect() to a verified TLS handshake; then one HTTP request must get 200."""
    exchange = tlsclient.https_get(port, name, ctx, timeout=HANDSHAKE_TIMEOUT)
    if exchange.status != 200:
        raise DemoError(f"HTTP status {exchange.status}")
    return exchange.handshake_seconds


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


def check_cli_add(
    results: Results, ctx: ssl.SSLContext, port: int, layout: Layout, pki: PKI
) -> str:
    """``certagent cert add --config`` (the agent's key file) for a new host; then it is served."""
    name = f"cli-added.{DOMAIN}"
    pem = layout.workdir / f"{name}.pem"
    pem.write_bytes(b"".join(pki.chain_and_key(name)))
    env = {k: v for k, v in os.environ.items() if k != "CERTAGENT_KEY_FILE"}
    certagent = Path(sys.executable).parent / "certagent"
    argv = [str(certagent), "cert", "add", "--config", str(layout.config), "--cert", str(pem)]
    added = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    if added.returncode != 0:
        results.failures.append(f"cert add: {name}: {added.stderr.strip()}")
        return f"refused: {added.stderr.strip()[:200]}"
    deadline = time.monotonic() + 3.0
    while True:
        try:
            handshake(ctx, port, name)
        except (OSError, DemoError) as exc:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            results.failures.append(f"cert add: {name}: stored, but not served: {exc}")
            return f"stored, not served: {exc}"
        return f"{name} added with certagent cert add --config {rel(layout.config)}, then served"


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


@dataclass
class Running:
    """The processes the demo started (each stopped by PID in :meth:`stop`)."""

    redis: RedisProcess | None = None
    stack: Stack | None = None
    ca: ondemand.DemoCa | None = None  # pebble, when the on-demand part runs
    pki: PKI | None = None
    records: int = 0

    def check_alive(self) -> None:
        if self.redis is not None:
            self.redis.check_alive()
        if self.stack is not None:
            self.stack.check_alive()
        if self.ca is not None and not self.ca.pebble.running:
            raise DemoError(f"pebble exited:\n{self.ca.pebble.log_tails()}")

    def stop(self) -> list[str]:
        report: list[str] = []
        try:
            if self.stack is not None:
                report += self.stack.close()
        finally:
            if self.ca is not None:
                report += self.ca.pebble.stop()
            if self.redis is not None:
                report += self.redis.stop()
        return report


def start_stack(args: argparse.Namespace, layout: Layout, running: Running) -> Stack:
    """Redis, ``certagent init``, the certificates, HAProxy and ``certagent run``."""
    redis = running.redis = RedisProcess(layout.redis_dir, log_path=layout.logdir / "redis.log")
    redis.start(timeout=START_TIMEOUT)
    say(f"demo: redis-server on 127.0.0.1:{redis.port} (data in {layout.redis_dir})")

    acme: list[str] = []
    if args.ondemand:
        running.ca = ondemand.start_ca(layout.workdir / "pebble", say, START_TIMEOUT)
        if running.ca is not None:
            acme = ondemand.init_args(running.ca.pebble)

    tls_port = free_port()
    say(
        f"demo: certagent init {rel(layout.workdir)} --bind 127.0.0.1:{tls_port} "
        f"--store {redis.url} --capacity {args.capacity} --run-dir {layout.run_dir}"
        + "".join(f" {a}" for a in acme)
    )
    stack = running.stack = Stack.create(
        layout.workdir,
        store=redis.url,
        cafile=layout.ca,
        capacity=args.capacity,
        run_dir=layout.run_dir,
        log_dir=layout.logdir,
        port=tls_port,
        init_args=acme,
    )
    if acme:
        ondemand.allow_suffix(layout.config)
        say(f'demo: acme_allow_suffixes = "{ondemand.SUFFIX}" in {rel(layout.config)}')

    started = time.monotonic()
    pki = running.pki = PKI.create(layout.ca, "certagent demo CA")
    # the data key `certagent init` made: the agent and `certagent cert ... --config` use it too
    store = RedisFixture(redis.url, Path(stack.settings.key_file))
    store.put((pki.bundle(host(i)) for i in range(1, args.certs + 1)), concurrency=16)
    say(
        f"demo: stored {args.certs} certificates {host(1)} .. {host(args.certs)} in "
        f"{time.monotonic() - started:.1f} s (ECDSA P-256, one demo CA; every leaf reuses "
        "one key, for speed)"
    )

    say(f"demo: haproxy -W -db -f {rel(stack.haproxy_cfg)}")
    stack.start_haproxy(timeout=START_TIMEOUT)
    say(f"demo: certagent run --config {rel(layout.config)}")
    stack.start_agent(timeout=START_TIMEOUT)
    running.records = count_records(redis)
    return stack


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


def summary(
    args: argparse.Namespace,
    stack: Stack,
    running: Running,
    results: Results,
    layout: Layout,
    on_demand: ondemand.OnDemandResults | None,
) -> str:
    status = stack.status()
    ensure, loader = status["ensure"], status["loader"]
    if not isinstance(ensure, dict) or not isinstance(loader, dict):
        raise DemoError(f"unexpected status reply: {status}")
    worker_pid = stack.worker_pid()
    rss_kib = stack.worker_rss_kb()
    redis_port = running.redis.port if running.redis else 0
    verified = sum(len(v) for v in results.latencies.values())
    out = [
        "",
        "=== certagent demo summary " + "=" * 45,
        f"store            {running.records} certificates in Redis 127.0.0.1:{redis_port} "
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
        f"  {'host added by the CLI':<28}{1:>6}  {results.cli_add}",
        "",
        f"slots            {status['slots_used']} / {status['capacity']} loaded "
        f"({results.distinct} hosts asked for: least recently used slots recycled)",
        "agent ensure     " + ", ".join(f"{k} {v}" for k, v in ensure.items()),
        "agent loader     " + ", ".join(f"{k} {v}" for k, v in loader.items()),
        *ondemand.summary_lines(on_demand, status),
        f"HAProxy worker   pid {worker_pid}, VmRSS {rss_kib / 1024:.1f} MiB",
        f"failures         {len(results.failures)}",
    ]
    out += [f"  {line}" for line in results.failures[:10]]
    if results.failures:
        out.append(f"  (see {rel(layout.logdir)}/certagent.log and haproxy.log)")
    return "\n".join(out)


def try_it(args: argparse.Namespace, layout: Layout, stack: Stack, running: Running) -> str:
    name = host(42)
    certagent_bin = Path(sys.executable).parent / "certagent"
    new = f"any-new-name.{ondemand.SUFFIX}"
    on_demand = (
        f"\n  curl --cacert {rel(running.ca.root)} --resolve {new}:{stack.port}:127.0.0.1"
        f" https://{new}:{stack.port}/      # issued on this first connection"
        if running.ca is not None
        else ""
    )
    return (
        "\nTry it by hand"
        + ("" if args.keep else " (run the demo with --keep to leave it up)")
        + ":"
        f"\n  openssl s_client -connect 127.0.0.1:{stack.port} -servername {name}"
        f" -CAfile {layout.ca}"
        f"\n  curl --cacert {layout.ca} --resolve {name}:{stack.port}:127.0.0.1"
        f" https://{name}:{stack.port}/"
        f"{on_demand}"
        f"\n  {rel(certagent_bin)} status --config {rel(layout.config)}"
        f"\nLogs: {rel(layout.logdir)}/"
    )


def demo(args: argparse.Namespace, layout: Layout, running: Running) -> int:
    """Run the demo; 0 if every handshake went as expected.  With --keep, wait for Ctrl-C."""
    started = time.monotonic()
    stack = start_stack(args, layout, running)
    results = run_handshakes(args, layout, stack.port)
    on_demand = None
    if running.ca is not None:
        on_demand = ondemand.first_connections(stack.port, running.ca.root, say)
        results.failures += on_demand.failures
    assert running.pki is not None
    say("demo: certagent cert add --config ... (the CLI uses the agent's data key) ...")
    ctx = ssl.create_default_context(cafile=str(layout.ca))
    results.cli_add = check_cli_add(results, ctx, stack.port, layout, running.pki)
    running.check_alive()
    say(summary(args, stack, running, results, layout, on_demand))
    say(f"elapsed          {time.monotonic() - started:.1f} s")
    say(try_it(args, layout, stack, running))
    rc = 1 if results.failures else 0
    if args.keep:
        say("\nEverything stays up until Ctrl-C.")
        try:
            while True:
                running.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            say("\ndemo: stopping")
    return rc


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
    p.add_argument(
        "--no-ondemand",
        dest="ondemand",
        action="store_false",
        help="skip the on-demand part (names issued by a loopback pebble on first connection)",
    )
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
    running = Running()
    signals = Signals()
    rc = 1
    try:
        signals.install()
        prepare_workdir(workdir)
        logdir = workdir / "logs"
        logdir.mkdir()
        rc = demo(args, Layout(workdir, run_dir, redis_dir, logdir), running)
    except KeyboardInterrupt:
        say(f"\ndemo: {signal.Signals(signals.received or signal.SIGINT).name}: stopping")
        rc = 128 + (signals.received or signal.SIGINT)
    except (DemoError, StackError, subprocess.CalledProcessError, OSError) as exc:
        say(f"demo: error: {exc}")
        rc = 1
    finally:
        signals.ignore()  # no second Ctrl-C may cut the clean-up short
        stopped = running.stop()
        if stopped:
            say("demo: stopped " + ", ".join(stopped))
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(redis_dir, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
