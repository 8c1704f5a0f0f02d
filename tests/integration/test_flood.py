"""A flood of distinct made-up names through HAProxy: the store, the log and real hosts are fine.

Each made-up name is new, so the negative cache cannot help; the agent's name
filter (a Bloom filter of the store's names) turns them away without a store
lookup, and names not in the store are logged as one line per 10 s.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import pytest

from certagent.testing import PKI, Prober, RedisFixture, tlsclient, wait_for
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

SECONDS = 20.0
RATE = 1200  # made-up names per second, paced


async def flood(port: int, seconds: float, rate: int, seed: int) -> tuple[int, int]:
    """ClientHellos for random names at ``rate``/s for ``seconds``; (sent, answered)."""
    rng = random.Random(seed)
    sent = answered = 0
    gate = asyncio.Semaphore(64)
    started = time.monotonic()

    async def one(name: str) -> None:
        nonlocal answered
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 5
                )
                writer.write(tlsclient.build_client_hello(name.encode()))
                if await asyncio.wait_for(reader.read(5), 8):
                    answered += 1
                writer.close()
            except (OSError, TimeoutError):
                pass

    tasks = []
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            name = f"r{rng.getrandbits(48):x}.flood{rng.randrange(50)}.test"
            tasks.append(asyncio.create_task(one(name)))
            sent += 1
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    return sent, answered


@pytest.mark.timeout(180)
def test_a_flood_of_random_names_never_reaches_the_store(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    legit = [f"new{i}.legit.test" for i in range(10)]
    redis_store.put([pki.bundle(h) for h in ["warm.legit.test", *legit]])
    stack = make_stack(redis_store.url, capacity=50, env={"CERTAGENT_LOG_LEVEL": "info"})
    wait_for(lambda: stack.status()["name_filter"]["ready"] or None, 10.0, "the name filter")
    log_before = os.path.getsize(stack.agent_log_path)
    before = stack.status()["ensure"]
    loaded: list[str] = []

    def load_legit_hosts() -> None:  # a real new host every 2 s, during the flood
        for host in legit:
            time.sleep(SECONDS / len(legit) * 0.9)
            if stack.handshake(host, timeout=10).san == (host,):
                loaded.append(host)

    with Prober(stack, "warm.legit.test", interval=0.1) as warm:
        warm.wait_first()
        legit_thread = threading.Thread(target=load_legit_hosts, daemon=True)
        legit_thread.start()
        sent, answered = asyncio.run(flood(stack.port, SECONDS, RATE, seed=11))
        legit_thread.join(30)
    after = stack.status()["ensure"]
    grown = os.path.getsize(stack.agent_log_path) - log_before
    lookups = after["store_lookups"] - before["store_lookups"]
    print(
        f"flood: {sent} names in {SECONDS:.0f} s ({answered} answered); store lookups "
        f"{lookups} ({lookups / SECONDS:.1f}/s); filtered {after['filtered'] - before['filtered']};"
        f" agent log +{grown} bytes; legit loaded {len(loaded)}/{len(legit)}; warm {warm.ok} ok"
    )
    assert sent >= RATE * SECONDS * 0.95
    assert after["requests"] - before["requests"] >= sent * 0.9  # they did reach the agent
    assert lookups / SECONDS <= 50
    assert grown <= 100_000
    assert loaded == legit
    assert warm.failures == []


def test_random_subdomains_of_a_loaded_wildcard_cost_no_lookup_and_capped_marks(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle("*.wild.flood.test")])
    stack = make_stack(
        redis_store.url, capacity=10, env={"CERTAGENT_WILDCARD_HOSTS": "5"}
    )
    wait_for(lambda: stack.status()["name_filter"]["ready"] or None, 10.0, "the name filter")
    hosts = [f"s{i}.wild.flood.test" for i in range(40)]
    for host in hosts:
        assert stack.handshake(host).san == ("*.wild.flood.test",), host
    status = stack.status()
    marked = [h for h in stack.marked_hosts() if h.endswith(".wild.flood.test")]
    print(f"wildcard: {status['ensure']}; {len(marked)} marked")
    assert status["ensure"]["store_lookups"] == 1  # the first host loaded the wildcard
    assert status["ensure"]["wildcard_hits"] == len(hosts) - 1
    assert len(marked) == 5  # the cap: the others ask the agent each time, still served
    assert status["loader"]["loads"] == 1
