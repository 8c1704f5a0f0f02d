"""``python -m bench.http3 [--smoke] [--haproxy PATH] [--repeats N] [--out DIR]``.

Starts Redis, a ``certagent init --http3`` stack (HAProxy + agent) and, beside it, the
same HAProxy binary preloading the same certificates on a TCP and a QUIC bind (the
generated configuration less certagent: ``bench._configs.plain_preload_http3``), all
on loopback.  Every host is loaded into certagent by a TCP connection first, as a
browser's first visit would.  Then, ``--repeats`` times, each side in turn (the order
alternates, and within each window the two take turns operation by operation):
HTTP/3 keep-alive requests, HTTP/3 full handshakes, TCP keep-alive
requests and TCP full handshakes, each with HAProxy's CPU per operation
(:mod:`bench.http3.measure`).  Prints the JSON and writes
``<out>/<date>-http3.json`` and ``.md`` (never over an earlier result).
"""

from __future__ import annotations

import argparse
import shutil
import ssl
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import _configs
from bench._certs import Leaves, host, write_crt_list, write_preload_files
from bench._load import client_context, timed_handshake
from bench._runinfo import RESULTS, publish, run_meta, say
from bench.http3 import measure
from bench.http3.report import markdown
from certagent.testing import HAPROXY, PKI, RedisFixture, RedisProcess, Stack, write_key_file
from certagent.testing.h3client import h3_get

#: Debian unstable's HAProxy 3.2 from scripts/haproxy-versions.sh's cache.
SID = Path("/var/cache/certagent/haproxy/sid/bin/haproxy")
METRICS = ("h3_keepalive", "h3_handshake", "tcp_keepalive", "tcp_handshake")


@dataclass(frozen=True)
class Sizes:
    hosts: int
    h3_connections: int  # kept open, used in turn
    h3_requests: int  # per side and window
    h3_handshakes: int
    tcp_connections: int
    tcp_requests: int
    tcp_handshakes: int
    repeats: int


