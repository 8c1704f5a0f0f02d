"""Certificates on demand (issue 19): real HAProxy, Redis and agents against Debian's pebble.

Every name resolves to 127.0.0.1 for pebble (pebble-challtestsrv's DNS); pebble
validates HTTP-01 on ``pebble.http_port`` and TLS-ALPN-01 on ``pebble.tls_port``,
which are the ports a node binds: ``fe_http`` (``--http-bind``) and ``fe_sni``.
Issued certificates are checked with a TLS handshake that trusts only pebble's
root, hostname verified.  Orders are counted in pebble's log.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import secrets
import ssl
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from certagent.api import add_token
from certagent.testing import RedisFixture, Stack, free_port, tlsclient, wait_for
from certagent.testing.askendpoint import AskEndpoint
from certagent.testing.pebble import Pebble
from tests.integration.conftest import StackFactory
from tests.integration.pebblerun import running

pytestmark = pytest.mark.integration

DOMAIN = "shop.ondemand.test"


@pytest.fixture
def pebble(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pebble]:
    """A fresh pebble (new root, no accounts) per test; stopped by PID."""
    with running(Pebble(tmp_path / "pebble"), request) as ca:
        yield ca


def acme_args(
    ca: Pebble,
    *,
    ask: str | None = None,
    challenge: str = "http-01",
    address: str = "127.0.0.1",
) -> list[str]:
    args = [
        "--acme-directory", ca.directory_url,
        "--acme-ca-file", str(ca.ca_file),
        "--acme-email", "ops@ondemand.test",
        "--acme-challenge", challenge,
        "--http-bind", f"{address}:{ca.http_port}",
    ]  # fmt: skip
    if ask is not None:
        args += ["--ask", ask]
    return args


#: settings that keep a test short: backoff from 1 s, a small fleet cap
FAST = {"CERTAGENT_ACME_BACKOFF_MIN": "1", "CERTAGENT_ACME_BACKOFF_MAX": "4"}


def node(
    make_stack: StackFactory,
    store: RedisFixture,
    ca: Pebble,
    *,
    ask: str | None = None,
    challenge: str = "http-01",
    address: str = "127.0.0.1",
    on_ca_ports: bool = True,
    capacity: int = 100,
    env: dict[str, str] | None = None,
) -> Stack:
    """One node on ``store``; on pebble's ports (``fe_sni`` = tls_port) unless told not to."""
    http = ca.http_port if on_ca_ports else None
    args = acme_args(ca, ask=ask, challenge=challenge, address=address)
    if http is None:
        args[args.index("--http-bind") + 1] = f"{address}:{free_port()}"
    return make_stack(
        store.url,
        capacity=capacity,
        init_args=args,
        port=ca.tls_port if on_ca_ports else None,
        address=address,
        env={**FAST, **(env or {})},
    )


def trust(ca: Pebble, tmp_path: Path) -> Path:
    """A file with pebble's root: the only CA the checking client trusts."""
    path = tmp_path / "pebble-root.pem"
    path.write_bytes(ca.roots_pem())
    return path


def issued(stack: Stack, host: str, root: Path, timeout: float = 15.0) -> tlsclient.CertInfo:
    """A verified handshake with ``host`` on ``stack`` (pebble's root, hostname checked)."""
    return tlsclient.handshake(stack.port, host, root, timeout=timeout, address=stack.address)


def fallback_hello(stack: Stack, host: str, timeout: float = 15.0) -> tuple[bytes | None, float]:
    """The certificate ``stack`` sends for ``host`` (unverified) and how long it took."""
    started = time.monotonic()
    der = tlsclient.raw_hello(stack.port, host.encode(), timeout=timeout, address=stack.address)
    return der, time.monotonic() - started


def post_json(url: str, token: str, body: object) -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return reply.status, json.loads(reply.read())


def requests_to_agent(stack: Stack) -> int:
    return int(stack.status()["ensure"]["requests"])


def open_orders_peak(log: str) -> int:
    """The most orders pebble held open at once: created, not yet finalized (its log order)."""
    open_now = peak = 0
    for line in log.splitlines():
        if "Added order" in line:
            open_now += 1
            peak = max(peak, open_now)
        elif "POST /finalize-order/" in line:
            open_now -= 1
    return peak


# --- one node ---------------------------------------------------------------------------------


