"""Rolling upgrades (issue 28): an earlier release and HEAD on one Redis, then finalize.

A node of 003bece (records as hashes, no version announced) or of 0.2.0 (packed
records, data keys announced without a version), built from this checkout's git
history (:mod:`certagent.testing.builds`), and a HEAD node share one Redis, each with
its own HAProxy 2.6.  Through the whole sequence -- HEAD joins, both sides write (CLI
add, REST upload, rotation), HEAD issues and renews a certificate from pebble, the
earlier node is upgraded in place (same config, same HAProxy, then an HAProxy reload),
``fleet finalize``, a restart of every node -- a prober does verified handshakes for
every stored name on both nodes, and must see no failure and no default certificate.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography import x509

from certagent.api import add_token
from certagent.testing import PKI, RedisFixture, Stack, tlsclient, wait_for
from certagent.testing.askendpoint import AskEndpoint
from certagent.testing.builds import AgentBuild, BuildUnavailable, build_agent
from certagent.testing.pebble import Pebble
from certagent.testing.processes import certagent_argv, free_port
from tests.integration.conftest import StackFactory
from tests.integration.pebblerun import running
from tests.integration.test_acme_ondemand import acme_args
from tests.integration.test_acme_renewal import RENEW

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

VALIDITY = 30  # s: pebble's certificates, renewed at half their life by the HEAD node
#: one certificate uses this much of Redis's memory at most in format 2 (issue 21 measured
#: 1,000-1,900 bytes with realistic leaves)
BYTES_PER_CERTIFICATE = 2_000


@pytest.fixture(scope="module")
def earlier_builds() -> dict[str, AgentBuild]:
    try:
        return {label: build_agent(label) for label in ("003bece", "0.2.0")}
    except BuildUnavailable as exc:
        pytest.skip(f"earlier releases cannot be built here: {exc}")


@pytest.fixture
def pebble(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pebble]:
    with running(Pebble(tmp_path / "pebble", validity=VALIDITY), request) as ca:
        yield ca


class Prober:
    """A thread per node doing verified handshakes for every name it is given, without
    pause; counts failures and default certificates, and the serial each node serves."""

    def __init__(self, nodes: list[Stack], roots: Path) -> None:
        self.nodes = nodes
        self.context = tlsclient.client_context(roots)
        self.names: list[str] = []
        self.ok = 0
        self.failures: list[str] = []
        self.defaults = 0
        self.serving: dict[tuple[int, str], int] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(nodes))
        ]

    def add(self, name: str) -> None:
        self.names = [*self.names, name]

    def _run(self, index: int) -> None:
        stack = self.nodes[index]
        while not self._stop.is_set():
            for name in self.names:
                try:
                    info = tlsclient.handshake(stack.port, name, context=self.context)
                except OSError as exc:  # ssl.SSLError is an OSError
                    self.failures.append(f"{time.strftime('%X')} node {index} {name}: {exc!r}")
                    self.defaults += tlsclient.raw_hello(stack.port, name.encode()) == (
                        stack.default_der
                    )
                    continue
                self.ok += 1
                self.serving[(index, name)] = info.serial
            self._stop.wait(0.05)

    def __enter__(self) -> Prober:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def served_by_both(
    nodes: list[Stack], name: str, context: ssl.SSLContext, serial: int | None
) -> float:
    """Seconds until both nodes serve ``name`` verified (with ``serial`` if given)."""
    started = time.monotonic()

    def both() -> bool | None:
        for node in nodes:
            try:
                info = tlsclient.handshake(node.port, name, context=context, timeout=2.0)
            except OSError:
                return None
            if serial is not None and info.serial != serial:
                return None
        return True

    wait_for(both, 5.0, f"both nodes to serve {name} verified")
    return time.monotonic() - started


def upload(bind: str, token: str, pki: PKI, host: str) -> str:
    chain, key = pki.chain_and_key(host)
    request = urllib.request.Request(
        f"http://{bind}/v1/certificates",
        data=chain + key,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-pem-file"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 201
        return str(json.loads(reply.read())["id"])


def cli_add(node: Stack, pki: PKI, host: str, tmp_path: Path) -> str:
    pem = tmp_path / f"{host}.pem"
    pem.write_bytes(b"".join(pki.chain_and_key(host)))
    done = node.command("cert", "add", "--cert", str(pem), "--json")
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["id"])


def cli_rotate(node: Stack, pki: PKI, cert_id: str, host: str, tmp_path: Path) -> int:
    pem = tmp_path / f"{host}.rotated.pem"
    pem.write_bytes(b"".join(pki.chain_and_key(host)))
    done = node.command("cert", "rotate", cert_id, "--cert", str(pem))
    assert done.returncode == 0, done.stderr
    return int(x509.load_pem_x509_certificate(pem.read_bytes()).serial_number)


def fleet_status(node: Stack) -> dict[str, object]:
    done = node.command("fleet", "status", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.timeout(480)  # 60-90 s on a quiet machine; a renewal and 2,000 imports inside
@pytest.mark.parametrize("earlier", ["003bece", "0.2.0"])
def test_a_fleet_upgraded_one_node_at_a_time_serves_every_certificate_throughout(
    make_stack: StackFactory,
    redis_store: RedisFixture,
    pki: PKI,
    pebble: Pebble,
    earlier_builds: dict[str, AgentBuild],
    earlier: str,
    tmp_path: Path,
) -> None:
    roots = tmp_path / "roots.pem"
    roots.write_bytes(pki.cafile.read_bytes() + pebble.roots_pem())
    context = tlsclient.client_context(roots)
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "upgrade")
    binds = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    api = [{"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": b} for b in binds]
    raw = redis.Redis.from_url(redis_store.url)
    events: list[str] = []

    def step(what: str) -> None:
        events.append(f"{time.strftime('%X')} {what}")

    # the earlier release runs alone first, with certificates of its own
    old = make_stack(redis_store.url, agent_cmd=earlier_builds[earlier].argv, env=api[0])
    seeded = [f"seed{i}.upgrade.test" for i in range(3)]
    for host in seeded:
        cli_add(old, pki, host, tmp_path)
    with AskEndpoint(allow=lambda name: name.endswith(".acme.upgrade.test")) as ask:
        head = make_stack(
            redis_store.url,
            init_args=acme_args(pebble, ask=ask.url),
            port=pebble.tls_port,
            env={**RENEW, **api[1]},
        )
        nodes = [old, head]
        step(f"HEAD joined {earlier}")
        with Prober(nodes, roots) as prober:
            for host in seeded:
                served_by_both(nodes, host, context, None)
                prober.add(host)

            # writes from either side, each served verified by both nodes within a second
            writes = {
                "old-cli.upgrade.test": lambda h: cli_add(old, pki, h, tmp_path),
                "head-cli.upgrade.test": lambda h: cli_add(head, pki, h, tmp_path),
                "old-api.upgrade.test": lambda h: upload(binds[0], token, pki, h),
                "head-api.upgrade.test": lambda h: upload(binds[1], token, pki, h),
            }
            ids = {}
            for host, write in writes.items():
                ids[host] = write(host)
                took = served_by_both(nodes, host, context, None)
                step(f"{host}: served by both after {took:.2f} s")
                assert took <= 1.0, events
                prober.add(host)
            for writer, host in ((head, "old-cli.upgrade.test"), (old, "head-cli.upgrade.test")):
                serial = cli_rotate(writer, pki, ids[host], host, tmp_path)
                took = served_by_both(nodes, host, context, serial)
                step(f"{host} rotated: served by both after {took:.2f} s")
                assert took <= 1.0, events

            # an ACME issuance by the HEAD node (its first connection), then its renewal
            issued_host = "i.acme.upgrade.test"
            first = tlsclient.handshake(head.port, issued_host, context=context, timeout=15)
            took = served_by_both(nodes, issued_host, context, first.serial)
            step(f"{issued_host} issued: served by both after {took:.2f} s")
            assert took <= 1.0, events
            prober.add(issued_host)

            def renewed() -> int | None:
                serial = prober.serving.get((1, issued_host))
                return serial if serial not in (None, first.serial) else None

            renewed_serial = wait_for(renewed, VALIDITY, "the HEAD node to renew it")
            took = served_by_both(nodes, issued_host, context, renewed_serial)
            step(f"{issued_host} renewed: served by both after {took:.2f} s")
            assert took <= 1.0, events

            # what the board shows; a 0.2.0 node holds finalize back, and is named
            status = fleet_status(head)
            listed = {n["node"]: n for n in status["nodes"]}  # type: ignore[attr-defined]
            versions = sorted(str(n["version"]) for n in listed.values())
            step(f"fleet status: {versions}, format {status['format']}")
            assert status["format"]["number"] == 1  # type: ignore[index]
            if earlier == "0.2.0":
                assert versions == ["0.2.0", "0.3.0"]
                refused = head.command("fleet", "finalize")
                assert refused.returncode == 1
                unversioned = [n for n, v in listed.items() if not v["version_announced"]]
                assert unversioned and unversioned[0] in refused.stderr, refused.stderr
                assert "0.2.0" in refused.stderr
            else:
                assert versions == ["0.3.0"]  # 003bece cannot be seen

            # the earlier node upgraded in place: its own certagent.toml, haproxy.cfg and Lua,
            # its HAProxy kept running, reloaded later at its own moment
            old.stop_agent()
            old.agent_cmd = None
            old.start_agent()
            step("the earlier node's agent now runs HEAD")
            old.reload_haproxy()
            step("its HAProxy reloaded")
            # then its haproxy.cfg and Lua brought up to this release, and HAProxy reloaded
            upgraded = subprocess.run(
                [*certagent_argv(), "init", str(old.directory), "--upgrade"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
            step(f"init --upgrade: {upgraded.stdout.splitlines()[-3:]}")
            old.reload_haproxy()
            step("its HAProxy reloaded with the upgraded files")
            check = old.command("check")
            assert check.returncode == 0, check.stdout + check.stderr
            status = fleet_status(head)
            assert sorted(n["version"] for n in status["nodes"]) == ["0.3.0", "0.3.0"]  # type: ignore[attr-defined]

            finalized = head.command("fleet", "finalize", "--json")
            assert finalized.returncode == 0, finalized.stderr
            report = json.loads(finalized.stdout)
            step(f"finalized: {report}")
            assert report["after"]["number"] == 2 and report["migration"]["left"] == 0
            for key in raw.scan_iter(match="certagent:cert:*"):
                assert raw.type(key) == b"string", key  # every record rewritten

            after = "after.upgrade.test"
            record = cli_add(head, pki, after, tmp_path)
            assert raw.type(f"certagent:cert:{record}") == b"string"
            took = served_by_both(nodes, after, context, None)
            assert took <= 1.0, events
            prober.add(after)

            # memory per certificate in format 2, as the bench of a million measured it
            batch = tmp_path / "batch"
            batch.mkdir()
            for i in range(2000):
                chain, key = pki.chain_and_key(f"m{i}.memory.upgrade.test")
                (batch / f"m{i}.pem").write_bytes(chain + key)
            before = int(raw.info("memory")["used_memory"])
            imported = head.command("cert", "import", str(batch))
            assert imported.returncode == 0, imported.stderr
            per_cert = (int(raw.info("memory")["used_memory"]) - before) / 2000
            step(f"used_memory per certificate after finalize: {per_cert:.0f} bytes")
            assert per_cert <= BYTES_PER_CERTIFICATE, events

            # every node restarted, one after the other
            for node in nodes:
                node.stop_agent()
                node.start_agent()
            step("every agent restarted")
            for host in prober.names:
                served_by_both(nodes, host, context, None)
            time.sleep(1.0)
    print("\n".join(events))
    print(f"prober: {prober.ok} verified handshakes, {len(prober.failures)} failed")
    assert prober.failures == [] and prober.defaults == 0, prober.failures[:10]
    assert prober.ok > 100
