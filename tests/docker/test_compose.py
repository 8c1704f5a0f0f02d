"""The docker-compose demo, built and run as a user would (README, "With Docker").

One project per Compose client found (v1's ``docker-compose``; v2, the ``docker compose``
plugin or ``$CERTAGENT_TEST_COMPOSE_V2``, its binary on its own): the images are built
from the one base (``scripts/docker-base.sh``), ``up -d`` brings Redis, pebble, two nodes
and the seeding container up, and the tests check what the README promises, through the
ports published on 127.0.0.1 only. The last test takes the project down with ``down -v``
and finds no container, network or volume of it left.

Run by ``scripts/test.sh``'s Docker step (``scripts/docker-test.sh`` sets
``CERTAGENT_DOCKER_STEP=1``; the engine comes from ``scripts/docker-engine.sh``), never by
the version matrix's pytest runs.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from certagent.testing import PKI, wait_for
from certagent.testing.resume import ResumingClient
from certagent.testing.tlsclient import CertInfo, handshake
from tests.docker.compose import ROOT, ComposeProject, client_version, docker

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

NODES = ("node1", "node2")
SEEDED = ("www.demo.test", "shop.demo.test", "api.demo.test")
BASE = "debian:13-slim"
#: run by the image's Python: what is installed, and what lock markers are evaluated against
#: (packaging.markers.default_environment's keys)
_INSTALLED = """
import importlib.metadata, json, os, platform, sys
i = sys.implementation.version
print(json.dumps([
    {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()},
    {"implementation_name": sys.implementation.name,
     "implementation_version": f"{i.major}.{i.minor}.{i.micro}",
     "os_name": os.name, "platform_machine": platform.machine(),
     "platform_release": platform.release(), "platform_system": platform.system(),
     "platform_version": platform.version(),
     "python_full_version": platform.python_version(),
     "platform_python_implementation": platform.python_implementation(),
     "python_version": ".".join(platform.python_version_tuple()[:2]),
     "sys_platform": sys.platform},
]))
"""
#: a first connection waits at most the node's hold (10 s with issuance on)
FIRST_CONNECTION_TIMEOUT = 20.0


def clients() -> list[tuple[str, tuple[str, ...]]]:
    """The Compose clients here, one of each kind: ("v1", command), ("v2", command)."""
    if os.environ.get("CERTAGENT_DOCKER_STEP") != "1":
        return [("v1", ("docker-compose",))]  # skipped anyway (conftest.py): ask nothing
    candidates: list[tuple[str, ...]] = [("docker-compose",), ("docker", "compose")]
    if os.environ.get("CERTAGENT_TEST_COMPOSE_V2"):
        candidates.append((os.environ["CERTAGENT_TEST_COMPOSE_V2"],))
    found: dict[str, tuple[str, ...]] = {}
    for command in candidates:
        version = client_version(command)
        if version is not None:
            found.setdefault("v1" if re.search(r"version 1\.", version) else "v2", command)
    return sorted(found.items()) or [("v1", ("docker-compose",))]


@pytest.fixture(scope="module", params=clients(), ids=lambda client: client[0])
def project(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComposeProject]:
    kind: str = request.param[0]
    command: tuple[str, ...] = request.param[1]
    if client_version(command) is None:
        pytest.skip(f"no Compose client ({' '.join(command)}): apt-get install docker-compose")
    base = subprocess.run(
        ["bash", str(ROOT / "scripts" / "docker-base.sh")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert base.returncode == 0, base.stderr
    project = ComposeProject(command, tmp_path_factory.mktemp("compose"), f"test-{kind}")
    print(f"compose: {client_version(command)}; project {project.name}; {base.stderr.strip()}")
    try:
        project.compose("build", timeout=900)
        project.compose("up", "-d", timeout=300)
        project.wait(
            "healthy nodes", lambda: all(project.health(node) == "healthy" for node in NODES), 120
        )
        project.wait("the seed's end", lambda: project.state("seed")["Status"] == "exited", 120)
        yield project
    finally:
        print(f"compose: seconds per command {project.timings}")
        if any(project.leftovers().values()):
            project.compose("down", "-v", "--remove-orphans", check=False)


@pytest.fixture(scope="module")
def roots(project: ComposeProject, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's ``docker-compose run --rm -T seed roots``: demo CA + pebble's root."""
    pem = project.compose("run", "--rm", "-T", "seed", "roots")
    assert pem.count("-----BEGIN CERTIFICATE-----") == 2, pem
    path = tmp_path_factory.mktemp("roots") / "demo-roots.pem"
    path.write_text(pem)
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI.create(tmp_path_factory.mktemp("pki") / "ca.pem", "certagent compose test CA")


