"""The directory store with real files, inotify, HAProxy and agent processes (small sizes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from certagent.testing import PKI, stop_process, wait_for
from certagent.testing.certbot import make_lineages, renew, write_lineage
from certagent.testing.processes import spawn
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

SITE = "site.example.test"


def certbot_root(tmp_path: Path) -> Path:
    root = tmp_path / "letsencrypt"
    root.mkdir()
    return root


def context_switches(pid: int) -> int:
    """Context switches of every thread of ``pid`` so far: how often it woke up."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if "ctxt_switches:" in line:
                total += int(line.split()[1])
    return total


def test_certbot_lineage_serves_every_san(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    root = certbot_root(tmp_path)
    write_lineage(root, SITE, *pki.chain_and_key(SITE, f"www.{SITE}", f"*.api.{SITE}"))
    stack = make_stack(root.as_uri(), capacity=10)

    # www. first: no file or directory is named after it, the apex was never asked for
    names = (SITE, f"www.{SITE}", f"*.api.{SITE}")
    for host in (f"www.{SITE}", SITE, f"v1.api.{SITE}"):
        assert stack.handshake(host).san == names, host
    assert stack.hello(f"other.{SITE}".encode()) == stack.default_der
    status = stack.status(slots=True)
    assert status["loader"]["loads"] == 1  # one slot serves the lineage's three names
    assert status["slots"][0]["certificate"] == f"live/{SITE}/fullchain.pem"
    assert sorted(status["slots"][0]["hosts"]) == sorted([SITE, f"www.{SITE}", f"v1.api.{SITE}"])
    assert "watching with inotify" in stack.agent_log()


def test_certbot_renewal_by_symlink_switch_is_served_live(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    root = certbot_root(tmp_path)
    write_lineage(root, SITE, *pki.chain_and_key(SITE, f"www.{SITE}"))
    stack = make_stack(root.as_uri(), capacity=10)
    before = stack.handshake(f"www.{SITE}")
    pid = stack.worker_pid()

    # certbot renew: new archive/ files, then the live/ links re-pointed one by one;
    # the renewed certificate also names a new host
    chain, key = pki.chain_and_key(SITE, f"www.{SITE}", f"new.{SITE}")
    started = time.monotonic()
    assert renew(root, SITE, chain, key) == 2
    wait_for(
        lambda: stack.handshake(f"www.{SITE}").serial != before.serial, 10, "the renewed serial"
    )
    took = time.monotonic() - started
    print(f"renewal served after {took:.3f}s")
    assert took < 3
    renewed = stack.handshake(f"www.{SITE}")
    assert renewed.san == (SITE, f"www.{SITE}", f"new.{SITE}")
    assert stack.handshake(f"new.{SITE}").serial == renewed.serial
    assert stack.worker_pid() == pid  # in place: no reload
    assert stack.status()["live"]["rotated"] == 1


def test_a_fifo_at_a_certificate_path_fails_fast(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    root = tmp_path / "certs"
    root.mkdir()
    os.mkfifo(root / "x.example.test.pem")  # nobody ever writes to it: open() would hang
    (root / "y.example.test.pem").write_bytes(pki.combined_pem("y.example.test"))
    stack = make_stack(root.as_uri(), capacity=10)

    started = time.monotonic()
    assert stack.hello(b"x.example.test") == stack.default_der  # the fallback, at once
    assert time.monotonic() - started < 2
    assert stack.handshake("y.example.test").san == ("y.example.test",)  # others still served
    assert "x.example.test.pem is a FIFO, not a regular file" in stack.agent_log()
    assert stack.status()["ensure"]["unknown"] == 1


def test_the_agent_at_rest_does_not_wake_up(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    root = certbot_root(tmp_path)
    assert len(list(make_lineages(pki.ca, root, 200))) == 200
    stack = make_stack(root.as_uri(), capacity=10)
    wait_for(lambda: "indexed 200 certbot lineages" in stack.agent_log(), 30, "the index")
    assert stack.handshake("www.s000042.le.test").san == ("s000042.le.test", "www.s000042.le.test")
    assert stack.agent is not None
    time.sleep(1)
    before = context_switches(stack.agent.pid)
    time.sleep(3)
    woke = context_switches(stack.agent.pid) - before
    # The old store rescanned every 0.2 s (15 wake-ups here); inotify wakes it only for
    # changes, and the live updater waits 30 s per call: at most that one.
    assert woke <= 2, woke


HUNG_AGENT = """
import sys, threading
from certagent.store.directory import _files
from certagent.cli import main

original = _files.read_regular

def read(path, label, limit=_files.MAX_FILE_SIZE):
    if path.name.startswith("hung"):  # a hung filesystem: this read never returns
        with open(sys.argv[2], "a") as marks:
            marks.write(path.name + "\\n")
        threading.Event().wait()
    return original(path, label, limit)

_files.read_regular = read
sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def test_the_agent_exits_within_5s_on_sigterm_with_8_reads_stuck(
    make_stack: StackFactory, pki: PKI, tmp_path: Path
) -> None:
    root = tmp_path / "certs"
    root.mkdir()
    hosts = [f"hung{i}.example.test" for i in range(8)]
    for host in hosts:
        (root / f"{host}.pem").write_bytes(pki.combined_pem(host))
    stack = make_stack(root.as_uri(), capacity=10, start=False)  # no HAProxy needed
    marks = tmp_path / "stuck.txt"
    marks.touch()
    agent = spawn(
        [sys.executable, "-c", HUNG_AGENT, str(stack.config_path), str(marks)],
        tmp_path / "agent.log",
        stack.env,
    )
    clients: list[socket.socket] = []
    try:
        wait_for(lambda: os.path.exists(stack.settings.agent_socket), 20, "the agent socket")
        for host in hosts:
            client = socket.socket(socket.AF_UNIX)
            client.connect(stack.settings.agent_socket)
            client.sendall(f"ensure {host}\n".encode())
            clients.append(client)
        # (the expiry sweep and the name filter read the same files: 8 or more marks)
        wait_for(lambda: len(marks.read_text().split()) >= 8, 10, "8 stuck reads")
        started = time.monotonic()
        os.kill(agent.pid, signal.SIGTERM)
        try:
            code = agent.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail("the agent did not exit within 5 s of SIGTERM")
        print(f"exited {code} after {time.monotonic() - started:.2f}s")
        assert code == 0
    finally:
        for client in clients:
            client.close()
        stop_process(agent)
        print((tmp_path / "agent.log").read_text()[-2000:])


def test_bench_dirstore_smoke(tmp_path: Path) -> None:
    """``python -m bench.dirstore`` at a tiny size: it runs, and reports what it measures."""
    result = subprocess.run(
        [
            sys.executable, "-m", "bench.dirstore", "--lineages", "30", "--seconds", "1",
            "--poll-seconds", "1", "--work", str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["handshake_san"] == ["s000029.le.test", "www.s000029.le.test"]
    assert report["memory"]["lineages"] == 30
    assert report["in_process"]["san_lookup_id"] is not None
    assert "watching with inotify" in report["agent_index_log"]
    for key in ("at_rest_inotify", "at_rest_poll"):
        assert report[key]["agent_ms_per_s"] >= 0
