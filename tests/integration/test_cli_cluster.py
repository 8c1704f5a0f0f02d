"""The ``certagent`` command line against a Redis Cluster: init, cert add, ls, show, rotate, rm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from certagent.testing import PKI, free_port
from certagent.testing.redisha import ClusterSet

pytestmark = pytest.mark.integration


def certagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "certagent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cert_commands_work_on_a_redis_cluster(
    cluster_set: ClusterSet, pki: PKI, tmp_path: Path
) -> None:
    cluster_set.flushall()
    chain, key = pki.chain_and_key("cli.cluster.test", "www.cli.cluster.test")
    (tmp_path / "chain.pem").write_bytes(chain)
    (tmp_path / "key.pem").write_bytes(key)
    node = tmp_path / "node"
    made = certagent(
        "init", str(node), "--store", cluster_set.url, "--bind", f"127.0.0.1:{free_port()}"
    )
    assert made.returncode == 0, made.stderr
    cfg = ("--config", str(node / "certagent.toml"))
    files = ("--cert", str(tmp_path / "chain.pem"), "--key", str(tmp_path / "key.pem"))

    added = certagent("cert", "add", *cfg, *files)
    assert added.returncode == 0, added.stderr
    cert_id = added.stdout.split()[1]
    listed = certagent("cert", "ls", *cfg)
    assert listed.returncode == 0 and cert_id in listed.stdout and "1 certificate" in listed.stderr
    shown = certagent("cert", "show", *cfg, cert_id)
    assert shown.returncode == 0 and "www.cli.cluster.test" in shown.stdout
    again = certagent("cert", "add", *cfg, *files)  # the same certificate: refused, nothing lost
    assert again.returncode != 0 and "CROSSSLOT" not in again.stderr + again.stdout
    rotated = certagent("cert", "rotate", *cfg, cert_id, *files)
    assert rotated.returncode == 0 and "version 2" in rotated.stdout, rotated.stderr
    removed = certagent("cert", "rm", *cfg, cert_id)
    assert removed.returncode == 0, removed.stderr
    empty = certagent("cert", "ls", *cfg)
    assert empty.returncode == 0 and "0 certificates" in empty.stderr
    for run in (made, added, listed, shown, again, rotated, removed, empty):
        assert "CROSSSLOT" not in run.stdout + run.stderr and "MOVED" not in run.stderr