def _tls_ports(project: ComposeProject) -> dict[str, int]:
    return {"node1": project.ports["NODE1_TLS"], "node2": project.ports["NODE2_TLS"]}


def test_every_image_builds_on_the_one_base(project: ComposeProject) -> None:
    base_layer = json.loads(docker("image", "inspect", BASE))[0]["RootFS"]["Layers"][0]
    for service in ("redis", "pebble", "node1", "node2", "seed"):
        image = project.inspect(service)["Image"]
        assert isinstance(image, str)
        layers = json.loads(docker("image", "inspect", image))[0]["RootFS"]["Layers"]
        assert layers[0] == base_layer, f"{service}'s image is not built on {BASE}"


def test_both_nodes_run_haproxy_3_as_an_unprivileged_user_on_a_read_only_root(
    project: ComposeProject,
) -> None:
    for node in NODES:
        assert project.health(node) == "healthy"
        info = project.inspect(node)
        host = info["HostConfig"]
        assert isinstance(host, dict) and host["ReadonlyRootfs"] is True
        container = project.container(node)
        version = docker("exec", container, "haproxy", "-v").splitlines()[0]
        found = re.match(r"HAProxy version (\d+)\.(\d+)", version)
        assert found is not None and (int(found[1]), int(found[2])) >= (3, 0), version
        # every process of the container (entrypoint, HAProxy master and worker, the agent)
        top = docker("top", container, "-eo", "pid,uid,comm").splitlines()[1:]
        processes = [line.split() for line in top]
        assert {uid for _, uid, _ in processes} == {"10001"}, top
        assert {"haproxy", "certagent"} <= {comm for _, _, comm in processes}, top
        touched = subprocess.run(
            ["docker", "exec", container, "touch", "/etc/certagent-was-here"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert touched.returncode != 0 and "Read-only file system" in touched.stderr


def test_the_node_image_holds_no_pip_compiler_or_source_tree(project: ComposeProject) -> None:
    container = project.container("node1")
    found = docker(
        "exec", container, "sh", "-c",
        "for p in pip pip3 gcc cc c++ make git; do command -v $p; done;"
        " ls -d /src /wheels /staging /opt/build /root/.cache /opt/certagent/bin/pip*"
        " /opt/certagent/lib/python3*/site-packages/pip 2>/dev/null; true",
    )  # fmt: skip
    assert found == "", found
    # and it runs what the lock pins for its Python: certagent's dependencies, no more
    installed, environment = json.loads(
        docker("exec", container, "/opt/certagent/bin/python", "-c", _INSTALLED)
    )
    locked = {}
    for name, version, marker in re.findall(
        r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\\n]+?))?\s*\\?$",  # as lockcheck
        (ROOT / "requirements" / "runtime.txt").read_text(),
        re.MULTILINE,
    ):
        if not marker or Marker(marker).evaluate(environment):
            locked[canonicalize_name(name)] = version
    assert len(locked) > 10
    installed.pop("certagent")
    assert {canonicalize_name(n): v for n, v in installed.items()} == locked


def test_the_seeded_certificates_are_served_verified_by_both_nodes(
    project: ComposeProject, roots: Path
) -> None:
    seed = project.state("seed")
    assert seed["ExitCode"] == 0, project.log_tails()
    for name in SEEDED:
        serials = {
            node: handshake(port, name, roots).serial for node, port in _tls_ports(project).items()
        }
        assert len(set(serials.values())) == 1, serials


