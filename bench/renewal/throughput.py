"""``throughput``: renewals per second against pebble with the issuance budget off.

One node issues ``due_at_once`` certificates on demand (pebble without its
validation sleep, ``PEBBLE_VA_NOSLEEP=1``; HTTP-01 answered by the node's HAProxy).
The node renews up to ``CONCURRENCY`` at once (``renew_concurrency`` and
``acme_concurrency``) and reads its schedule every ``TICK`` (``renew_tick``; the
default 10 s would make a small round mostly waiting for the next tick).
Then, ``repeats`` times: every one of them is made due at once (its schedule
entry moved to now through :meth:`Renewals.schedule`), and the clock runs until
every name has a new certificate in the store and a schedule entry in the
future.  Renewals per second = names / that time.  The orders counted at pebble
must grow by the number of names each round (exactly one renewal per name).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.renewal.common import Env, Sizes, host
from bench.scale.common import ensure_many, spread
from certagent.store.redis import RedisStore

#: renewals running at once (renew_concurrency = acme_concurrency), and the tick (s)
CONCURRENCY = 16
TICK = 1.0
ISSUE_TIMEOUT = 120.0
ROUND_TIMEOUT = 300.0
POLL = 0.05


def throughput_scenario(env: Env, sizes: Sizes) -> dict[str, Any]:
    n = sizes.due_at_once
    names = [host(i, "t") for i in range(n)]
    stack = env.node(
        "throughput",
        env={
            "CERTAGENT_ACME_CONCURRENCY": str(CONCURRENCY),
            "CERTAGENT_RENEW_CONCURRENCY": str(CONCURRENCY),
            "CERTAGENT_RENEW_TICK": str(TICK),
            "CERTAGENT_ACME_RATE_PER_HOUR": "0",
            "CERTAGENT_ACME_DOMAIN_PER_WEEK": "0",
        },
    )
    try:
        return asyncio.run(_run(env, stack.settings.agent_socket, names, sizes))
    finally:
        env.close(stack)


async def _run(env: Env, agent_socket: str, names: list[str], sizes: Sizes) -> dict[str, Any]:
    store = env.store.open()
    try:
        t0 = time.perf_counter()
        await ensure_many(agent_socket, names, concurrency=min(64, len(names)))
        ids = await _wait(store, names, {}, 0.0, ISSUE_TIMEOUT, "the first certificates")
        issue_s = time.perf_counter() - t0
        rates: list[float] = []
        seconds: list[float] = []
        orders: list[int] = []
        for _ in range(sizes.repeats):
            before = env.pebble.orders()
            started = time.time()
            renewals = store.issuance().renewals
            entries = await asyncio.gather(*(renewals.entry(n) for n in names))
            await asyncio.gather(
                *(
                    renewals.schedule(name, started, e.not_after if e else 0.0)
                    for name, e in zip(names, entries, strict=True)
                )
            )
            t = time.perf_counter()
            ids = await _wait(store, names, ids, started, ROUND_TIMEOUT, "the renewals")
            took = time.perf_counter() - t
            seconds.append(took)
            rates.append(len(names) / took)
            orders.append(env.pebble.orders() - before)
        return {
            "names": len(names),
            "first_issue_s": round(issue_s, 2),
            "round_s": spread(seconds, 3),
            "renewals_per_s": spread(rates, 2),
            "orders_at_pebble_per_round": orders,
            "one_order_per_name": all(o == len(names) for o in orders),
            "limits": "acme_rate_per_hour = acme_domain_per_week = 0 (off)",
            "renew_concurrency": CONCURRENCY,
            "renew_tick_s": TICK,
        }
    finally:
        await store.close()


async def _wait(
    store: RedisStore,
    names: list[str],
    old: dict[str, str],
    after: float,
    timeout: float,
    what: str,
) -> dict[str, str]:
    """Until no entry is due at ``after`` and every name has a certificate other than ``old``.

    Polls the schedule's count (one O(log M) call, so the bench adds little load)
    and then each name's certificate; returns the certificate ids.
    """
    renewals = store.issuance().renewals
    deadline = time.monotonic() + timeout
    ids: dict[str, str] = {}
    while True:
        total, due = await renewals.count(after)
        if total >= len(names) and due == 0:
            found = await asyncio.gather(*(store.lookup(n) for n in names))
            ids = {n: f.id for n, f in zip(names, found, strict=True) if f is not None}
            if all(ids.get(n, old.get(n)) != old.get(n) for n in names):
                return ids
        if time.monotonic() > deadline:
            done = sum(1 for n in names if n in ids and ids[n] != old.get(n))
            raise TimeoutError(f"{what}: {done} of {len(names)} done in {timeout:.0f} s")
        await asyncio.sleep(POLL)
