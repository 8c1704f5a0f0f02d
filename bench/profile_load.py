"""What each runtime-API command costs HAProxy 2.6, and what makes a certificate load cheaper.

``python -m bench.profile_load [--quick] [--k-large N] [--no-perf]``: prints one JSON
object on stdout, progress on stderr.  Standalone: it starts its own HAProxy (through
:mod:`certagent.testing`) on a free loopback port with a minimal ``mode tcp`` config,
talks to it over one prompt-mode admin connection, and stops it by PID at the end,
also on failure, Ctrl-C or SIGTERM.  It never touches the agent.

Method.  HAProxy's worker CPU is read from ``/proc/<worker>/task/*/schedstat`` (first
field: ns on CPU, all threads) just before and just after a batch of N identical
operations, pipelined the way the agent does it (one write per chunk of <= 128
commands / 64 KB, then read every reply, every reply checked); CPU / N is one sample.
Every measurement is repeated ``reps`` times, round-robin over the cases of a question
so that noise hits all cases alike; the JSON keeps every sample, the report gives the
median and the min-max.  Costs that cannot be sent alone (``commit`` needs a ``set``)
are differences of two batches measured in the same repetition.

Questions:

* q1: per-command cost for one load into a recycled slot (and for a new slot), and the
  map / stick-table commands, at a small and a large pool (K slots, K map entries, K
  table entries);
* q2: ``set ssl cert`` (and set + commit + abort) by key encoding, chain length and
  block order;
* q3: HAProxy CPU of the first full handshake on a freshly committed certificate vs
  the second and third (ECDSA P-256, RSA-2048; TLS 1.3, no resumption);
* q4: ``perf record`` of the worker during a stream of loads, if ``perf`` works.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import cryptography
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench._runinfo import git_revision
from bench._runinfo import machine as bench_machine
from certagent.testing import PKI, HAProxyProcess, free_port, rss_kb, stop_process
from certagent.testing.certs import (
    CA,
    Key,
    KeyType,
    cert_pem,
    issue,
    issue_cert,
    key_pem,
    make_ca,
    make_ca_path,
    shared_key,
)

REPO = Path(__file__).resolve().parent.parent
SLOT = "/certagent/slot-"
ISSUERS_HOST = "q2-issuers.test"
PROMPT = b"\n> "
_PLUS = re.compile(r"\A(?:\+ )+")
TABLE = "fe"  # the stick table lives in the frontend of the same name
CHUNK_BYTES = 64 * 1024
CHUNK_CMDS = 128


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class OutOfTime(RuntimeError):
    """The run's time budget is spent."""


@dataclass(frozen=True)
class Params:
    k_small: int
    k_large: int
    reps: int
    n_cert: int  # operations per batch for certificate commands
    n_cheap: int  # operations per batch for map / table commands
    n_variant: int  # operations per batch in q2
    hs_hosts: int  # q3: certificates (hosts) per round
    hs_rounds: int
    perf_seconds: float
    budget_s: float  # hard bound for the whole run
    k_large_fallback: int


FULL = Params(
    k_small=1000,
    k_large=100_000,
    reps=7,
    n_cert=100,
    n_cheap=1000,
    n_variant=60,
    hs_hosts=200,
    hs_rounds=7,
    perf_seconds=5.0,
    budget_s=570.0,
    k_large_fallback=30_000,
)
QUICK = Params(
    k_small=200,
    k_large=2000,
    reps=5,
    n_cert=20,
    n_cheap=200,
    n_variant=15,
    hs_hosts=30,
    hs_rounds=5,
    perf_seconds=1.5,
    budget_s=58.0,
    k_large_fallback=1000,
)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def check(self, what: str, need: float = 0.0) -> None:
        if self.left() < need:
            raise OutOfTime(f"time budget spent before {what} ({self.elapsed():.0f}s elapsed)")


# --- the runtime-API connection -----------------------------------------------------------


def cmd(*args: str, payload: bytes | None = None) -> bytes:
    line = " ".join(args).encode()
    if payload is None:
        return line + b"\n"
    assert b"\n\n" not in payload and payload.endswith(b"\n")
    return line + b" <<\n" + payload + b"\n"