def _upload_then_served_by_both(
    project: ComposeProject, pki: PKI, name: str, api: str
) -> list[CertInfo]:
    """``POST /v1/certificates`` through ``api`` (NODE1_API / NODE2_API), then each node's
    verified handshake for ``name`` (bounded: the other node learns it from the store)."""
    chain, key = pki.chain_and_key(name)
    request = urllib.request.Request(
        f"http://127.0.0.1:{project.ports[api]}/v1/certificates",
        data=json.dumps({"chain": chain.decode(), "key": key.decode()}).encode(),
        headers={"Authorization": f"Bearer {project.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 201
    return [
        wait_for(functools.partial(handshake, port, name, pki.cafile), 30, f"{name} on {port}")
        for port in _tls_ports(project).values()
    ]


def test_an_upload_through_node1_is_served_verified_by_both(
    project: ComposeProject, pki: PKI
) -> None:
    name = f"upload-{secrets.token_hex(3)}.compose.test"
    served = _upload_then_served_by_both(project, pki, name, "NODE1_API")
    assert [info.subject_cn for info in served] == [name, name]


@pytest.mark.parametrize(
    "version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["TLSv1.2", "TLSv1.3"]
)
def test_a_session_from_node1_resumes_on_node2(
    project: ComposeProject, pki: PKI, version: ssl.TLSVersion
) -> None:
    name = f"resume-{secrets.token_hex(3)}.compose.test"
    _upload_then_served_by_both(project, pki, name, "NODE2_API")
    # both HAProxys hold the fleet's ring (certagent status, inside each node)
    project.wait(
        "the fleet's ticket keys in both HAProxys",
        lambda: len(held := {_tickets(project, node) for node in NODES}) == 1 and None not in held,
        30,
    )
    ports = _tls_ports(project)
    # node1 gives a session; node2 resumes it, and node1 the one node2 gave, and so on
    client = ResumingClient([ports["node1"], ports["node2"]], name, str(pki.cafile), version)
    report = client.run(4)
    assert report.errors == []
    assert report.resumed == 3, f"full handshakes after the first: {report.full}"


def _tickets(project: ComposeProject, node: str) -> int | None:
    """The ticket-key generation ``node``'s HAProxy holds, or None (not pushed yet)."""
    status = json.loads(
        docker("exec", project.container(node),
               "certagent", "status", "--json", "--config", "/etc/certagent/certagent.toml")
    )  # fmt: skip
    tickets = status.get("tickets") or {}
    return tickets.get("generation") if tickets.get("in_haproxy") else None


def test_a_new_name_gets_a_certificate_from_pebble_on_its_first_connection(
    project: ComposeProject, roots: Path
) -> None:
    name = f"t{secrets.token_hex(4)}.ondemand.demo.test"  # in no store, allowed by the suffix
    ports = _tls_ports(project)
    first = handshake(ports["node2"], name, roots, timeout=FIRST_CONNECTION_TIMEOUT)
    assert first.issuer_cn is not None and first.issuer_cn.startswith("Pebble Intermediate CA")
    assert name in first.san
    # stored for the fleet: node1 serves the same certificate without ordering another
    again = wait_for(
        functools.partial(handshake, ports["node1"], name, roots), 30, f"{name} on node1"
    )
    assert again.serial == first.serial
    seed_log = docker("logs", project.container("seed"))
    assert "issued on demand by Pebble Intermediate CA" in seed_log, seed_log


def test_no_log_holds_the_api_token(project: ComposeProject) -> None:
    logs = project.compose("logs", "--no-color")
    assert "REST API on 0.0.0.0:8089 for the tokens named: demo" in logs
    assert project.token not in logs


def test_down_v_leaves_no_container_network_or_volume(project: ComposeProject) -> None:
    before = project.leftovers()
    assert len(before["containers"]) == 5 and before["networks"] and len(before["volumes"]) == 6
    project.compose("down", "-v", timeout=180)
    assert project.leftovers() == {"containers": [], "networks": [], "volumes": []}