FULL = Sizes(20, 4, 4000, 400, 4, 4000, 1000, 5)
SMOKE = Sizes(3, 2, 40, 10, 2, 40, 20, 3)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.http3", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a test of the bench)")
    p.add_argument(
        "--haproxy",
        default=str(SID) if SID.exists() else HAPROXY,
        help="the HAProxy binary both sides run (default: Debian's 3.2 from the cache)",
    )
    p.add_argument("--repeats", type=int, help="repeats (default 5; smoke 3)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    return p.parse_args(argv)


def _loaded(stack: Stack, hosts: Sequence[str]) -> None:
    """Load every host into certagent over TCP, then check HTTP/3 serves each."""
    ctx = client_context(stack.cafile)
    for name in hosts:
        timed_handshake(stack.port, name, ctx)
        cert, response = h3_get(stack.port, name, stack.cafile)
        if cert.san != (name,) or response.status != 200:
            raise SystemExit(f"bench.http3: HTTP/3 for {name} got {cert.san} {response.status}")


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric: each side's median, the per-repeat ratios, their median and spread."""
    out: dict[str, Any] = {}
    for metric in METRICS:
        a = [r["certagent"][metric] for r in rows]
        b = [r["preload"][metric] for r in rows]
        ratios = [x["haproxy_us"] / y["haproxy_us"] for x, y in zip(a, b, strict=True)]
        with_agent = [
            (x["haproxy_us"] + x["others_us"]) / y["haproxy_us"] for x, y in zip(a, b, strict=True)
        ]
        out[metric] = {
            "certagent_us": round(statistics.median(x["haproxy_us"] for x in a), 2),
            "certagent_agent_redis_us": round(statistics.median(x["others_us"] for x in a), 2),
            "preload_us": round(statistics.median(y["haproxy_us"] for y in b), 2),
            "ratios": [round(r, 3) for r in ratios],
            "ratio": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "ratio_all_processes": round(statistics.median(with_agent), 3),
        }
    return out


def _repeat(
    repeat: int,
    targets: list[measure.Target],
    hosts: Sequence[str],
    cafile: Path,
    ctx: ssl.SSLContext,
    sizes: Sizes,
) -> dict[str, Any]:
    """One repeat: each metric's window, certagent and the preload interleaved."""
    if repeat % 2:  # which side goes first alternates from repeat to repeat too
        targets = targets[::-1]
    row: dict[str, Any] = {"first": targets[0].label}
    h3 = [measure.H3KeepAlive(t, hosts, cafile, sizes.h3_connections) for t in targets]
    tcp = [measure.TcpKeepAlive(t, hosts, ctx, sizes.tcp_connections) for t in targets]
    try:
        windows = {
            "h3_keepalive": measure.interleaved(targets, h3, sizes.h3_requests),
            "h3_handshake": measure.interleaved(
                targets, [measure.h3_handshake(t, hosts, cafile) for t in targets],
                sizes.h3_handshakes,
            ),
            "tcp_keepalive": measure.interleaved(targets, tcp, sizes.tcp_requests),
            "tcp_handshake": measure.interleaved(
                targets, [measure.tcp_handshake(t, hosts, ctx) for t in targets],
                sizes.tcp_handshakes,
            ),
        }  # fmt: skip
    finally:
        for keepalive in (*h3, *tcp):
            keepalive.close()
    for i, target in enumerate(targets):
        row[target.label] = {metric: figures[i] for metric, figures in windows.items()}
    say(f"bench.http3: repeat {repeat + 1} done")
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    repeats = args.repeats or sizes.repeats
    binary = args.haproxy
    work = Path(tempfile.mkdtemp(prefix="bench-h3-"))
    redis = RedisProcess(work / "redis").start()
    stacks: list[Stack] = []
    try:
        pki = PKI.create(work / "root.pem", "certagent bench CA")
        leaves = Leaves(pki)
        hosts = [host(i) for i in range(sizes.hosts)]
        pem_dir = work / "pems"
        store = RedisFixture(redis.url, write_key_file(work / "keys"))
        store.put(write_preload_files(leaves, hosts, pem_dir))
        init_args = ["--http3", "--haproxy", binary]
        common: dict[str, Any] = {
            "store": redis.url,
            "cafile": pki.cafile,
            "key_file": store.key_file,
            "capacity": sizes.hosts + 10,
            "init_args": init_args,
            "haproxy_binary": binary,
        }
        agent = Stack.create(work / "certagent", **common)
        stacks.append(agent)
        preload = Stack.create(work / "preload", **common)
        stacks.append(preload)
        crt_list = write_crt_list(work / "preload.crtlist", pem_dir, hosts)
        preload.haproxy_cfg.write_text(
            _configs.plain_preload_http3(preload.haproxy_cfg.read_text(), preload.port, crt_list)
        )
        agent.start_haproxy()
        agent.start_agent()
        preload.start_haproxy()  # HAProxy only: no agent on the preloading side
        _loaded(agent, hosts)
        for name in hosts:
            h3_get(preload.port, name, pki.cafile)
        assert agent.agent is not None and redis.proc is not None
        redis_pid = redis.proc.pid
        targets = {
            "certagent": measure.Target(
                "certagent", agent.port, agent.worker_pid(), (agent.agent.pid, redis_pid)
            ),
            "preload": measure.Target("preload", preload.port, preload.worker_pid()),
        }
        ctx = client_context(pki.cafile)
        sides = [targets["certagent"], targets["preload"]]
        rows = [_repeat(n, sides, hosts, pki.cafile, ctx, sizes) for n in range(repeats)]
        status = agent.status()
        result = {
            "meta": {
                **run_meta(),
                "scenario": "http3",
                "haproxy_binary": binary,
                "haproxy_build": status["haproxy_build"],
                "smoke": args.smoke,
            },
            "sizes": vars(sizes) | {"repeats": repeats},
            "summary": _summary(rows),
            "repeats": rows,
            "agent": {"loader": status["loader"], "http3": status["http3"]},
        }
    finally:
        for stack in stacks:
            stack.close()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    stem = f"{result['meta']['date'][:10]}-http3" + ("-smoke" if args.smoke else "")
    path = publish(result, args.out, stem, markdown(result))
    say(f"bench.http3: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
