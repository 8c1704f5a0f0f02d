"""Renewal (issue 20): real HAProxy, Redis and agents against pebble issuing 60 s certificates.

Every certificate issued on demand is on the store's renewal schedule; the tests
watch it renewed before expiry, once per fleet (orders counted in pebble's log),
and swapped on every node through the live-rotation path while probers handshake
without pause.  One test kills a node by PID while it holds renewal leases; one
follows a renewalInfo (ARI) window served by :class:`AcmeProxy`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from certagent.acme.ari import cert_id
from certagent.api import add_token
from certagent.service.renewtime import LEASE_FLOOR
from certagent.testing import RedisFixture, Stack, tlsclient, wait_for
from certagent.testing.acmeproxy import AcmeProxy
from certagent.testing.askendpoint import AskEndpoint
from certagent.testing.certs import issue, make_ca
from certagent.testing.pebble import Pebble
from certagent.testing.processes import StackError, free_port
from tests.integration.conftest import StackFactory
from tests.integration.pebblerun import running
from tests.integration.test_acme_ondemand import FAST, acme_args, issued, trust

pytestmark = pytest.mark.integration

VALIDITY = 40  # s: pebble's certificates; renewal at half of it (lifetimes under 10 days)
#: a tick a second, little jitter (±1.2 s of a 60 s lifetime), short leases (order 5 s + 15 s)
RENEW = {
    **FAST,
    "CERTAGENT_RENEW_TICK": "1",
    "CERTAGENT_RENEW_JITTER": "0.02",
    "CERTAGENT_ACME_ORDER_TIMEOUT": "5",
    "CERTAGENT_RENEW_RETRY_MIN": "1",
    "CERTAGENT_RENEW_MARGIN": "5",
}


@pytest.fixture
def pebble(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pebble]:
    with running(Pebble(tmp_path / "pebble", validity=VALIDITY), request) as ca:
        yield ca


def fleet_node(
    make_stack: StackFactory,
    store: RedisFixture,
    ca: Pebble,
    ask: str,
    *,
    directory: str | None = None,
    on_ca_ports: bool = False,
    env: dict[str, str] | None = None,
) -> Stack:
    """A node on ``store``; only one of a fleet binds pebble's validation ports."""
    args = acme_args(ca, ask=ask)
    if not on_ca_ports:
        args[args.index("--http-bind") + 1] = f"127.0.0.1:{free_port()}"
    if directory is not None:
        args[args.index("--acme-directory") + 1] = directory
    return make_stack(
        store.url,
        init_args=args,
        port=ca.tls_port if on_ca_ports else None,
        env={**RENEW, **(env or {})},
    )


class FleetProber:
    """Threads doing verified handshakes for every name on every node, without pause.

    Counts failures (a default certificate among them: it does not verify against
    pebble's root) and remembers, per (node, name), the serials seen and when each
    first appeared.
    """

    def __init__(self, nodes: list[Stack], names: list[str], root: Path) -> None:
        self.nodes, self.names = nodes, names
        self.context = tlsclient.client_context(root)
        self.ok = 0
        self.failures: list[str] = []
        self.defaults = 0
        self.first_seen: dict[tuple[int, str, int], float] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(nodes))
        ]

    def _run(self, index: int) -> None:
        stack = self.nodes[index]
        while not self._stop.is_set():
            for name in self.names:
                try:
                    info = tlsclient.handshake(
                        stack.port, name, context=self.context, address=stack.address
                    )
                except OSError as exc:  # ssl.SSLError is an OSError
                    self.failures.append(f"node {index} {name}: {exc!r}")
                    der = tlsclient.raw_hello(stack.port, name.encode(), address=stack.address)
                    self.defaults += der == stack.default_der
                    continue
                self.ok += 1
                self.first_seen.setdefault((index, name, info.serial), time.time())
            self._stop.wait(0.05)

    def serials(self, index: int, name: str) -> list[int]:
        seen = [(at, s) for (i, n, s), at in self.first_seen.items() if i == index and n == name]
        return [s for _, s in sorted(seen)]

    def __enter__(self) -> FleetProber:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def not_after(cert: tlsclient.CertInfo) -> float:
    return x509.load_der_x509_certificate(cert.der).not_valid_after_utc.timestamp()


def renewals_done(nodes: list[Stack]) -> int:
    return sum(s.status()["issuance"]["renewal"]["done"] for s in nodes)


# --- Must show 1 --------------------------------------------------------------------------------