def test_an_allowed_new_name_is_issued_on_its_first_connection(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    with AskEndpoint(allowed={DOMAIN}) as ask:
        stack = node(make_stack, redis_store, pebble, ask=ask.url)
        started = time.monotonic()
        cert = issued(stack, DOMAIN, root)
        took = time.monotonic() - started
        print(f"first connection to a never-seen name served in {took:.2f} s")
        assert cert.san == (DOMAIN,)
        assert took < stack.settings.hold  # within the deadline: no fallback in between
        assert pebble.orders() == 1
        # the next connection needs no agent call: HAProxy has it marked
        before = requests_to_agent(stack)
        assert issued(stack, DOMAIN, root).serial == cert.serial
        assert requests_to_agent(stack) == before
        # stored through the normal write path, marked as ACME-managed
        listed = json.loads(stack.command("cert", "ls", "--json").stdout)
        (record,) = [r for r in listed if DOMAIN in r["names"]]
        assert record["managed"] == "acme"
        status = stack.status()["issuance"]
        assert status["orders_valid"] == 1 and status["orders_failed"] == 0
        shown = stack.cli("status").stdout
        assert "orders 1 valid / 0 failed" in shown, shown


def test_a_denied_name_never_reaches_the_ca_and_the_endpoint_is_asked_once_per_ttl(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble
) -> None:
    denied = "stranger.ondemand.test"
    with AskEndpoint(allowed=set()) as ask:
        stack = node(make_stack, redis_store, pebble, ask=ask.url)
        for _ in range(3):
            der, _ = fallback_hello(stack, denied)
            assert der == stack.default_der  # the fallback
        assert ask.asked(denied) == 1  # cached: once per acme_deny_ttl, not per connection
        # 200 connections to made-up names: no order; the endpoint sees a bounded rate
        names = [f"{secrets.token_hex(6)}.random.test" for _ in range(200)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda n: fallback_hello(stack, n)[0], names))
        assert all(der == stack.default_der for der in results)
        assert pebble.orders() == 0
        assert ask.asked() <= 1 + 200
        print(f"ask endpoint: {ask.asked()} requests for 201 names over the test")


# --- registered names --------------------------------------------------------------------------


def test_a_registered_name_is_served_though_the_endpoint_denies_it(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    by_cli, by_api = "cli.ondemand.test", "api.ondemand.test"
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "platform")
    bind = f"127.0.0.1:{free_port()}"
    with AskEndpoint(allowed=set()) as ask:
        stack = node(
            make_stack,
            redis_store,
            pebble,
            ask=ask.url,
            env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": bind},
        )
        assert stack.command("domain", "add", by_cli).returncode == 0
        assert issued(stack, by_cli, root).san == (by_cli,)
        # and through the REST API
        status, body = post_json(f"http://{bind}/v1/domains", token, {"name": by_api})
        assert status == 201, body
        assert issued(stack, by_api, root).san == (by_api,)
        assert ask.asked(by_cli) == ask.asked(by_api) == 0  # registered: no need to ask
        listing = stack.command("domain", "ls").stdout.split()
        assert listing == sorted([by_api, by_cli])
        # domain rm: no further issuance for the name
        assert stack.command("domain", "rm", by_cli).returncode == 0
        for record_id in record_ids(stack, by_cli):
            assert stack.command("cert", "rm", record_id).returncode == 0
        orders = pebble.orders()
        wait_for(lambda: not stack.marked_hosts().get(by_cli) or None, 5, "unloaded")
        der, _ = fallback_hello(stack, by_cli)
        assert der == stack.default_der
        assert pebble.orders() == orders


def record_ids(stack: Stack, name: str) -> list[str]:
    listed = json.loads(stack.command("cert", "ls", "--json", "--name", name).stdout)
    return [r["id"] for r in listed]


# --- a fleet -----------------------------------------------------------------------------------


