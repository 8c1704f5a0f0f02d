"""``reload``: an HAProxy reload (SIGUSR2) under steady traffic over 2,000 hot hosts.

Failed handshakes and default certificates during the reload, and how long until
the new worker has every hot host marked loaded again (served without the agent).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from typing import Any

from bench._certs import Leaves
from bench.scale.common import (
    Env,
    Outcomes,
    Sizes,
    ensure_many,
    host,
    marked,
    shared_key_bundles,
    spread,
    try_handshake,
)
from certagent.testing import Stack, wait_for


def reload_scenario(env: Env, sizes: Sizes, leaves: Leaves) -> dict[str, Any]:
    hot = [host("r", i) for i in range(sizes.reload_hot)]
    env.store.put(shared_key_bundles(leaves, hot), concurrency=64)
    stack = env.stack("reload", capacity=sizes.reload_hot + 500)
    try:
        asyncio.run(ensure_many(stack.settings.agent_socket, hot))
        ctx = env.ctx
        runs = []
        for r in range(sizes.repeats):
            runs.append(_one_reload(stack, hot, ctx))
            env.say(f"bench.scale: reload {r + 1}: {runs[-1]}")
        return {
            "hot": len(hot),
            "runs": runs,
            "all_hot_marked_after_s": spread([x["all_hot_marked_after_s"] for x in runs]),
            "default_cert": sum(x["default_cert"] for x in runs),
            "failed": sum(x["failed"] for x in runs),
        }
    finally:
        env.close(stack)


def _one_reload(stack: Stack, hot: list[str], ctx: ssl.SSLContext) -> dict[str, Any]:
    """SIGUSR2 while 4 threads loop handshakes over ``hot``; until all are marked again."""
    outcomes = Outcomes()
    stop = threading.Event()
    lock = threading.Lock()

    def traffic(offset: int) -> None:
        i = offset
        while not stop.is_set():
            h = hot[i % len(hot)]
            i += 4
            result = try_handshake(stack.port, h, ctx)
            with lock:
                outcomes.note(h, result)

    threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        asked_before = stack.status()["ensure"]["requests"]
        reloaded = time.perf_counter()
        stack.reload_haproxy()
        all_marked = wait_for(
            lambda: (time.perf_counter() - reloaded) if marked(stack) >= len(hot) else None,
            60.0,
            "every hot host marked in the new worker",
            interval=0.05,
        )
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    status = stack.status()
    return {
        "handshakes_ok": outcomes.ok,
        "default_cert": outcomes.default_cert,
        "failed": outcomes.failed,
        "errors": outcomes.errors,
        "all_hot_marked_after_s": round(all_marked, 3),
        "agent_requests": status["ensure"]["requests"] - asked_before,
        "rewarm": status["rewarm"],
    }