def test_each_certificate_is_renewed_once_and_swapped_on_every_node_without_a_blink(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    names = [f"r{i}.renew.test" for i in range(3)]
    with AskEndpoint(allow=lambda name: name.endswith(".renew.test")) as ask:
        nodes = [fleet_node(make_stack, redis_store, pebble, ask.url, on_ca_ports=True)]
        nodes += [fleet_node(make_stack, redis_store, pebble, ask.url) for _ in range(2)]
        workers = [s.haproxy.worker_pid() for s in nodes]
        first = {name: issued(nodes[i], name, root) for i, name in enumerate(names)}
        assert pebble.orders() == len(names)
        for stack in nodes:  # every node serves the first certificate
            for name in names:
                assert issued(stack, name, root).serial == first[name].serial
        expiry = {name: not_after(cert) for name, cert in first.items()}
        with FleetProber(nodes, names, root) as prober:

            def all_swapped() -> bool | None:
                return (
                    all(
                        len(prober.serials(i, name)) >= 2
                        for i in range(len(nodes))
                        for name in names
                    )
                    or None
                )

            wait_for(all_swapped, VALIDITY, "every name renewed and swapped on every node")
            time.sleep(1.0)  # a few more rounds on the new certificates
        print(
            f"prober: {prober.ok} verified handshakes, {len(prober.failures)} failed,"
            f" {prober.defaults} default certificates"
        )
        assert prober.failures == [] and prober.defaults == 0
        for name in names:
            renewed = {prober.serials(i, name)[-1] for i in range(len(nodes))}
            assert len(renewed) == 1, f"{name}: nodes serve {renewed}"  # the same on all
            assert renewed != {first[name].serial}
            for i in range(len(nodes)):
                assert prober.serials(i, name) == [first[name].serial, *renewed]
                swapped_at = prober.first_seen[(i, name, next(iter(renewed)))]
                left = expiry[name] - swapped_at
                print(f"{name} on node {i}: swapped {left:.1f} s before expiry")
                assert swapped_at < expiry[name]
        assert pebble.orders() == 2 * len(names)  # exactly one renewal each, fleet-wide
        assert renewals_done(nodes) == len(names)
        # no reload: the same HAProxy workers, the loader never reloaded
        assert [s.haproxy.worker_pid() for s in nodes] == workers
        assert all(s.status()["ensure"]["reloads"] == 0 for s in nodes)
        # swapped in place on every node (set + commit into the loaded slot)
        live = [s.status()["live"] for s in nodes]
        print("live updates per node:", [(c["rotated"], c["unmarked"]) for c in live])
        assert all(c["rotated"] == len(names) for c in live), live
        # renewed certificates are scheduled again; the replaced ones are gone
        listed = json.loads(nodes[0].command("cert", "ls", "--json").stdout)
        assert sorted(n for r in listed for n in r["names"]) == sorted(names)
        renewal = nodes[0].status()["issuance"]["renewal"]
        assert renewal["scheduled"] == len(names) and renewal["overdue"] == 0
        # the pace: each node's own, and the fleet's from every node's beat (20 s apart)
        paces = [s.status()["issuance"]["renewal"]["pace"] for s in nodes]
        assert sum(p > 0 for p in paces) >= 1 and all(p >= 0 for p in paces), paces

        def fleet_pace() -> dict[str, Any] | None:
            rn: dict[str, Any] = nodes[0].status()["issuance"]["renewal"]
            return rn if rn["fleet_pace"] > 0 and rn["fleet_renewing_nodes"] == 3 else None

        rn = wait_for(fleet_pace, 60, "the fleet's pace from the nodes' beats")
        assert rn["backlog"] == 0 and rn["fleet_clear_seconds"] == 0.0
        shown = nodes[0].cli("status").stdout
        assert "renewals a minute here" in shown and "renewing node(s)" in shown, shown
        board = json.loads(nodes[0].command("fleet", "status", "--json").stdout)
        assert all(n["renew_pace"] is not None for n in board["nodes"]), board  # all 3 renew
        assert sum(n["renew_pace"] for n in board["nodes"]) > 0, board


# --- opting an imported certificate in ------------------------------------------------------


def test_imported_certificates_opted_in_by_cli_and_api_are_renewed_from_the_ca(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    by_cli, by_api = "imported.renew.test", "api.renew.test"
    now = dt.datetime.now(dt.UTC)
    for name in (by_cli, by_api):
        chain, key = issue(
            make_ca(),
            name,
            not_before=now - dt.timedelta(seconds=30),
            not_after=now + dt.timedelta(seconds=60),  # half its lifetime: 15 s from now
        )
        (tmp_path / f"{name}.pem").write_bytes(chain + key)
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "platform")
    bind = f"127.0.0.1:{free_port()}"
    api = {"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": bind}
    with AskEndpoint(allow=lambda n: n.endswith(".renew.test")) as ask:
        stack = fleet_node(make_stack, redis_store, pebble, ask.url, on_ca_ports=True, env=api)
        for name in (by_cli, by_api):
            added = stack.command("cert", "add", "--cert", str(tmp_path / f"{name}.pem"))
            assert added.returncode == 0, added.stderr
        managed = stack.command("cert", "manage", by_cli, "nothing.renew.test")
        assert managed.returncode == 1  # one name has no certificate: said, and the exit says so
        assert f"{by_cli}: managed; renewal at" in managed.stdout, managed.stdout
        assert "nothing.renew.test: the store has no certificate" in managed.stderr
        status, body = put(f"http://{bind}/v1/renewals/{by_api}", token)
        assert status == 200 and body["name"] == by_api, body
        status, body = put(f"http://{bind}/v1/renewals/nothing.renew.test", token)
        assert (status, body["code"]) == (404, "not-found"), body
        shown = stack.cli("status").stdout
        assert "renewal      2 scheduled" in shown, shown

        def from_pebble(name: str) -> tlsclient.CertInfo | None:
            try:
                return issued(stack, name, root, timeout=5)
            except OSError:
                return None

        for name in (by_cli, by_api):
            renewed = wait_for(functools.partial(from_pebble, name), 45, f"{name} renewed")
            assert renewed.san == (name,)
        events = [
            line[:250]
            for line in stack.agent_log().splitlines()
            if "issued" in line or "failed" in line or "renew" in line.split(":", 3)[-1][:40]
        ]
        assert pebble.orders() == 2, "\n".join(events)
        listed = json.loads(stack.command("cert", "ls", "--json").stdout)
        assert sorted((r["names"], r["managed"]) for r in listed) == [
            ([by_api], "acme"),
            ([by_cli], "acme"),
        ]  # the imported ones deleted


def put(url: str, token: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"}, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# --- Must show 2 -------------------------------------------------------------------------------


class BlackHole:
    """A TCP listener that accepts and never answers: an ACME CA that hangs."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def directory_url(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
        self._thread.join(5)


def test_a_node_killed_holding_renewal_leases_leaves_them_to_another_after_expiry(
    make_stack: StackFactory, redis_store: RedisFixture, tmp_path: Path
) -> None:
    """Node A's CA hangs (a black hole), so A holds its leases mid-renewal when it dies.

    Certificates of 90 s: the leases A took lapse well before they expire (20 s: a
    renewal's lease scales with what is left of the certificate, at least
    ``LEASE_FLOOR``; the settings' lease would be 30 s).
    Orders may take 15 s here: the dead node counts as alive (its last heartbeat)
    for up to 30 s, and an order waits up to 5 s for every live node to serve its
    challenge (``ACK_WAIT``) before the CA is told to validate.
    """
    with Pebble(tmp_path / "pebble", validity=90).start() as pebble:
        _killed_node(make_stack, redis_store, pebble, tmp_path)


def _killed_node(
    make_stack: StackFactory, redis_store: RedisFixture, pebble: Pebble, tmp_path: Path
) -> None:
    root = trust(pebble, tmp_path)
    names = [f"k{i}.renew.test" for i in range(3)]
    # scaled to the ~85 s left (RenewPolicy.scaled): the floor, below acme_order_timeout + 15
    lease_seconds = LEASE_FLOOR
    with AskEndpoint(allow=lambda name: name.endswith(".renew.test")) as ask, BlackHole() as hole:
        slow = {"CERTAGENT_ACME_ORDER_TIMEOUT": "15"}
        off = {**slow, "CERTAGENT_RENEW_TICK": "0"}  # until A holds the leases
        b = fleet_node(make_stack, redis_store, pebble, ask.url, on_ca_ports=True, env=off)
        c = fleet_node(make_stack, redis_store, pebble, ask.url, env=off)
        a = fleet_node(
            make_stack,
            redis_store,
            pebble,
            ask.url,
            directory=hole.directory_url,
            env={**slow, "CERTAGENT_RENEW_TICK": "0.2"},
        )
        first = {name: issued(b, name, root) for name in names}
        # make them due now: A's tick takes their leases, and hangs at its CA
        store = redis_store.open()

        async def due_now() -> None:
            renewals = store.issuance().renewals
            for name, cert in first.items():
                await renewals.schedule(name, time.time(), not_after(cert))
            await store.close()

        asyncio.run(due_now())
        due_at = time.time()

        def a_holds() -> list[str] | None:
            running: list[str] = a.status()["issuance"]["renewal"]["running_names"]
            return running if len(running) == len(names) else None

        held = wait_for(a_holds, 10, "node A renewing (holding leases)")
        assert a.agent is not None
        a.agent.kill()  # SIGKILL by PID: no release, no cleanup
        a.agent.wait(10)
        killed_at = time.time()
        print(f"killed node A (pid {a.agent.pid}) holding {held}")
        for stack in (b, c):  # B and C renew from now on
            stack.stop_agent()
            stack.env["CERTAGENT_RENEW_TICK"] = "1"
            stack.start_agent()

        def renewed_on_b_and_c() -> bool | None:
            for stack in (b, c):
                for name in names:
                    if issued(stack, name, root).serial == first[name].serial:
                        return None
            return True

        try:
            wait_for(renewed_on_b_and_c, 60, "B and C renewing what A held")
        except StackError:
            for line in b.agent_log().splitlines():
                if "renew" in line or "WARNING" in line:
                    print("B:", line[:300])
            raise
        renewed_at = time.time()
        print(
            f"renewed on B and C {renewed_at - killed_at:.1f} s after the kill"
            f" (leases of {lease_seconds} s taken from {due_at - killed_at:+.1f} s)"
        )
        for name in held:
            assert issued(b, name, root).serial == issued(c, name, root).serial
        # the held names waited for A's leases to lapse; nothing expired meanwhile
        assert renewed_at >= due_at + lease_seconds - 2
        for name in names:
            assert renewed_at < not_after(first[name])
            assert not_after(issued(b, name, root)) > not_after(first[name])
        failures = [line for s in (b, c) for line in s.agent_log().splitlines() if "failed" in line]
        assert pebble.orders() == 2 * len(names), failures  # A never reached the CA
        assert b.status()["issuance"]["renewal"]["done"] + c.status()["issuance"]["renewal"][
            "done"
        ] == len(names)


# --- Must show 5 -------------------------------------------------------------------------------


def test_an_ari_window_moved_earlier_renews_within_it(
    make_stack: StackFactory, redis_store: RedisFixture, tmp_path: Path
) -> None:
    name = "ari.renew.test"
    with Pebble(tmp_path / "pebble", validity=3600).start() as ca, AcmeProxy(ca) as proxy:
        root = trust(ca, tmp_path)
        state: dict[str, float] = {}
        incident: dict[str, str] = {}  # the one certificate whose window the CA moved

        def window(ari_id: str) -> dict[str, object]:
            # the moved window is the old certificate's only: its renewal, asked at once, must
            # not be told to renew again (that was a third order, seen under load)
            if ari_id == incident.get("id"):
                start, end = state["start"], state["end"]
            else:
                start, end = state["usual_start"], state["usual_end"]
            return {"suggestedWindow": {"start": _iso(start), "end": _iso(end)}}

        now = time.time()
        state.update(usual_start=now + 1500, usual_end=now + 2000)  # around half the lifetime
        proxy.window = window
        proxy.retry_after = 1
        with AskEndpoint(allow=lambda n: n == name) as ask:
            stack = fleet_node(
                make_stack,
                redis_store,
                ca,
                ask.url,
                directory=proxy.directory_url,
                on_ca_ports=True,
                env={"CERTAGENT_RENEW_ARI_MIN": "1", "CERTAGENT_RENEW_ARI_MAX": "2"},
            )
            old = issued(stack, name, root)
            assert ca.orders() == 1
            wait_for(lambda: proxy.renewal_info_requests >= 2 or None, 15, "ARI asked")
            time.sleep(1)
            assert ca.orders() == 1  # the window is ahead: nothing ordered
            # an incident: the CA moves the window into the next seconds
            now = time.time()
            state.update(start=now + 3, end=now + 13)
            incident["id"] = cert_id(x509.load_der_x509_certificate(old.der))
            wait_for(lambda: ca.orders() >= 2 or None, 20, "the renewal ordered")
            ordered_at = time.time()
            print(
                f"renewal ordered {ordered_at - state['start']:+.1f} s from the window's start"
                f" (window {state['end'] - state['start']:.0f} s, polled every 0.1 s)"
            )
            # within the window (give or take a tick and the order's own seconds)
            assert state["start"] - 0.5 <= ordered_at <= state["end"] + 2.0
            wait_for(lambda: issued(stack, name, root).serial != old.serial or None, 10, "swapped")
            assert proxy.new_orders[-1].get("replaces") == cert_id(
                x509.load_der_x509_certificate(old.der)
            )
            assert ca.orders() == 2


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
