"""Uploads, rotations and deletions take effect live, on every agent (real HAProxy + Redis)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from certagent.api import add_token
from certagent.certs.pem import split_blocks
from certagent.testing import certagent_argv, free_port
from certagent.testing.certs import combined, issue
from certagent.testing.tlsclient import CertInfo, client_context, handshake
from tests.integration.conftest import PKI, RedisFixture, Stack, StackFactory

pytestmark = pytest.mark.integration

HOST = "live.example.test"


class Api:
    """The agent's REST API over plain urllib, with a bearer token."""

    def __init__(self, port: int, token: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.token = token

    def call(self, method: str, path: str, body: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as reply:  # loopback only
            raw = reply.read()
        return json.loads(raw) if raw else None

    def upload(self, chain: bytes, key: bytes, cert_id: str | None = None) -> dict[str, Any]:
        body = {"chain": chain.decode(), "key": key.decode()}
        if cert_id is None:
            result: dict[str, Any] = self.call("POST", "/v1/certificates", body)
        else:
            result = self.call("PUT", f"/v1/certificates/{cert_id}", body)
        return result


def api_stack(make_stack: StackFactory, store: str, tmp_path: Path, name: str) -> tuple[Stack, Api]:
    tokens = tmp_path / f"{name}.tokens"
    token = add_token(tokens, "tests")
    port = free_port()
    stack = make_stack(
        store,
        capacity=20,
        env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": f"127.0.0.1:{port}"},
    )
    return stack, Api(port, token)


def serial_of(chain: bytes) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(chain).serial_number


def wait_until(probe: Any, timeout: float, step: float = 0.02) -> float:
    """Seconds until ``probe()`` is true; fails the test after ``timeout``."""
    start = time.monotonic()
    while not probe():
        if time.monotonic() - start > timeout:
            pytest.fail(f"not within {timeout}s: {probe}")
        time.sleep(step)
    return time.monotonic() - start


def served(stack: Stack, host: str) -> CertInfo | None:
    """The verified certificate ``host`` gets, or None if the client rejects what it gets."""
    try:
        return handshake(stack.port, host, stack.cafile)
    except (ssl.SSLError, OSError):
        return None


class Loop(threading.Thread):
    """Verified handshakes to one host back to back, recording serials and failures."""

    def __init__(self, stack: Stack, host: str) -> None:
        super().__init__(daemon=True)
        self.stack, self.host = stack, host
        self.serials: list[int] = []
        self.failures: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        ctx = client_context(self.stack.cafile)
        deadline = time.monotonic() + 60  # bounded even if never stopped
        while not self._halt.is_set() and time.monotonic() < deadline:
            try:
                self.serials.append(handshake(self.stack.port, self.host, context=ctx).serial)
            except (ssl.SSLError, OSError) as exc:
                self.failures.append(repr(exc))
            time.sleep(0.005)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def key_lines(key_pem: bytes) -> list[str]:
    """The base64 lines of a private key, to look for in logs."""
    (_, block), *_ = [b for b in split_blocks(key_pem) if "PRIVATE KEY" in b[0]]
    return [line for line in block.decode().splitlines() if not line.startswith("-----")]


@pytest.mark.timeout(120)
def test_upload_rotate_delete_live(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    stack, api = api_stack(make_stack, redis_store.url, tmp_path, "a")
    pid = stack.worker_pid()
    chain1, key1 = issue(pki.ca, HOST)
    record = api.upload(chain1, key1)
    assert record["names"] == [HOST]

    # 2. the first TLS connection after the upload gets the uploaded certificate
    first = served(stack, HOST)
    assert first is not None and first.serial == serial_of(chain1)

    # 3. rotation while a client loops: the new serial within 1 s, nothing fails
    loop = Loop(stack, HOST)
    loop.start()
    wait_until(lambda: len(loop.serials) >= 5, 10)
    chain2, key2 = issue(pki.ca, HOST)
    t0 = time.monotonic()
    rotated = api.upload(chain2, key2, record["id"])
    assert rotated["version"] == 2 and rotated["id"] == record["id"]
    took = wait_until(lambda: loop.serials[-1:] == [serial_of(chain2)], 5)
    time.sleep(0.3)
    loop.stop()
    print(f"rotation served after {time.monotonic() - t0 - 0.3:.3f}s ({took:.3f}s polled)")
    assert took <= 1.0
    assert loop.failures == []
    assert set(loop.serials) == {serial_of(chain1), serial_of(chain2)}
    assert stack.worker_pid() == pid  # no reload

    # 4. deletion: the host falls back (the client no longer verifies) within 1 s
    api.call("DELETE", f"/v1/certificates/{record['id']}")
    took = wait_until(lambda: served(stack, HOST) is None, 5)
    assert took <= 1.0
    assert stack.worker_pid() == pid
    assert stack.status()["live"]["unloaded"] == 1

    # 5. no key material in the agent's or HAProxy's logs
    logs = stack.agent_log() + stack.haproxy_log()
    assert "PRIVATE KEY" not in logs
    for line in key_lines(key1) + key_lines(key2):
        assert line not in logs


@contextmanager
def tcp_proxy(target_port: int) -> Iterator[Any]:
    """A loopback TCP proxy whose connections can be cut (to cut one agent off Redis)."""

    class Proxy:
        def __init__(self) -> None:
            self.listener = socket.create_server(("127.0.0.1", 0))
            self.port = self.listener.getsockname()[1]
            self.open = threading.Event()
            self.open.set()
            self.socks: list[socket.socket] = []
            self.lock = threading.Lock()
            self.closed = False

        def serve(self) -> None:
            while not self.closed:
                try:
                    client, _ = self.listener.accept()
                except OSError:
                    return
                if not self.open.is_set():
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(("127.0.0.1", target_port))
                except OSError:
                    client.close()
                    continue
                with self.lock:
                    self.socks += [client, upstream]
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

        @staticmethod
        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    s.close()

        def cut(self) -> None:
            self.open.clear()
            with self.lock:
                for s in self.socks:
                    with suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                self.socks.clear()

        def restore(self) -> None:
            self.open.set()

    proxy = Proxy()
    thread = threading.Thread(target=proxy.serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.closed = True
        proxy.cut()
        proxy.listener.close()
        thread.join(5)


@pytest.mark.timeout(120)
def test_two_agents_on_one_redis_and_missed_events(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    redis_port = int(redis_store.url.rsplit(":", 1)[1].split("/")[0])
    with tcp_proxy(redis_port) as proxy:
        a, api = api_stack(make_stack, redis_store.url, tmp_path, "a")
        b = make_stack(f"redis://127.0.0.1:{proxy.port}/0", capacity=20)

        # both agents have seen the host missing (negative cache, TTL 30 s) ...
        for stack in (a, b):
            assert served(stack, HOST) is None
            assert stack.status()["ensure"]["unknown"] == 1
        # ... and an upload through A is served by both within 1 s all the same
        chain1, key1 = issue(pki.ca, HOST)
        record = api.upload(chain1, key1)
        for stack in (a, b):
            took = wait_until(lambda s=stack: _serial(s) == serial_of(chain1), 5)
            assert took <= 1.0, stack.directory

        # an upload through A (a rotation of a host both serve) reaches both within 1 s
        chain2, key2 = issue(pki.ca, HOST)
        api.upload(chain2, key2, record["id"])
        for stack in (a, b):
            took = wait_until(lambda s=stack: _serial(s) == serial_of(chain2), 5)
            assert took <= 1.0, stack.directory

        # B loses Redis; a rotation happens meanwhile; B applies it once reconnected
        proxy.cut()
        time.sleep(1.5)
        chain3, key3 = issue(pki.ca, HOST)
        api.upload(chain3, key3, record["id"])
        wait_until(lambda: _serial(a) == serial_of(chain3), 5)
        time.sleep(1.0)
        assert _serial(b) == serial_of(chain2)  # B cannot know yet
        proxy.restore()
        took = wait_until(lambda: _serial(b) == serial_of(chain3), 10)
        print(f"missed rotation applied {took:.2f}s after Redis came back")
        assert b.status()["live"]["feed_errors"] >= 1


def _serial(stack: Stack) -> int | None:
    info = served(stack, HOST)
    return None if info is None else info.serial


def _tls12_context(cafile: Path, cipher: str) -> ssl.SSLContext:
    ctx = client_context(cafile)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(cipher)
    return ctx


@pytest.mark.timeout(60)
def test_ecdsa_and_rsa_for_one_name(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    host = "dual.example.test"
    ec_chain, ec_key = issue(pki.ca, host, key_type="ec")
    rsa_chain, rsa_key = issue(pki.ca, host, key_type="rsa")
    from certagent.certs.pem import parse_bundle

    redis_store.put([parse_bundle(ec_chain, ec_key), parse_bundle(rsa_chain, rsa_key)])
    stack = make_stack(redis_store.url, capacity=10)
    rsa_only = _tls12_context(stack.cafile, "ECDHE-RSA-AES128-GCM-SHA256")
    ec_only = _tls12_context(stack.cafile, "ECDHE-ECDSA-AES128-GCM-SHA256")
    for _ in range(2):  # cold, then warm
        assert handshake(stack.port, host, context=rsa_only).serial == serial_of(rsa_chain)
        assert handshake(stack.port, host, context=ec_only).serial == serial_of(ec_chain)
    assert handshake(stack.port, host, stack.cafile).serial == serial_of(ec_chain)  # TLS 1.3
    status = stack.status()
    assert status["slots_used"] == 2
    assert status["ensure"]["loaded"] == 1  # both certificates in one load


@pytest.mark.timeout(180)
def test_bulk_import_of_10000_with_a_corrupt_file(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    from certagent.testing.certs import shared_key

    stack = make_stack(redis_store.url, capacity=10, start=False)
    certs = tmp_path / "import"
    certs.mkdir()
    for i in range(10_000):
        name = f"bulk{i:05d}.example.test"
        if i == 5_000:
            (certs / f"{name}.pem").write_text("-----BEGIN CERTIFICATE-----\ngarbage\n")
            continue
        (certs / f"{name}.pem").write_bytes(combined(*issue(pki.ca, name, key=shared_key())))
    result = subprocess.run(
        [*certagent_argv(), "cert", "import", str(certs), "--config", str(stack.config_path)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    out = result.stdout + result.stderr
    print(out[-600:])
    assert "bulk05000.example.test.pem" in out
    assert "9999 added" in out.replace(",", "")
    assert "/s" in out
    stack.start_haproxy()
    stack.start_agent()
    assert handshake(stack.port, "bulk09999.example.test", stack.cafile).subject_cn
