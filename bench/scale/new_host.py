"""``new_host``: server CPU per new host at a full pool, ECDSA and RSA-2048 leaves.

Each leaf has a key of its own (what a real deployment loads); the first
handshake is included, and a warm full handshake of the same hosts is beside it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench._load import client_context
from bench.scale.common import (
    Cpu,
    Env,
    Outcomes,
    Sizes,
    ensure_many,
    host,
    own_key_bundles,
    spread,
    try_handshake,
)
from certagent.testing import PKI


def new_host(env: Env, sizes: Sizes, pkis: dict[str, PKI]) -> dict[str, Any]:
    """Server CPU per new host (first handshake included), at a full pool, per key type."""
    out: dict[str, Any] = {}
    for kind, pki in pkis.items():
        names = [host(f"n{kind}", i) for i in range(sizes.new_host_capacity)]
        cold = [host(f"m{kind}", i) for i in range(sizes.new_host_count * sizes.repeats)]
        env.say(f"bench.scale: new_host {kind}: {len(names) + len(cold)} leaves with own keys")
        env.store.put(own_key_bundles(pki, [*names, *cold]), concurrency=32)
        stack = env.stack(f"new-host-{kind}", capacity=sizes.new_host_capacity)
        try:
            asyncio.run(ensure_many(stack.settings.agent_socket, names))
            pids = env.pids(stack)
            ctx = client_context(pki.cafile)
            total, agent, haproxy, warm = [], [], [], []
            outcomes = Outcomes()
            for r in range(sizes.repeats):
                batch = cold[r * sizes.new_host_count : (r + 1) * sizes.new_host_count]
                cpu = Cpu(pids).start()
                for h in batch:
                    outcomes.note(h, try_handshake(stack.port, h, ctx))
                cpu.stop()
                wcpu = Cpu(pids).start()
                for h in batch:  # the same hosts, now warm: a full handshake each
                    try_handshake(stack.port, h, ctx)
                wcpu.stop()
                n = len(batch)
                agent.append(cpu.ms["agent"] / n)
                haproxy.append(cpu.ms["haproxy"] / n)
                total.append((cpu.ms["agent"] + cpu.ms["haproxy"]) / n)
                warm.append(wcpu.ms["haproxy"] / n)
            out[kind] = {
                "server_ms_per_new_host": spread(total),
                "agent_ms": spread(agent),
                "haproxy_ms": spread(haproxy),
                "haproxy_ms_per_warm_full_handshake": spread(warm),
                "handshakes": {
                    "ok": outcomes.ok,
                    "default_cert": outcomes.default_cert,
                    "failed": outcomes.failed,
                    "errors": outcomes.errors,
                },
            }
            env.say(f"bench.scale: new_host {kind}: {out[kind]}")
        finally:
            env.close(stack)
    return out