class CLI:
    """One prompt-mode connection; replies end with ``"\\n> "``, payload lines echo ``"+ "``."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = bytearray()
        self.run([b"prompt\n"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, cmds: Sequence[bytes]) -> None:
        self.sock.sendall(b"".join(cmds))

    def read(self, count: int) -> list[str]:
        out: list[str] = []
        start = 0
        while len(out) < count:
            idx = self.buf.find(PROMPT, start)
            if idx >= 0:
                raw = bytes(self.buf[:idx])
                del self.buf[: idx + len(PROMPT)]
                start = 0
                out.append(_PLUS.sub("", raw.decode("utf-8", "replace")).strip("\n"))
                continue
            start = max(0, len(self.buf) - len(PROMPT))
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError("HAProxy closed the CLI connection (payload over bufsize?)")
            self.buf += chunk
        return out

    def run(self, cmds: Sequence[bytes]) -> list[str]:
        """Pipelined: chunks of <= CHUNK_CMDS commands / CHUNK_BYTES, each written at once."""
        replies: list[str] = []
        i = 0
        while i < len(cmds):
            j, size = i, 0
            while (
                j < len(cmds)
                and j - i < CHUNK_CMDS
                and (j == i or size + len(cmds[j]) <= CHUNK_BYTES)
            ):
                size += len(cmds[j])
                j += 1
            self.send(cmds[i:j])
            replies += self.read(j - i)
            i = j
        return replies


Check = Callable[[int, str], bool]


def check_all(replies: Sequence[str], checks: Sequence[Check], what: str) -> None:
    """``checks[i % len(checks)]`` must accept reply i (commands repeat in a pattern)."""
    for i, reply in enumerate(replies):
        if not checks[i % len(checks)](i, reply):
            raise RuntimeError(f"{what}: unexpected reply #{i}: {reply[:300]!r}")


def ok_set(_: int, r: str) -> bool:
    return re.fullmatch(r"Transaction (created|updated) for certificate \S+!", r) is not None


def ok_commit(_: int, r: str) -> bool:
    return r.startswith("Committing ") and r.endswith("Success!")


def ok_abort_none(_: int, r: str) -> bool:
    return r == "No ongoing transaction!"


def ok_abort_txn(_: int, r: str) -> bool:
    return r.startswith("Transaction aborted for certificate")


def ok_new(_: int, r: str) -> bool:
    return r.startswith("New empty certificate store")


def ok_add_list(_: int, r: str) -> bool:
    return r.startswith("Inserting certificate") and r.endswith("Success!")


def ok_empty(_: int, r: str) -> bool:
    return r == ""


def ok_table_entry(_: int, r: str) -> bool:
    return r.startswith("# table:") and " key=" in r


def ok_any(_: int, r: str) -> bool:
    return bool(r)


# --- HAProxy worker CPU -----------------------------------------------------------------


def cpu_ns(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total


class Meter:
    def __init__(self, cli: CLI, pid: int) -> None:
        self.cli = cli
        self.pid = pid

    def timed(self, cmds: Sequence[bytes], checks: Sequence[Check], n_ops: int, what: str) -> float:
        """Worker CPU in µs per operation for ``cmds`` (``n_ops`` operations), replies checked."""
        time.sleep(0.003)  # let the worker go idle so its counters are up to date
        c0 = cpu_ns(self.pid)
        replies = self.cli.run(cmds)
        time.sleep(0.003)
        c1 = cpu_ns(self.pid)
        check_all(replies, checks, what)
        return (c1 - c0) / 1000.0 / n_ops

    def idle_us_per_s(self, seconds: float = 1.0) -> float:
        c0 = cpu_ns(self.pid)
        time.sleep(seconds)
        return (cpu_ns(self.pid) - c0) / 1000.0 / seconds


def summary(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "median_us": round(statistics.median(samples), 2),
        "min_us": round(min(samples), 2),
        "max_us": round(max(samples), 2),
        "reps": len(samples),
        "samples_us": [round(s, 2) for s in samples],
    }


# --- certificates and payloads ------------------------------------------------------------

EC_PARAMS_P256 = (
    b"-----BEGIN EC PARAMETERS-----\n"
    + base64.b64encode(bytes.fromhex("06082a8648ce3d030107"))
    + b"\n-----END EC PARAMETERS-----\n"
)


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_len(len(body)) + body


def ec_pkcs8_without_public_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """PKCS#8 P-256 key whose inner ECPrivateKey has neither parameters nor public key.

    Some tools write this form; OpenSSL must then derive the public point (a scalar
    multiplication) when it loads the key.
    """
    d = key.private_numbers().private_value.to_bytes(32, "big")
    inner = _tlv(0x30, _tlv(0x02, b"\x01") + _tlv(0x04, d))
    algid = _tlv(
        0x30,
        _tlv(0x06, bytes.fromhex("2a8648ce3d0201")) + _tlv(0x06, bytes.fromhex("2a8648ce3d030107")),
    )
    der = _tlv(0x30, _tlv(0x02, b"\x00") + algid + _tlv(0x04, inner))
    b64 = base64.encodebytes(der).replace(b"\n", b"")
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    pem = b"-----BEGIN PRIVATE KEY-----\n" + b"\n".join(lines) + b"\n-----END PRIVATE KEY-----\n"
    loaded = serialization.load_pem_private_key(pem, None)
    assert loaded.private_numbers() == key.private_numbers()  # type: ignore[union-attr]
    return pem


class Certs:
    """Leaves for the pool (EC P-256, one shared key, one name each) and the q2 variants."""

    def __init__(self, workdir: Path) -> None:
        self.pki = PKI.create(workdir / "ca.pem", name="profile_load CA")
        self.ca: CA = self.pki.ca
        self.ec_key: Key = shared_key("ec")

    def pem(self, host: str, key_type: KeyType = "ec") -> bytes:
        chain, key = issue(self.ca, host, key=shared_key(key_type))
        return chain + key

    def pem_and_der(self, host: str, key_type: KeyType = "ec") -> tuple[bytes, bytes]:
        key = shared_key(key_type)
        cert = issue_cert(self.ca, host, key=key)
        der = cert.public_bytes(serialization.Encoding.DER)
        return cert_pem(cert) + self.ca.chain_pem + key_pem(key), der


def q2_variants(certs: Certs) -> dict[str, dict[str, Any]]:
    """Payload variants of one load: key encoding, chain length, block order.

    ``ec-leafonly-issuers`` is a leaf of the pool CA without its intermediate: HAProxy
    attaches the intermediate from ``issuers-chain-path`` (checked with a verified handshake).
    """
    ca1 = make_ca("q2 CA")
    ca2 = make_ca_path(2, "q2 deep CA")
    ca0 = make_ca("q2 flat CA", intermediate=False)
    eck = shared_key("ec")
    rsak = shared_key("rsa")
    assert isinstance(eck, ec.EllipticCurvePrivateKey)
    ec_leaf = cert_pem(issue_cert(ca1, "q2-ec.test", key=eck))
    rsa_leaf = cert_pem(issue_cert(ca1, "q2-rsa.test", key=rsak))
    ec_leaf2 = cert_pem(issue_cert(ca2, "q2-ec2.test", key=eck))
    ec_leaf0 = cert_pem(issue_cert(ca0, "q2-ec0.test", key=eck))
    ec_leaf_pool = cert_pem(issue_cert(certs.ca, ISSUERS_HOST, key=eck))
    inter1 = ca1.chain_pem
    inter2 = ca2.chain_pem
    ec_p8 = key_pem(eck, "pkcs8")
    ec_sec1 = key_pem(eck, "traditional")
    ec_p8_nopub = ec_pkcs8_without_public_key(eck)
    rsa_p8 = key_pem(rsak, "pkcs8")
    rsa_p1 = key_pem(rsak, "traditional")
    assert ec_p8.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert ec_sec1.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert rsa_p1.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    c1 = ec_leaf + inter1
    r1 = rsa_leaf + inter1
    v: dict[str, tuple[str, bytes]] = {
        # name: (what, payload)
        "ec-pkcs8-last": (
            "ECDSA P-256, PKCS#8 'PRIVATE KEY', leaf+1 inter, key last (agent today)",
            c1 + ec_p8,
        ),
        "ec-pkcs8-first": ("ECDSA P-256, PKCS#8, leaf+1 inter, key first", ec_p8 + c1),
        "ec-sec1-last": ("ECDSA P-256, SEC1 'EC PRIVATE KEY', key last", c1 + ec_sec1),
        "ec-sec1-first": ("ECDSA P-256, SEC1, key first", ec_sec1 + c1),
        "ec-params-sec1-last": (
            "ECDSA P-256, 'EC PARAMETERS' + SEC1, key last",
            c1 + EC_PARAMS_P256 + ec_sec1,
        ),
        "ec-params-sec1-first": (
            "ECDSA P-256, 'EC PARAMETERS' + SEC1, key first",
            EC_PARAMS_P256 + ec_sec1 + c1,
        ),
        "ec-pkcs8-nopub-last": (
            "ECDSA P-256, PKCS#8 without public key, key last",
            c1 + ec_p8_nopub,
        ),
        "rsa-pkcs8-last": ("RSA-2048, PKCS#8 'PRIVATE KEY', key last", r1 + rsa_p8),
        "rsa-pkcs8-first": ("RSA-2048, PKCS#8, key first", rsa_p8 + r1),
        "rsa-pkcs1-last": ("RSA-2048, PKCS#1 'RSA PRIVATE KEY', key last", r1 + rsa_p1),
        "rsa-pkcs1-first": ("RSA-2048, PKCS#1, key first", rsa_p1 + r1),
        "ec-chain0-last": ("ECDSA P-256, PKCS#8, leaf only, key last", ec_leaf0 + ec_p8),
        "ec-chain2-last": (
            "ECDSA P-256, PKCS#8, leaf+2 inters, key last",
            ec_leaf2 + inter2 + ec_p8,
        ),
        "ec-chain2-first": (
            "ECDSA P-256, PKCS#8, leaf+2 inters, key first",
            ec_p8 + ec_leaf2 + inter2,
        ),
        "ec-leafonly-issuers": (
            "ECDSA P-256, PKCS#8, leaf only, intermediate from issuers-chain-path",
            ec_leaf_pool + ec_p8,
        ),
    }
    return {
        name: {"what": what, "payload": payload, "bytes": len(payload)}
        for name, (what, payload) in v.items()
    }


# --- HAProxy -------------------------------------------------------------------------------


def write_config(
    workdir: Path, port: int, table_size: int, default_pem: bytes, intermediate_pem: bytes
) -> tuple[Path, str, str, str]:
    sock = str(workdir / "admin.sock")
    crtlist = str(workdir / "pool.crtlist")
    mapfile = str(workdir / "hosts.map")
    (workdir / "dense.map").write_text("")
    (workdir / "default.pem").write_bytes(default_pem)
    Path(crtlist).write_text("")
    Path(mapfile).write_text("")
    (workdir / "issuers").mkdir()
    (workdir / "issuers" / "pool-intermediate.pem").write_bytes(intermediate_pem)
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(
        f"""# bench/profile_load.py: a minimal HAProxy for runtime-API cost measurements
