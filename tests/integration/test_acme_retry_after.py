"""A CA answering ``429`` with ``Retry-After`` (issue 20, must show 4): the fleet waits as told.

Two nodes on one Redis order through :class:`~certagent.testing.acmeproxy.AcmeProxy`
in front of pebble.  The proxy answers a ``newOrder`` with ``429`` and
``Retry-After: 5``, refuses every ``newOrder`` for those 5 s (as a CA that
rate-limits an account does), and notes when each arrives: no order may arrive
from either node before the 5 s have passed, and orders (first connections,
renewals) go through afterwards.  Orders are counted where pebble created them:
the proxy also sees a newOrder sent again after pebble's deliberate ``badNonce``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from certagent.testing import RedisFixture, Stack, free_port, tlsclient, wait_for
from certagent.testing.acmeproxy import AcmeProxy
from certagent.testing.pebble import Pebble
from tests.integration.conftest import StackFactory
from tests.integration.pebblerun import running

pytestmark = pytest.mark.integration

RETRY_AFTER = 5
SUFFIX = "retry-after.test"
#: the clocks of the test and the agents are one machine's; this is only rounding
EPSILON = 0.05


class LimitedCa(AcmeProxy):
    """The proxy: the next ``limit`` newOrders get 429 and close the CA for ``RETRY_AFTER`` s.

    While closed, every newOrder gets 429 with the seconds left as ``Retry-After``.
    """

    def __init__(self, ca: Pebble) -> None:
        super().__init__(ca)
        self.limit = 0
        self.closed_until = 0.0
        self.arrivals: list[tuple[float, int]] = []  # (time.time(), status) per newOrder

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/order-plz":
            return await super().handle(request)
        now = time.time()
        with self._lock:
            if now >= self.closed_until and self.limit > 0:
                self.limit -= 1
                self.closed_until = now + RETRY_AFTER
            limited = now < self.closed_until
            self.arrivals.append((now, 429 if limited else 0))
            wait = math.ceil(self.closed_until - now)
        if limited:
            problem = {
                "type": "urn:ietf:params:acme:error:rateLimited",
                "detail": "too many new orders recently",
                "status": 429,
            }
            return web.json_response(
                problem,
                status=429,
                headers={"Retry-After": str(wait)},
                content_type="application/problem+json",
            )
        return await super().handle(request)

    def orders(self) -> int:
        with self._lock:
            return len(self.arrivals)

    def first_429(self) -> float:
        with self._lock:
            return next(at for at, status in self.arrivals if status == 429)

    def after(self, moment: float) -> list[float]:
        with self._lock:
            return [at for at, _ in self.arrivals if at > moment]


@pytest.fixture
def ca(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LimitedCa]:
    with running(Pebble(tmp_path / "pebble"), request) as pebble:
        proxy = LimitedCa(pebble).start()
        try:
            yield proxy
        finally:
            proxy.stop()


#: renewal in seconds: a tick a second, short orders and retries
RENEW = {
    "CERTAGENT_RENEW_TICK": "1",
    "CERTAGENT_ACME_ORDER_TIMEOUT": "5",
    "CERTAGENT_RENEW_RETRY_MIN": "1",
}


def node(
    make_stack: StackFactory,
    store: RedisFixture,
    ca: LimitedCa,
    *,
    on_ca_ports: bool,
    env: dict[str, str] | None = None,
) -> Stack:
    """A node ordering through ``ca``; on pebble's validation ports if ``on_ca_ports``."""
    pebble = ca.ca
    args = [
        "--acme-directory", ca.directory_url,
        "--acme-ca-file", str(pebble.ca_file),
        "--acme-email", "ops@retry-after.test",
        "--http-bind", f"127.0.0.1:{pebble.http_port if on_ca_ports else free_port()}",
    ]  # fmt: skip
    env: dict[str, Any] = {
        "CERTAGENT_ACME_ALLOW_SUFFIXES": SUFFIX,
        "CERTAGENT_ACME_BACKOFF_MIN": "1",
        "CERTAGENT_ACME_BACKOFF_MAX": "2",
        "CERTAGENT_ACME_WAIT": "3",
        **(env or {}),
    }
    return make_stack(
        store.url,
        init_args=args,
        port=pebble.tls_port if on_ca_ports else None,
        env=env,
    )


def hello(stack: Stack, name: str) -> bytes | None:
    return tlsclient.raw_hello(stack.port, name.encode(), timeout=10, address=stack.address)


def served(stack: Stack, name: str, root: Path) -> tlsclient.CertInfo | None:
    try:
        cert = tlsclient.handshake(stack.port, name, root, timeout=5, address=stack.address)
    except OSError:
        return None
    return cert if cert.san == (name,) else None


def test_a_429_pauses_every_node_for_its_retry_after_then_orders_resume(
    make_stack: StackFactory, redis_store: RedisFixture, ca: LimitedCa, tmp_path: Path
) -> None:
    a = node(make_stack, redis_store, ca, on_ca_ports=True)
    b = node(make_stack, redis_store, ca, on_ca_ports=False)
    first, second = f"one.{SUFFIX}", f"two.{SUFFIX}"
    ca.limit = 1
    assert hello(a, first) == a.default_der  # its order was refused: the fallback
    limited_at = ca.first_429()
    assert ca.orders() == 1
    # until Retry-After has passed, connections on either node, for the refused name
    # and for a new one, get the fallback and send nothing to the CA
    while time.time() < limited_at + RETRY_AFTER - 1.0:
        for stack in (a, b):
            for name in (first, second):
                assert hello(stack, name) == stack.default_der
        time.sleep(0.2)
    assert ca.orders() == 1, ca.arrivals
    for stack in (a, b):
        assert "the CA asked to wait" in stack.agent_log(), stack.directory
    # afterwards both names are issued and every node serves them
    root = tmp_path / "root.pem"
    root.write_bytes(ca.ca.roots_pem())
    for name in (first, second):
        wait_for(
            lambda name=name: all(served(s, name, root) for s in (a, b)),  # type: ignore[misc]
            30,
            f"{name} served on both nodes after the pause",
        )
    later = ca.after(limited_at)
    print(f"429 at 0.00 s; later orders at {[round(t - limited_at, 2) for t in later]} s")
    assert later, "no order after the 429"
    assert min(later) >= limited_at + RETRY_AFTER - EPSILON, (limited_at, later)