def test_one_order_for_twenty_concurrent_first_connections_across_three_nodes(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    with AskEndpoint(allowed={DOMAIN}) as ask:
        nodes = [node(make_stack, redis_store, pebble, ask=ask.url)]
        nodes += [
            node(make_stack, redis_store, pebble, ask=ask.url, on_ca_ports=False) for _ in range(2)
        ]
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            futures = [pool.submit(issued, nodes[i % 3], DOMAIN, root) for i in range(24)]
            certs = [f.result() for f in futures]
        assert {c.san for c in certs} == {(DOMAIN,)}
        assert len({c.serial for c in certs}) == 1
        assert pebble.orders() == 1


@pytest.mark.parametrize("challenge", ["http-01", "tls-alpn-01"])
def test_an_order_placed_by_one_node_is_validated_against_another(
    make_stack: StackFactory,
    redis_store: RedisFixture,
    pebble: Pebble,
    tmp_path: Path,
    challenge: str,
) -> None:
    """The names resolve to 127.0.0.1 (node B); the first connection goes to 127.0.0.2 (A)."""
    root = trust(pebble, tmp_path)
    with AskEndpoint(allowed={DOMAIN}) as ask:
        b = node(make_stack, redis_store, pebble, ask=ask.url, challenge=challenge)
        a = node(
            make_stack, redis_store, pebble, ask=ask.url, challenge=challenge, address="127.0.0.2"
        )
        cert = issued(a, DOMAIN, root)
        assert cert.san == (DOMAIN,)
        assert pebble.orders() == 1
        assert a.status()["issuance"]["orders_valid"] == 1  # A ordered ...
        assert b.status()["issuance"]["orders_started"] == 0
        assert b.status()["issuance"]["challenges"]["answered"] >= 1  # ... B answered
        assert issued(b, DOMAIN, root).serial == cert.serial  # and serves it too


# --- failures ------------------------------------------------------------------------------------


def test_a_ca_outage_gets_the_fallback_backs_off_and_heals(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    loaded, late = "loaded.ondemand.test", "late.ondemand.test"
    with AskEndpoint(allowed={loaded, late}) as ask:
        nodes = [
            node(make_stack, redis_store, pebble, ask=ask.url, env={"CERTAGENT_ACME_WAIT": "3"}),
            node(
                make_stack,
                redis_store,
                pebble,
                ask=ask.url,
                on_ca_ports=False,
                env={"CERTAGENT_ACME_WAIT": "3"},
            ),
        ]
        serial = issued(nodes[0], loaded, root).serial
        assert pebble.stop_ca()
        # loaded names are unaffected
        for stack in nodes:
            assert issued(stack, loaded, root).serial == serial
        # a new allowed name gets the fallback, at the latest after the wait (a refused
        # connection to the CA fails its order at once); its issuance backs off
        der, took = fallback_hello(nodes[0], late, timeout=15)
        assert der == nodes[0].default_der
        assert took <= 3 + 1.5, took
        for _ in range(20):  # more connections meanwhile: no tight loop of attempts
            fallback_hello(nodes[_ % 2], late, timeout=15)
        failed = sum(s.status()["issuance"]["orders_failed"] for s in nodes)
        assert 1 <= failed <= 5, failed
        pebble.start_ca()
        root = trust(pebble, tmp_path)  # a restarted pebble has a new root (and no accounts)

        def served_everywhere() -> bool | None:
            try:
                return all(issued(s, late, root, timeout=5).san == (late,) for s in nodes) or None
            except (OSError, ssl.SSLError):
                return None

        wait_for(served_everywhere, 30, f"{late} served on every node after the outage")


def test_a_storm_of_new_names_stays_within_the_concurrency_cap(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    names = [f"n{i:03d}.storm.ondemand.test" for i in range(200)]
    cap = 5
    with AskEndpoint(allow=lambda name: name.endswith(".storm.ondemand.test")) as ask:
        stack = node(
            make_stack,
            redis_store,
            pebble,
            ask=ask.url,
            capacity=150,
            env={"CERTAGENT_ACME_CONCURRENCY": str(cap), "CERTAGENT_ACME_ASK_RATE": "1000"},
        )
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            list(pool.map(lambda n: _try(stack, n, root), names))  # the storm: 200 in ~2 s

        def all_served() -> bool | None:
            missing = [n for n in names if not _served(stack, n, root)]
            return not missing or None

        wait_for(all_served, 120, "every name of the storm served with its own certificate")
        assert pebble.orders() == len(names)
        peak = open_orders_peak(pebble.log())
        print(f"storm: {len(names)} names, at most {peak} orders open at the CA (cap {cap})")
        assert peak <= cap


def _try(stack: Stack, name: str, root: Path) -> None:
    with contextlib.suppress(OSError):
        issued(stack, name, root, timeout=15)


def _served(stack: Stack, name: str, root: Path) -> bool:
    try:
        return issued(stack, name, root, timeout=10).san == (name,)
    except OSError:
        return False


def _names(certs: Sequence[tlsclient.CertInfo]) -> set[tuple[str, ...]]:
    return {c.san for c in certs}
