"""The docker-compose entrypoint, run outside Docker (no engine here): init, API token, serve."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.conftest import PKI, RedisFixture
from tests.stack import free_port, wait_for
from tests.tlsclient import handshake

pytestmark = pytest.mark.integration
ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"


@pytest.mark.timeout(60)
def test_entrypoint_runs_haproxy_and_agent_with_api(
    redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    conf = Path(tempfile.mkdtemp(prefix="ca-dk-"))
    tls_port, api_port = free_port(), free_port()
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "CERTAGENT_CONF_DIR": str(conf),
        "CERTAGENT_BIND": f"127.0.0.1:{tls_port}",
        "CERTAGENT_STORE": redis_store.url,
        "CERTAGENT_RUN_DIR": str(conf / "run"),
        "CERTAGENT_API_TOKEN_NAME": "demo",
        "CERTAGENT_API_BIND": f"127.0.0.1:{api_port}",
    }
    log = tmp_path / "entrypoint.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(ENTRYPOINT)], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        token = wait_for(
            lambda: (m := re.search(r"shown once\): (\S+)", log.read_text())) and m.group(1),
            20,
            "the API token",
        )
        wait_for(lambda: b"ready" in _get(f"http://127.0.0.1:{api_port}/readyz"), 20, "readyz")
        chain, key = pki.chain_and_key("docker.example.test")
        req = urllib.request.Request(
            f"http://127.0.0.1:{api_port}/v1/certificates",
            data=json.dumps({"chain": chain.decode(), "key": key.decode()}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as reply:
            assert reply.status == 201
        info = handshake(tls_port, "docker.example.test", pki.cafile)
        assert info.subject_cn == "docker.example.test"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        time.sleep(0.2)
        shutil.rmtree(conf, ignore_errors=True)
    assert proc.returncode is not None


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bytes(reply.read())
    except OSError:
        return b""