def make_due(store: RedisFixture, names: list[str]) -> None:
    """Move the schedule entries of ``names`` to now: due at the nodes' next tick."""

    async def move() -> None:
        redis_store = store.open()
        try:
            renewals = redis_store.issuance().renewals
            now = time.time()
            for name in names:
                entry = await renewals.entry(name)
                assert entry is not None, f"{name} is not scheduled"
                await renewals.schedule(name, now, entry.not_after)
        finally:
            await redis_store.close()

    asyncio.run(move())


def due_seen(stack: Stack) -> int:
    return int(stack.status()["issuance"]["renewal"]["due_seen"])


def test_renewals_wait_out_a_429_on_every_node_then_resume(
    make_stack: StackFactory, redis_store: RedisFixture, ca: LimitedCa, tmp_path: Path
) -> None:
    a = node(make_stack, redis_store, ca, on_ca_ports=True, env=RENEW)
    b = node(make_stack, redis_store, ca, on_ca_ports=False, env=RENEW)
    nodes = (a, b)
    root = tmp_path / "root.pem"
    root.write_bytes(ca.ca.roots_pem())
    names = [f"r{i}.{SUFFIX}" for i in range(4)]
    first: dict[str, int] = {}
    for i, name in enumerate(names):  # issued on demand, half through each node
        cert = wait_for(lambda n=name, i=i: served(nodes[i % 2], n, root), 20, f"{name} issued")
        first[name] = cert.serial
    # the first renewal gets the 429; the CA is closed for RETRY_AFTER s from then
    ca.limit = 1
    created = ca.ca.orders()  # orders pebble created (a newOrder retried after badNonce: once)
    make_due(redis_store, names[:1])
    wait_for(lambda: any(s == 429 for _, s in ca.arrivals), 10, "the first renewal's 429")
    limited_at = ca.first_429()
    seen = [due_seen(s) for s in nodes]
    # the rest fall due while the fleet is paused: both nodes read them, neither orders
    make_due(redis_store, names[1:])
    time.sleep(max(0.0, limited_at + RETRY_AFTER - 0.3 - time.time()))
    assert ca.after(limited_at) == [], ca.arrivals
    for stack, before in zip(nodes, seen, strict=True):
        assert due_seen(stack) > before, f"{stack.directory} read no due entry while paused"
    # afterwards every name is renewed once and every node serves the new certificate

    def renewed_everywhere() -> bool:
        for name in names:
            for stack in nodes:
                cert = served(stack, name, root)
                if cert is None or cert.serial == first[name]:
                    return False
        return True

    wait_for(renewed_everywhere, 30, "every name renewed and served on both nodes")
    later = ca.after(limited_at)
    print(f"429 at 0.00 s; renewal orders at {[round(t - limited_at, 2) for t in later]} s")
    assert min(later) >= limited_at + RETRY_AFTER - EPSILON, (limited_at, later)
    # one renewal order per name, the refused one included (pebble's count: the
    # proxy also sees a newOrder the client sent again after pebble's badNonce)
    assert ca.ca.orders() - created == len(names)
    assert sum(s.status()["issuance"]["renewal"]["done"] for s in nodes) == len(names)


# --- the fleet's own budget --------------------------------------------------------------------


def test_two_nodes_share_one_budget_per_registered_domain(
    make_stack: StackFactory, redis_store: RedisFixture, ca: LimitedCa, tmp_path: Path
) -> None:
    """``acme_domain_per_week`` 3 (weekly windows: a test never straddles one): 3 orders in all."""
    other = "other-domain.test"
    env = {
        "CERTAGENT_ACME_DOMAIN_PER_WEEK": "3",
        "CERTAGENT_ACME_RENEWAL_RESERVE": "0",
        "CERTAGENT_ACME_ALLOW_SUFFIXES": f"{SUFFIX} {other}",
    }
    nodes = (
        node(make_stack, redis_store, ca, on_ca_ports=True, env=env),
        node(make_stack, redis_store, ca, on_ca_ports=False, env=env),
    )
    root = tmp_path / "root.pem"
    root.write_bytes(ca.ca.roots_pem())
    names = [f"n{i}.shop.{SUFFIX}" for i in range(5)]  # one registered domain: SUFFIX
    for i, name in enumerate(names):  # one at a time, alternating nodes
        hello(nodes[i % 2], name)
    wait_for(
        lambda: sum(1 for n in names if served(nodes[0], n, root)) >= 3, 20, "three names issued"
    )
    assert ca.ca.orders() == 3
    for i, name in enumerate(names[3:]):  # over the budget: the fallback, on either node
        stack = nodes[i % 2]
        assert hello(stack, name) == stack.default_der
    assert ca.ca.orders() == 3
    budgets = [s.status()["issuance"]["budget"] for s in nodes]
    assert sum(b["taken"].get("new", 0) for b in budgets) == 3
    assert all(b["refused"].get("new", 0) >= 1 for b in budgets), budgets
    # another registered domain has a budget of its own
    assert wait_for(lambda: served(nodes[1], f"www.{other}", root), 20, "another domain issued")
    assert ca.ca.orders() == 4