global
    stats socket {sock} mode 600 level admin
    stats timeout 1d
    ssl-default-bind-options ssl-min-ver TLSv1.2
    # a leaf sent without its chain gets the intermediate from here (q2 ec-leafonly-issuers)
    issuers-chain-path {workdir}/issuers

defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend {TABLE}
    bind 127.0.0.1:{port} ssl crt {workdir}/default.pem crt-list {crtlist}
    stick-table type string len 253 size {table_size} expire 1h store gpt0,conn_cnt
    # references the map, so 'add map' / 'del map' work; no server: closed after the handshake
    use_backend be if {{ ssl_fc_sni,lower,map({mapfile}) -m found }}
    use_backend be if {{ ssl_fc_sni,lower,map({workdir}/dense.map) -m found }}
    default_backend be

backend be
    mode tcp
"""
    )
    return cfg, sock, crtlist, mapfile


def cert_info_cn(der: bytes) -> str:
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def slot(i: int) -> str:
    return f"{SLOT}{i:06d}"


def host(i: int) -> str:
    return f"h{i:06d}.pool.test"


def dense_key(i: int) -> str:
    return f"d{i:06d}.dense.test"


class Bench:
    def __init__(self, params: Params, workdir: Path, budget: Budget, perf: bool) -> None:
        self.p = params
        self.workdir = workdir
        self.budget = budget
        self.want_perf = perf
        self.certs = Certs(workdir)
        self.port = free_port()
        self.table_size = 2 * params.k_large
        default_pem = self.certs.pem("default.profile.test")
        self.cfg, self.sock, self.crtlist, self.mapfile = write_config(
            workdir, self.port, self.table_size, default_pem, self.certs.ca.chain_pem
        )
        self.haproxy = HAProxyProcess(self.cfg, self.sock, self.port, workdir / "haproxy.log")
        self.pid = 0
        self.cli: CLI | None = None
        self.meter: Meter | None = None
        self.k = 0  # listed slots (each with a map entry and a table entry)
        self.densemap = str(workdir / "dense.map")
        self.dense_k = 0
        self.extra_slots: list[str] = []  # listed slots added by the 'add ssl crt-list' case
        self.uniq = 0
        self.result: dict[str, Any] = {}
        self.perf_proc: subprocess.Popen[bytes] | None = None
        self.tls_versions: dict[str, int] = {}

    # lifecycle
    def start(self) -> None:
        pid = self.haproxy.start()
        assert pid is not None
        self.pid = pid
        self.cli = CLI(self.sock)
        self.meter = Meter(self.cli, pid)
        threads = len(os.listdir(f"/proc/{pid}/task"))
        say(
            f"HAProxy worker pid {pid} ({threads} threads), port {self.port}, "
            f"table size {self.table_size}"
        )

    def stop(self) -> list[str]:
        stopped = []
        if self.perf_proc is not None and stop_process(self.perf_proc, timeout=10):
            stopped.append(f"perf pid {self.perf_proc.pid}")
        if self.cli is not None:
            self.cli.close()
        stopped += self.haproxy.stop()
        return stopped

    def alive(self) -> None:
        self.haproxy.check_alive()
        if not Path(f"/proc/{self.pid}").exists():
            raise RuntimeError(f"HAProxy worker {self.pid} is gone:\n{self.haproxy.log()[-2000:]}")

    def name(self, prefix: str) -> str:
        self.uniq += 1
        return f"{prefix}{self.uniq:06d}"

    @property
    def c(self) -> CLI:
        assert self.cli is not None
        return self.cli

    @property
    def m(self) -> Meter:
        assert self.meter is not None
        return self.meter

    # filling the pool
    def grow(self, target: int, deadline_left: float = 0.0) -> dict[str, Any]:
        """Add listed slots (new+set+commit+add crt-list) + map + table entries up to ``target``.

        Stops early, keeping what it has, if less than ``deadline_left`` s of budget remain.
        """
        start_k, t0, c0 = self.k, time.monotonic(), cpu_ns(self.pid)
        batch = 32
        next_report = time.monotonic() + 15

        def build(lo: int, hi: int) -> list[bytes]:
            out: list[bytes] = []
            for i in range(lo, hi):
                s, h = slot(i), host(i)
                out += [
                    cmd("new", "ssl", "cert", s),
                    cmd("set", "ssl", "cert", s, payload=self.certs.pem(h)),
                    cmd("commit", "ssl", "cert", s),
                    cmd("add", "ssl", "crt-list", self.crtlist, s),
                    cmd("add", "map", self.mapfile, h, s),
                    cmd("set", "table", TABLE, "key", h, "data.gpt0", "1"),
                ]
            return out

        checks = [ok_new, ok_set, ok_commit, ok_add_list, ok_empty, ok_empty]
        lo = self.k
        pending = build(lo, min(target, lo + batch))
        stopped_early = False
        while pending:
            n = len(pending) // 6
            self.c.send(pending)
            nxt_lo = lo + n
            nxt = build(nxt_lo, min(target, nxt_lo + batch)) if nxt_lo < target else []
            replies = self.c.read(len(pending))
            check_all(replies, checks, f"filling slots {lo}..{lo + n}")
            self.k = lo + n
            lo, pending = nxt_lo, nxt
            if time.monotonic() > next_report:
                next_report = time.monotonic() + 15
                rate = (self.k - start_k) / (time.monotonic() - t0)
                say(f"  pool {self.k:,} slots ({rate:.0f}/s), RSS {rss_kb(self.pid) / 1024:.0f} MB")
            if pending and self.budget.left() < deadline_left:
                stopped_early = True
                say(f"  stopping the fill at {self.k:,} slots to stay within the time budget")
                break
        if pending and stopped_early:
            pass  # the built-but-unsent batch is dropped
        seconds = time.monotonic() - t0
        added = self.k - start_k
        return {
            "from_k": start_k,
            "to_k": self.k,
            "seconds": round(seconds, 2),
            "wall_ms_per_slot": round(seconds * 1000 / max(added, 1), 3),
            "haproxy_cpu_ms_per_slot": round((cpu_ns(self.pid) - c0) / 1e6 / max(added, 1), 3),
            "rss_mb": round(rss_kb(self.pid) / 1024, 1),
            "stopped_early": stopped_early,
        }

    def fill_dense_map(self, k: int) -> None:
        """Grow the control map to ``k`` entries in one burst (pipelined 'add map')."""
        cmds = [cmd("add", "map", self.densemap, dense_key(i), "x") for i in range(self.dense_k, k)]
        check_all(self.c.run(cmds), [ok_empty], "dense map fill")
        self.dense_k = max(self.dense_k, k)

    # q1 ----------------------------------------------------------------------------------
    def q1(self, label: str) -> dict[str, Any]:
        p, k = self.p, self.k
        n, nc = p.n_cert, p.n_cheap
        rng = random.Random(k)
        samples: dict[str, list[float]] = {}
        # set/del map walk the whole map (~35/19 ms per command at 100k entries): fewer ops
        nm = nc if k <= 10_000 else max(20, nc * 3000 // k)
        self.fill_dense_map(k)
        say(
            f"q1 at K={k:,}: {p.reps} reps, N={n} (certificate commands), N={nc} (table), "
            f"N={nm} (maps)"
        )

        def rec(name: str, value: float) -> None:
            samples.setdefault(name, []).append(value)

        for rep in range(p.reps):
            self.budget.check(f"q1 {label} rep {rep}", 5)
            self.alive()
            # CLI floor: a trivial command
            rec(
                "show version (CLI floor)",
                self.m.timed([cmd("show", "version")] * nc, [ok_any], nc, "show version"),
            )

            # set ssl cert into a recycled (listed) slot, repeated on one slot; abort afterwards
            s = slot(rng.randrange(k))
            pems = [self.certs.pem(self.name("q1s-") + ".test") for _ in range(n)]
            rec(
                "set ssl cert (recycled slot)",
                self.m.timed(
                    [cmd("set", "ssl", "cert", s, payload=x) for x in pems], [ok_set], n, "set"
                ),
            )
            check_all(
                self.c.run([cmd("abort", "ssl", "cert", s)]), [ok_abort_txn], "abort after set"
            )

            # set + commit into N recycled slots
            slots = [slot(i) for i in rng.sample(range(k), n)]
            cmds: list[bytes] = []
            for s in slots:
                cmds += [
                    cmd(
                        "set", "ssl", "cert", s, payload=self.certs.pem(self.name("q1c-") + ".test")
                    ),
                    cmd("commit", "ssl", "cert", s),
                ]
            rec(
                "set+commit (recycled slot)",
                self.m.timed(cmds, [ok_set, ok_commit], n, "set+commit"),
            )

            # set + commit + abort (the agent's sequence)
            slots = [slot(i) for i in rng.sample(range(k), n)]
            cmds = []
            for s in slots:
                cmds += [
                    cmd(
                        "set", "ssl", "cert", s, payload=self.certs.pem(self.name("q1a-") + ".test")
                    ),
                    cmd("commit", "ssl", "cert", s),
                    cmd("abort", "ssl", "cert", s),
                ]
            rec(
                "set+commit+abort (recycled slot)",
                self.m.timed(cmds, [ok_set, ok_commit, ok_abort_none], n, "set+commit+abort"),
            )

            # abort with no transaction open (what the trailing abort does after a good commit)
            s = slot(rng.randrange(k))
            rec(
                "abort ssl cert (no transaction)",
                self.m.timed([cmd("abort", "ssl", "cert", s)] * n, [ok_abort_none], n, "abort"),
            )

            # a new slot: new / set+commit (unlisted store) / add ssl crt-list
            news = [self.name("/certagent/new-") for _ in range(n)]
            rec(
                "new ssl cert",
                self.m.timed([cmd("new", "ssl", "cert", x) for x in news], [ok_new], n, "new"),
            )
            cmds = []
            for x in news:
                cmds += [
                    cmd(
                        "set", "ssl", "cert", x, payload=self.certs.pem(self.name("q1n-") + ".test")
                    ),
                    cmd("commit", "ssl", "cert", x),
                ]
            rec(
                "set+commit (new, unlisted store)",
                self.m.timed(cmds, [ok_set, ok_commit], n, "set+commit new"),
            )
            rec(
                "add ssl crt-list (new slot)",
                self.m.timed(
                    [cmd("add", "ssl", "crt-list", self.crtlist, x) for x in news],
                    [ok_add_list],
                    n,
                    "add crt-list",
                ),
            )
            self.extra_slots += news

            # maps: add new keys, set existing keys, del the new keys (map back to K entries).
            # 'pool' is the map filled along with the certificates (entries scattered among
            # ~20 KB of certificate data each, as in the agent); 'dense' is a second map
            # filled with K entries in one burst (contiguous allocations), as a control.
            for which, mapfile, keyfn in (
                ("pool map", self.mapfile, host),
                ("dense map", self.densemap, dense_key),
            ):
                keys = [self.name("q1m-") + ".test" for _ in range(nm)]
                rec(
                    f"add map (new key), {which}",
                    self.m.timed(
                        [cmd("add", "map", mapfile, x, "/certagent/x") for x in keys],
                        [ok_empty],
                        nm,
                        "add map",
                    ),
                )
                existing = [keyfn(i) for i in rng.sample(range(k), min(nm, k))]
                rec(
                    f"set map (existing key), {which}",
                    self.m.timed(
                        [cmd("set", "map", mapfile, x, slot(0)) for x in existing],
                        [ok_empty],
                        len(existing),
                        "set map",
                    ),
                )
                rec(
                    f"del map (key), {which}",
                    self.m.timed(
                        [cmd("del", "map", mapfile, x) for x in keys], [ok_empty], nm, "del map"
                    ),
                )

            # stick table
            existing = [host(i) for i in rng.sample(range(k), min(nc, k))]
            rec(
                "set table key data.gpt0 (existing key)",
                self.m.timed(
                    [
                        cmd("set", "table", TABLE, "key", x, "data.gpt0", str(rep + 2))
                        for x in existing
                    ],
                    [ok_empty],
                    len(existing),
                    "set table",
                ),
            )
            tkeys = [self.name("q1t-") + ".test" for _ in range(nc)]
            rec(
                "set table key data.gpt0 (new key)",
                self.m.timed(
                    [cmd("set", "table", TABLE, "key", x, "data.gpt0", "1") for x in tkeys],
                    [ok_empty],
                    nc,
                    "set table new",
                ),
            )
            rec(
                "show table key (existing key)",
                self.m.timed(
                    [cmd("show", "table", TABLE, "key", x) for x in existing],
                    [ok_table_entry],
                    len(existing),
                    "show table key",
                ),
            )
            rec(
                "clear table key",
                self.m.timed(
                    [cmd("clear", "table", TABLE, "key", x) for x in tkeys],
                    [ok_empty],
                    nc,
                    "clear table",
                ),
            )
            rec(
                "show table (full dump, per command)",
                self.m.timed([cmd("show", "table", TABLE)], [ok_any], 1, "show table"),
            )

        # derived, paired within each repetition
        def diff(a: str, b: str) -> list[float]:
            return [x - y for x, y in zip(samples[a], samples[b], strict=True)]

        derived = {
            "commit ssl cert (recycled slot) = set+commit - set": diff(
                "set+commit (recycled slot)", "set ssl cert (recycled slot)"
            ),
            "abort after a successful commit = set+commit+abort - set+commit": diff(
                "set+commit+abort (recycled slot)", "set+commit (recycled slot)"
            ),
            "commit (new, unlisted store) = set+commit(new) - set": diff(
                "set+commit (new, unlisted store)", "set ssl cert (recycled slot)"
            ),
        }
        new_slot = [
            a + b + c
            for a, b, c in zip(
                samples["new ssl cert"],
                samples["set+commit (new, unlisted store)"],
                samples["add ssl crt-list (new slot)"],
                strict=True,
            )
        ]
        derived["full new-slot load = new + set+commit + add crt-list"] = new_slot
        for which in ("pool map", "dense map"):
            derived[f"remap a host = del map + add map, {which}"] = [
                a + b
                for a, b in zip(
                    samples[f"del map (key), {which}"],
                    samples[f"add map (new key), {which}"],
                    strict=True,
                )
            ]
        return {
            "k_slots": k,
            "k_slots_at_end": self.k + len(self.extra_slots),
            "map_entries": k,
            "table_entries": k,
            "rss_mb": round(rss_kb(self.pid) / 1024, 1),
            "n_cert": n,
            "n_cheap": nc,
            "n_map": nm,
            "dense_map_entries": self.dense_k,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "measured": {name: summary(v) for name, v in samples.items()},
            "derived": {name: summary(v) for name, v in derived.items()},
        }

    # q2 ----------------------------------------------------------------------------------
    def q2(self) -> dict[str, Any]:
        p = self.p
        variants = q2_variants(self.certs)
        s = slot(0)
        n = p.n_variant
        say(f"q2: {len(variants)} payload variants, {p.reps} reps, N={n}, into listed slot {s}")
        # every variant must load and commit
        for name, v in variants.items():
            r = self.c.run(
                [
                    cmd("set", "ssl", "cert", s, payload=v["payload"]),
                    cmd("commit", "ssl", "cert", s),
                    cmd("abort", "ssl", "cert", s),
                ]
            )
            if not (ok_set(0, r[0]) and ok_commit(0, r[1])):
                raise RuntimeError(f"q2 variant {name} does not load: {r}")
            if name == "ec-leafonly-issuers":
                verified = self.verified_handshake(ISSUERS_HOST)
        set_s: dict[str, list[float]] = {x: [] for x in variants}
        load_s: dict[str, list[float]] = {x: [] for x in variants}
        for rep in range(p.reps):
            self.budget.check(f"q2 rep {rep}", 5)
            self.alive()
            order = list(variants)
            random.Random(rep).shuffle(order)
            for name in order:
                pl = variants[name]["payload"]
                set_s[name].append(
                    self.m.timed(
                        [cmd("set", "ssl", "cert", s, payload=pl)] * n,
                        [ok_set],
                        n,
                        f"q2 set {name}",
                    )
                )
                check_all(self.c.run([cmd("abort", "ssl", "cert", s)]), [ok_abort_txn], "q2 abort")
                one = [
                    cmd("set", "ssl", "cert", s, payload=pl),
                    cmd("commit", "ssl", "cert", s),
                    cmd("abort", "ssl", "cert", s),
                ]
                load_s[name].append(
                    self.m.timed(one * n, [ok_set, ok_commit, ok_abort_none], n, f"q2 load {name}")
                )
        base = "ec-pkcs8-last"
        out: dict[str, Any] = {}
        for name, v in variants.items():
            ratio = [a / b for a, b in zip(set_s[name], set_s[base], strict=True)]
            ratio_l = [a / b for a, b in zip(load_s[name], load_s[base], strict=True)]
            out[name] = {
                "what": v["what"],
                "payload_bytes": v["bytes"],
                "set": summary(set_s[name]),
                "set+commit+abort": summary(load_s[name]),
                "set_ratio_to_agent_today": {
                    "median": round(statistics.median(ratio), 3),
                    "min": round(min(ratio), 3),
                    "max": round(max(ratio), 3),
                },
                "load_ratio_to_agent_today": {
                    "median": round(statistics.median(ratio_l), 3),
                    "min": round(min(ratio_l), 3),
                    "max": round(max(ratio_l), 3),
                },
            }
        return {
            "slot": s,
            "n": n,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
            "issuers_chain_path_verified_handshake": verified,
            "variants": out,
        }

    # q3 ----------------------------------------------------------------------------------
    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the served leaf is compared byte for byte instead
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def load_fresh(self, slots: Sequence[str], kt: KeyType, prefix: str) -> list[tuple[str, bytes]]:
        """Commit a fresh certificate (new name) into each slot; return (host, leaf DER) pairs."""
        hosts: list[tuple[str, bytes]] = []
        cmds: list[bytes] = []
        for s in slots:
            h = self.name(prefix) + ".test"
            pem, der = self.certs.pem_and_der(h, kt)
            hosts.append((h, der))
            cmds += [
                cmd("set", "ssl", "cert", s, payload=pem),
                cmd("commit", "ssl", "cert", s),
                cmd("abort", "ssl", "cert", s),
            ]
        check_all(self.c.run(cmds), [ok_set, ok_commit, ok_abort_none], "fresh loads")
        return hosts

    def handshakes(self, hosts: Sequence[tuple[str, bytes]]) -> tuple[float, float]:
        """One full handshake per host, in turn; (worker CPU µs, client wall ms) per handshake."""
        ctx = self.client_context()
        time.sleep(0.003)
        c0, t0 = cpu_ns(self.pid), time.perf_counter()
        for h, der in hosts:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock,
                ctx.wrap_socket(sock, server_hostname=h) as tls,
            ):
                got = tls.getpeercert(binary_form=True)
                v = str(tls.version())
                self.tls_versions[v] = self.tls_versions.get(v, 0) + 1
                with contextlib.suppress(OSError):
                    tls.recv(1)  # session tickets, then HAProxy closes (no server)
            if got != der:
                raise RuntimeError(f"{h} was not served its own certificate")
        t1 = time.perf_counter()
        time.sleep(0.003)
        return (cpu_ns(self.pid) - c0) / 1000.0 / len(hosts), (t1 - t0) * 1000 / len(hosts)

    def verified_handshake(self, host: str) -> dict[str, Any]:
        """A handshake verified against the pool root only (so the intermediate must be sent)."""
        ctx = ssl.create_default_context(cafile=str(self.certs.pki.cafile))
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock,
            ctx.wrap_socket(sock, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            return {
                "host": host,
                "verified": True,  # wrap_socket raises if the chain does not verify
                "served_leaf_matches": der is not None and host in str(cert_info_cn(der)),
                "tls": tls.version(),
            }

    def q3(self) -> dict[str, Any]:
        p = self.p
        nh = p.hs_hosts
        slots = [slot(i) for i in range(1, 1 + nh)]
        say(
            f"q3: {p.hs_rounds} rounds x {nh} fresh certificates, handshakes #1 #2 #3 each, "
            "ECDSA and RSA-2048"
        )
        per: dict[str, dict[str, list[float]]] = {}
        wall: dict[str, list[float]] = {}
        for rnd in range(p.hs_rounds):
            for kt in ("ec", "rsa"):
                self.budget.check(f"q3 round {rnd}", 5)
                self.alive()
                label = {"ec": "ECDSA P-256", "rsa": "RSA-2048"}[kt]
                hosts = self.load_fresh(slots, kt, f"hs-{kt}-")
                d = per.setdefault(label, {"1st": [], "2nd": [], "3rd": []})
                w = wall.setdefault(label, [])
                for which in ("1st", "2nd", "3rd"):
                    cpu, ms = self.handshakes(hosts)
                    d[which].append(cpu)
                    w.append(ms)
        out: dict[str, Any] = {"hosts_per_round": nh, "rounds": p.hs_rounds}
        for label, d in per.items():
            r12 = [a / b for a, b in zip(d["1st"], d["2nd"], strict=True)]
            r32 = [a / b for a, b in zip(d["3rd"], d["2nd"], strict=True)]
            extra = [a - b for a, b in zip(d["1st"], d["2nd"], strict=True)]
            out[label] = {
                "first_handshake": summary(d["1st"]),
                "second_handshake": summary(d["2nd"]),
                "third_handshake": summary(d["3rd"]),
                "first_minus_second": summary(extra),
                "ratio_first_to_second": {
                    "median": round(statistics.median(r12), 3),
                    "min": round(min(r12), 3),
                    "max": round(max(r12), 3),
                },
                "ratio_third_to_second": {
                    "median": round(statistics.median(r32), 3),
                    "min": round(min(r32), 3),
                    "max": round(max(r32), 3),
                },
                "client_wall_ms_per_handshake_median": round(statistics.median(wall[label]), 2),
            }
        return out

    # q4 ----------------------------------------------------------------------------------
    def q4(self) -> dict[str, Any]:
        perf = shutil.which("perf")
        if not self.want_perf:
            return {"skipped": "--no-perf"}
        if perf is None:
            return {"skipped": "perf is not installed"}
        probe = subprocess.run(
            [perf, "stat", "-e", "task-clock", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if probe.returncode != 0:
            return {"skipped": f"perf stat failed: {probe.stderr[-300:]}"}
        hw = subprocess.run(
            [perf, "stat", "-e", "instructions", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        hw_ok = "<not supported>" not in hw.stderr and hw.returncode == 0
        callsites = haproxy_callsites()
        variants = q2_variants(self.certs)
        s = slot(0)
        streams = {
            "set ssl cert (EC P-256 PKCS#8, leaf+inter, key last)": (
                variants["ec-pkcs8-last"]["payload"],
                False,
            ),
            "set+commit+abort (EC P-256 PKCS#8, leaf+inter, key last)": (
                variants["ec-pkcs8-last"]["payload"],
                True,
            ),
            "set+commit+abort (RSA-2048 PKCS#8, leaf+inter, key last)": (
                variants["rsa-pkcs8-last"]["payload"],
                True,
            ),
        }
        out: dict[str, Any] = {
            "perf": subprocess.run(
                [perf, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip(),
            "event": "cpu-clock at 999 Hz"
            + (
                "" if hw_ok else " (software timer; hardware counters are not supported in this VM)"
            ),
            "call_graph": "dwarf (16 KB of stack per sample, unwound with .eh_frame)",
            "symbols": "haproxy, libcrypto and libssl are stripped: only exported symbols resolve. "
            "'self' folds time spent in unexported functions into the nearest exported caller "
            "(marked '~'); 'entry' is the library function HAProxy called (its call site, from "
            "objdump of /usr/sbin/haproxy), so every sample is attributed to one "
            "HAProxy->library call.",
            "profiles": {},
        }
        for i, (title, (payload, full)) in enumerate(streams.items()):
            self.budget.check(f"q4 profile {i}", self.p.perf_seconds + 30)
            self.alive()
            say(f"q4: perf record {self.p.perf_seconds:.1f}s during a stream of {title}")
            one = [cmd("set", "ssl", "cert", s, payload=payload)]
            checks: list[Check] = [ok_set]
            if full:
                one += [cmd("commit", "ssl", "cert", s), cmd("abort", "ssl", "cert", s)]
                checks = [ok_set, ok_commit, ok_abort_none]
            ops = 0
            data = self.workdir / f"perf-{i}.data"
            with self.perf_record(perf, data):
                c0, t0 = cpu_ns(self.pid), time.monotonic()
                while time.monotonic() - t0 < self.p.perf_seconds:
                    check_all(self.c.run(one * 20), checks, "q4 stream")
                    if not full:
                        check_all(
                            self.c.run([cmd("abort", "ssl", "cert", s)]), [ok_abort_txn], "q4 abort"
                        )
                    ops += 20
                cpu_ms = (cpu_ns(self.pid) - c0) / 1e6
            prof = perf_summary(perf, data, callsites, ops)
            prof["ops"] = ops
            prof["haproxy_cpu_us_per_op_while_profiled"] = round(cpu_ms * 1000 / max(ops, 1), 1)
            out["profiles"][title] = prof
            with contextlib.suppress(OSError):
                data.unlink()
        # the first handshake on a fresh RSA certificate vs the second (what is set up lazily?)
        n = min(self.p.k_small - 1, 600 if self.p is FULL else 150)
        self.budget.check("q4 handshake profiles", 40)
        say(f"q4: perf record during {n} first and {n} second RSA-2048 handshakes")
        hosts = self.load_fresh([slot(i) for i in range(1, 1 + n)], "rsa", "q4-rsa-")
        hs: dict[str, Any] = {}
        for which in ("first", "second"):
            data = self.workdir / f"perf-hs-{which}.data"
            with self.perf_record(perf, data):
                cpu, _ms = self.handshakes(hosts)
            prof = perf_summary(perf, data, callsites, n)
            prof["haproxy_cpu_us_per_handshake_while_profiled"] = round(cpu, 1)
            hs[which] = prof
            with contextlib.suppress(OSError):
                data.unlink()
        out["profiles"]["RSA-2048 handshakes, first on a fresh certificate"] = hs["first"]
        out["profiles"]["RSA-2048 handshakes, second"] = hs["second"]
        out["rsa_first_minus_second_us_per_handshake"] = profile_diff(hs["first"], hs["second"])
        for prof in out["profiles"].values():
            prof.pop("_incl_counts", None)
            prof.pop("_ops", None)
        return out

    @contextlib.contextmanager
    def perf_record(self, perf: str, data: Path) -> Any:
        """``perf record -p <worker>`` for the block's duration; stopped by SIGINT to its PID."""
        log = open(self.workdir / (data.name + ".log"), "wb")  # noqa: SIM115
        self.perf_proc = subprocess.Popen(
            [
                perf,
                "record",
                "-q",
                "-F",
                "999",
                "--call-graph",
                "dwarf,16384",
                "-p",
                str(self.pid),
                "-o",
                str(data),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        try:
            time.sleep(0.5)  # attach
            if self.perf_proc.poll() is not None:
                raise RuntimeError(
                    "perf record exited: "
                    + (self.workdir / (data.name + ".log")).read_text()[-500:]
                )
            yield
        finally:
            proc, self.perf_proc = self.perf_proc, None
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    stop_process(proc, timeout=5)
            log.close()

    # the run -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        p = self.p
        self.start()
        idle = self.m.idle_us_per_s(1.0)
        say(f"idle worker CPU: {idle:.0f} µs/s")
        self.result["idle_worker_cpu_us_per_s"] = round(idle, 1)
        fills = []
        say(f"filling the pool to K={p.k_small:,}")
        fills.append(self.grow(p.k_small))
        self.result["q1"] = {f"K={self.k}": self.q1("small")}
        self.result["q2"] = self.q2()
        self.result["q3"] = self.q3()
        self.result["q3"]["tls_versions"] = dict(self.tls_versions)
        try:
            self.result["q4"] = self.q4()
        except OutOfTime as exc:
            self.result["q4"] = {"skipped": str(exc)}
        # grow to the large pool, as far as the budget allows
        per_slot_s = fills[0]["wall_ms_per_slot"] / 1000
        # q1 at the large K (set map walks the map: ~2 ms per command at 100k) + teardown
        reserve = 75.0 if p.k_large > 10_000 else 12.0
        projected = (p.k_large - self.k) * per_slot_s * 1.15
        target = p.k_large
        if projected > self.budget.left() - reserve:
            target = p.k_large_fallback
            say(
                f"projected fill to {p.k_large:,} ({projected:.0f}s) does not fit; using {target:,}"
            )
        say(
            f"filling the pool to K={target:,} "
            f"(≈{(target - self.k) * per_slot_s:.0f}s at the measured rate)"
        )
        fills.append(self.grow(target, deadline_left=reserve))
        self.result["fill"] = fills
        self.result["k_large_target"] = p.k_large
        self.result["k_large_used"] = self.k
        self.result["q1"][f"K={self.k}"] = self.q1("large")
        return self.result


# --- perf ------------------------------------------------------------------------------------

_CALL = re.compile(r"\s*([0-9a-f]+):\s+call\S*\s+[0-9a-f]+\s+<([^>]+)>")
_INSN = re.compile(r"\s*([0-9a-f]+):\s")


def haproxy_callsites(binary: str = "/usr/sbin/haproxy") -> dict[int, str]:
    """Return address -> called function, for every call to a named (PLT or exported) function."""
    try:
        text = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", binary],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    sites: dict[int, str] = {}
    pending: str | None = None
    for line in text.splitlines():
        m = _INSN.match(line)
        if m is None:
            continue
        if pending is not None:
            sites[int(m.group(1), 16)] = pending
            pending = None
        c = _CALL.match(line)
        if c is not None:
            target = c.group(2)
            if target.endswith("@plt"):
                pending = target[:-4]
            elif "@@" in target and "+" not in target:
                pending = target.split("@@")[0]
    return sites


_LIBC_INLINE = re.compile(r"_*(pthread|GI_|libc|int_|unlink_chunk|malloc|free|cfree|mem|str)")
_MALLOC = re.compile(r"_*(GI___libc_)?(malloc|calloc|realloc|free|cfree|_?int_|unlink_chunk)")
_FRAME = re.compile(r"\s*([0-9a-f]+)\s+(.+?)\s+\(([^()]*)\)\s*$")


def _samples(perf: str, data: Path) -> list[list[tuple[int, str, str]]]:
    res = subprocess.run(
        [perf, "script", "-i", str(data), "-F", "ip,sym,symoff,dso"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    samples: list[list[tuple[int, str, str]]] = []
    cur: list[tuple[int, str, str]] = []
    for line in res.stdout.splitlines():
        if not line.strip():
            if cur:
                samples.append(cur)
                cur = []
            continue
        m = _FRAME.match(line)
        if m is None:
            continue  # inlined frames carry no dso
        sym = m.group(2)
        sym = "" if sym.startswith("[unknown]") else re.sub(r"\+0x[0-9a-f]+$", "", sym)
        cur.append((int(m.group(1), 16), sym, os.path.basename(m.group(3))))
    if cur:
        samples.append(cur)
    # perf lists inlined frames before the frame they were inlined into (same ip): give
    # them that frame's DSO
    for frames in samples:
        for i in range(len(frames) - 1, -1, -1):
            if frames[i][2] == "inlined":
                if _LIBC_INLINE.match(frames[i][1]):
                    dso = "libc.so.6"  # glibc's own inlined helpers (rwlock, malloc, send)
                else:
                    dso = next((f[2] for f in frames[i + 1 :] if f[2] != "inlined"), "?")
                frames[i] = (frames[i][0], frames[i][1], dso)
    return samples


def perf_summary(perf: str, data: Path, callsites: dict[int, str], ops: int) -> dict[str, Any]:
    """Entry points (HAProxy -> library calls), self time folded to exported symbols, inclusive."""
    samples = _samples(perf, data)
    total = len(samples)
    if total == 0:
        return {"samples": 0}
    by_dso: dict[str, int] = {}
    folded: dict[str, int] = {}
    incl: dict[str, int] = {}
    entry: dict[str, int] = {}
    entry_dec: dict[str, int] = {}
    flags = {
        "OSSL_DECODER_CTX_new_for_pkey (inclusive)": 0,
        "OSSL_DECODER_from_bio (inclusive)": 0,
        "pthread_rwlock_* (self)": 0,
        "malloc/free (self)": 0,
        "kernel (self)": 0,
    }
    for frames in samples:
        leaf_dso, leaf_sym = frames[0][2], frames[0][1]
        by_dso[leaf_dso] = by_dso.get(leaf_dso, 0) + 1
        first = next(((i, f) for i, f in enumerate(frames) if f[1]), None)
        if first is None:
            key = f"[unknown] {leaf_dso}"
        else:
            key = ("" if first[0] == 0 else "~") + f"{first[1][1]} ({first[1][2]})"
        folded[key] = folded.get(key, 0) + 1
        names = {f"{f[1]} ({f[2]})" for f in frames if f[1]}
        for n in names:
            incl[n] = incl.get(n, 0) + 1
        # innermost HAProxy frame whose return address is a known call site
        label = "(no HAProxy->library call found)"
        if frames[0][2] == "haproxy":
            label = f"(HAProxy's own code) {frames[0][1] or 'static fn'}"
        for ip, sym, dso in frames[1:] if frames[0][2] != "haproxy" else ():
            # perf prints a caller frame's return address minus one
            site = callsites.get(ip + 1) or callsites.get(ip)
            if dso == "haproxy" and site is not None:
                label = f"{site}  <- {sym or 'haproxy (static fn)'}"
                break
        entry[label] = entry.get(label, 0) + 1
        has_dec = any(f[1] == "OSSL_DECODER_CTX_new_for_pkey" for f in frames)
        if has_dec:
            entry_dec[label] = entry_dec.get(label, 0) + 1
            flags["OSSL_DECODER_CTX_new_for_pkey (inclusive)"] += 1
        if any(f[1] == "OSSL_DECODER_from_bio" for f in frames):
            flags["OSSL_DECODER_from_bio (inclusive)"] += 1
        if leaf_sym.startswith("pthread_rwlock") or leaf_sym.startswith("__pthread_rwlock"):
            flags["pthread_rwlock_* (self)"] += 1
        if _MALLOC.match(leaf_sym):
            flags["malloc/free (self)"] += 1
        if leaf_dso.startswith("[kernel"):
            flags["kernel (self)"] += 1

    def pct(n: int) -> float:
        return round(100.0 * n / total, 1)

    def top(d: dict[str, int], k: int) -> list[dict[str, Any]]:
        return [
            {"pct": pct(v), "sym": name} for name, v in sorted(d.items(), key=lambda kv: -kv[1])[:k]
        ]

    skip = (
        "clone3",
        "start_thread",
        "run_poll_loop",
        "process_runnable_tasks",
        "run_tasks_from_lists",
        "task_run_applet",
    )
    inclusive = [r for r in top(incl, 60) if r["sym"].split(" ")[0] not in skip][:30]
    entries = []
    for name, v in sorted(entry.items(), key=lambda kv: -kv[1])[:15]:
        entries.append(
            {
                "pct": pct(v),
                "us_per_op": round(v / 999.0 * 1e6 / max(ops, 1), 1),
                "entry": name,
                "of_which_decoder_ctx_pct": pct(entry_dec.get(name, 0)),
            }
        )
    return {
        "samples": total,
        "by_dso_self": top(by_dso, 8),
        "entry_points": entries,
        "self_folded": top(folded, 20),
        "inclusive": inclusive,
        "shares_pct": {k: pct(v) for k, v in flags.items()},
        "_incl_counts": {k: v for k, v in incl.items() if v >= 3},
        "_ops": ops,
    }


def profile_diff(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Symbols whose inclusive time per handshake grew most from the second to the first."""
    ops_a, ops_b = first.get("_ops", 1), second.get("_ops", 1)
    a, b = first.get("_incl_counts", {}), second.get("_incl_counts", {})
    rows = []
    for name in set(a) | set(b):
        ua = a.get(name, 0) / 999.0 * 1e6 / ops_a
        ub = b.get(name, 0) / 999.0 * 1e6 / ops_b
        rows.append(
            {
                "sym": name,
                "first_us": round(ua, 1),
                "second_us": round(ub, 1),
                "diff_us": round(ua - ub, 1),
            }
        )
    rows.sort(key=lambda r: -r["diff_us"])
    return rows[:20]


def machine() -> dict[str, Any]:
    """bench's machine description, plus the TLS libraries and the load at the start."""

    def out(argv: list[str]) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except OSError:
            return "?"
        return (r.stdout or r.stderr).strip()

    return {
        **bench_machine(),
        "haproxy": out(["/usr/sbin/haproxy", "-v"]).splitlines()[0],
        "openssl": out(["openssl", "version"]),
        "python_ssl": ssl.OPENSSL_VERSION,
        "cryptography": cryptography.__version__,
        "git_head": git_revision(),
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.profile_load", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--quick", action="store_true", help="small pools and batches, <= 1 minute")
    ap.add_argument(
        "--k-large", type=int, default=None, help="large pool size (default 100000; quick 2000)"
    )
    ap.add_argument("--no-perf", action="store_true", help="skip q4 (perf record)")
    args = ap.parse_args(argv)
    params = QUICK if args.quick else FULL
    if args.k_large:
        params = Params(
            **{
                **asdict(params),
                "k_large": args.k_large,
                "k_large_fallback": min(args.k_large, params.k_large_fallback),
            }
        )
    budget = Budget(params.budget_s)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    workdir = Path(tempfile.mkdtemp(prefix="profile_load-"))
    bench: Bench | None = None
    result: dict[str, Any] = {
        "bench": "bench/profile_load.py",
        "started_utc": started,
        "quick": args.quick,
        "params": asdict(params),
        "machine": machine(),
    }
    status = 0
    try:
        bench = Bench(params, workdir, budget, perf=not args.no_perf)
        result.update(bench.run())
    except (Exception, KeyboardInterrupt) as exc:  # report what we have, then fail
        status = 1
        result["error"] = f"{type(exc).__name__}: {exc}"
        if bench is not None:
            result.update({k: v for k, v in bench.result.items() if k not in result})
            result["haproxy_log_tail"] = bench.haproxy.log()[-2000:]
        say(f"FAILED: {result['error']}")
    finally:
        if bench is not None:
            stopped = bench.stop()
            say("stopped: " + ", ".join(stopped))
        shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(budget.elapsed(), 1)
    result["loadavg_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(result, indent=1))
    say(f"done in {budget.elapsed():.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
