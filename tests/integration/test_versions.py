"""What changes with the HAProxy under test (scripts/test.sh runs 2.6, 3.0, 3.2 and 3.4).

The generated haproxy.cfg is read without a single warning by each version; the
``.if`` blocks pick ``tune.lua.bool-sample-conversion`` (3.2+), one Lua state per
thread (3.0+) and X25519MLKEM768 (OpenSSL 3.5+); ``certagent check`` and
``status`` name the build and what differs on it.
"""

from __future__ import annotations

import json
import re
import socketserver
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from certagent.cli.init import InitOptions, init
from certagent.runtime.build import differences
from certagent.runtime.tlspolicy import TlsPolicy
from certagent.testing import HAPROXY, RedisFixture, haproxy_build, tlsclient
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

BOOL_BLOCK = ".if version_atleast(3.2)\n    tune.lua.bool-sample-conversion normal\n.endif\n"


def _check(cfg: Path) -> str:
    """``haproxy -c -V`` (3.0+ prints nothing on success without -V): its whole output."""
    run = subprocess.run([HAPROXY, "-c", "-V", "-f", str(cfg)], capture_output=True, timeout=30)
    out = (run.stdout + run.stderr).decode(errors="replace")
    assert run.returncode == 0, out
    return out


@pytest.mark.parametrize(
    ("fallback", "tls"),
    [("default-cert", TlsPolicy()), ("reject", TlsPolicy("modern"))],
    ids=["intermediate", "modern-reject"],
)
def test_haproxy_reads_the_generated_config_without_a_warning(
    tmp_path: Path, fallback: str, tls: TlsPolicy
) -> None:
    build = haproxy_build()
    d = tmp_path / "ca"
    init(InitOptions(d, "127.0.0.1:18443", str(tmp_path / "certs"), 50, fallback, tls=tls))
    cfg = d / "haproxy.cfg"
    out = _check(cfg)
    print(f"haproxy -c -V on {build.describe()}:\n{out}")
    assert "Configuration file is valid" in out
    assert "WARNING" not in out and "ALERT" not in out and "NOTICE" not in out
    # the check would see the warning: without its .if block 3.2 and later warn at every start
    text = cfg.read_text()
    assert BOOL_BLOCK in text
    cfg.write_text(text.replace(BOOL_BLOCK, ""))
    unguarded = _check(cfg)
    assert ("bool-sample-conversion" in unguarded) == (build.branch >= (3, 2)), unguarded


def test_check_and_status_name_the_build_and_what_differs(
    make_stack: StackFactory, redis_store: RedisFixture
) -> None:
    build = haproxy_build()
    stack = make_stack(redis_store.url, capacity=10)
    check = stack.cli("check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"ok    {build.describe()}, pid {stack.worker_pid()}" in check.stdout
    for note in differences(build):
        assert f"on this version: {note}" in check.stdout
    status = stack.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)["haproxy_build"]
    assert reported == {
        "version": build.version,
        "openssl": build.openssl,
        "lua": build.lua,
        "post_quantum": build.post_quantum,
        "quic": build.quic,
        "differences": differences(build),
    }
    assert build.openssl is not None and build.lua is not None  # known on every version
    assert build.quic is (build.branch >= (3, 0))  # Debian builds QUIC in from 3.0 on
    text = stack.cli("status")
    assert f"pid {stack.worker_pid()} ({build.describe()})" in text.stdout
    assert "HAProxy build: " + build.describe() in stack.agent_log()


class _Recorder(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Stands in for the agent on its socket: records each ``ensure`` line, answers unknown."""

    daemon_threads = True
    request_queue_size = 128  # the agent's own listen backlog is large too

    def __init__(self, path: str) -> None:
        self.lines: list[str] = []
        super().__init__(path, _Answer)


class _Answer(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline().decode().strip()
        assert isinstance(self.server, _Recorder)
        self.server.lines.append(line)
        self.wfile.write(b"unknown\n")


def test_every_lua_state_sends_its_worker_pid(
    make_stack: StackFactory, redis_store: RedisFixture
) -> None:
    """On 3.x each thread has its own Lua state (lua-load-per-thread) and its own cached pid."""
    build = haproxy_build()
    stack = make_stack(redis_store.url, capacity=10, start=False)
    stack.start_haproxy()
    recorder = _Recorder(stack.settings.agent_socket)
    serving = threading.Thread(target=recorder.serve_forever, daemon=True)
    serving.start()
    try:
        hosts = [f"h{i:03d}.threads.test" for i in range(80)]
        with ThreadPoolExecutor(16) as pool:  # 16 at once: both of HAProxy's threads run Lua
            list(pool.map(lambda h: tlsclient.raw_hello(stack.port, h.encode()), hosts))
    finally:
        recorder.shutdown()
        recorder.server_close()
    cfg = stack.haproxy_cfg.read_text()
    assert ".if version_atleast(3.0)\n    lua-load-per-thread " in cfg
    requests = sorted(recorder.lines)
    assert requests == sorted(f"ensure {h} {stack.worker_pid()}" for h in hosts)
    threads = re.search(r"^Nbthread: (\d+)$", stack.admin("show info"), re.M)
    assert threads is not None and int(threads[1]) >= 2, f"{build.describe()} runs one thread"
