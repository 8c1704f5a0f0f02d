"""The docker-compose entrypoint, run outside Docker (no engine here): init, API token, serve.

The token comes from a secret file, as Compose mounts it at /run/secrets/api_token; no log line
may hold it (or its hash).  The image's HEALTHCHECK script runs against the same nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from certagent.api.auth import hash_token
from certagent.testing import free_port, wait_for
from certagent.testing.tlsclient import handshake
from tests.integration.conftest import PKI, RedisFixture

pytestmark = pytest.mark.integration
DOCKER = Path(__file__).resolve().parents[2] / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
HEALTHCHECK = DOCKER / "healthcheck.sh"
SECRET = "demo-" + "0123456789abcdef" * 4  # what `openssl rand -hex 32` gives, plus a prefix


class Node:
    """One run of the entrypoint (HAProxy + agent), as one container of the compose file."""

    def __init__(
        self, redis_url: str, tmp_path: Path, name: str, fleet_key: Path, secret: Path | None
    ) -> None:
        self.conf = Path(tempfile.mkdtemp(prefix="ca-dk-"))
        self.tls_port, self.api_port = free_port(), free_port()
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "CERTAGENT_CONF_DIR": str(self.conf),
            "CERTAGENT_BIND": f"127.0.0.1:{self.tls_port}",
            "CERTAGENT_STORE": redis_url,
            "CERTAGENT_RUN_DIR": str(self.conf / "run"),
            "CERTAGENT_API_TOKEN_NAME": "demo",
            "CERTAGENT_API_BIND": f"127.0.0.1:{self.api_port}",
            "CERTAGENT_FLEET_KEY": str(fleet_key),
        }
        if secret is not None:
            self.env["CERTAGENT_API_TOKEN_FILE"] = str(secret)
        self.log = tmp_path / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", str(ENTRYPOINT)], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.api_port}/readyz"
        wait_for(lambda: b"ready" in _get(url), 20, "readyz")

    def healthcheck(self) -> subprocess.CompletedProcess[str]:
        """The image's HEALTHCHECK command, in this node's environment."""
        return subprocess.run(
            [str(HEALTHCHECK)], env=self.env, capture_output=True, text=True, timeout=30
        )

    def stop(self) -> None:
        """SIGTERM the entrypoint's process group (HAProxy and the agent with it); wait."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(5)
        time.sleep(0.2)

    def _signal(self, signo: int) -> None:
        try:
            os.killpg(self.proc.pid, signo)
        except ProcessLookupError:
            assert self.proc.poll() is not None  # the whole group has exited already


@pytest.fixture
def start_node(redis_store: RedisFixture, tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """``start_node(name, secret)``: an entrypoint run; all are stopped and removed after."""
    fleet_key = tmp_path / "fleet" / "data.key"
    nodes: list[Node] = []

    def start(name: str, secret: Path | None) -> Node:
        nodes.append(Node(redis_store.url, tmp_path, name, fleet_key, secret))
        return nodes[-1]

    try:
        yield start
    finally:
        for node in nodes:
            node.stop()
            shutil.rmtree(node.conf, ignore_errors=True)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """The API token as Compose mounts a secret file: one line, readable by the user."""
    path = tmp_path / "secrets" / "api_token"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    path.chmod(0o644)
    return path


@pytest.mark.timeout(90)
def test_entrypoint_runs_a_fleet_of_two_nodes_with_api(
    start_node: Callable[..., Node], pki: PKI, tmp_path: Path, secret: Path
) -> None:
    nodes = [start_node(f"node{i}", secret) for i in (1, 2)]
    for node in nodes:
        node.wait_ready()
    # one data key for both, made once by whichever started first
    kid = (tmp_path / "fleet" / "data.key").read_text().split(":", 1)[0]
    for node in nodes:
        assert (node.conf / "data.key").read_text().split(":", 1)[0] == kid
        tokens = node.conf / "tokens"
        assert tokens.read_text().splitlines()[-1] == f"demo:{hash_token(SECRET)}"
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    chain, key = pki.chain_and_key("docker.example.test")
    req = urllib.request.Request(
        f"http://127.0.0.1:{nodes[0].api_port}/v1/certificates",
        data=json.dumps({"chain": chain.decode(), "key": key.decode()}).encode(),
        headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as reply:
        assert reply.status == 201
    for node in nodes:  # uploaded through node 1, served by both
        info = handshake(node.tls_port, "docker.example.test", pki.cafile)
        assert info.subject_cn == "docker.example.test"
    health = nodes[1].healthcheck()
    assert health.returncode == 0, health.stdout + health.stderr
    for node in nodes:
        node.stop()
        assert node.proc.returncode is not None
    health = nodes[1].healthcheck()  # stopped: /readyz does not answer
    assert health.returncode == 1 and "/readyz: " in health.stderr
    for node in nodes:
        log = node.log.read_text()
        assert "REST API on 127.0.0.1:" in log and "for the tokens named: demo" in log
        assert SECRET not in log and hash_token(SECRET) not in log
        assert "cat_" not in log  # no token was made


@pytest.mark.timeout(60)
def test_without_a_token_the_api_stays_off_and_nothing_is_printed(
    start_node: Callable[..., Node],
) -> None:
    node = start_node("node", None)
    wait_for(lambda: "REST API off: no token" in node.log.read_text(), 20, "the API-off line")
    # the HEALTHCHECK falls back to `certagent check` (HAProxy, the store, the agent)
    wait_for(lambda: node.healthcheck().returncode == 0, 20, "the health check to pass")
    assert not (node.conf / "tokens").exists()
    assert _get(f"http://127.0.0.1:{node.api_port}/readyz") == b""  # nothing listens
    node.stop()
    log = node.log.read_text()
    assert "cat_" not in log and "shown once" not in log


def test_an_unreadable_secret_stops_the_container_at_once(
    start_node: Callable[..., Node], tmp_path: Path
) -> None:
    absent = tmp_path / "secrets" / "api_token"
    node = start_node("node", absent)
    assert node.proc.wait(15) == 1
    assert not (node.conf / "certagent.toml").exists()  # it failed before init
    assert f"CERTAGENT_API_TOKEN_FILE={absent} is missing or not readable" in node.log.read_text()


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bytes(reply.read())
    except OSError:
        return b""
