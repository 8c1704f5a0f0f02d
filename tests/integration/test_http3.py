"""HTTP/3 (``certagent init --http3``) with a real QUIC client, aioquic, verifying every handshake.

QUIC connections go straight to fe_tls's QUIC bind, which shares certagent's
crt-list: a host certagent has loaded is served over HTTP/3 with its own
certificate and no hop; a host not loaded (never seen, recycled, deleted) gets
the default certificate there, the verifying client refuses it, and a TCP
connection loads the host again.  Run where HAProxy is built with QUIC (Debian's
3.0 and 3.2 in scripts/test.sh's matrix); on Debian 12's 2.6 only the refusal of
``--http3`` runs.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from certagent.cli.init import InitOptions, init
from certagent.errors import ConfigError
from certagent.runtime.build import http3_problem
from certagent.testing import HAPROXY, certagent_argv, haproxy_build, wait_for
from certagent.testing.certs import issue
from certagent.testing.h3client import H3Client, H3HandshakeFailed
from certagent.testing.tlsclient import CertInfo, cert_info, client_context
from tests.integration.conftest import PKI, RedisFixture, Stack, StackFactory

pytestmark = pytest.mark.integration

NO_HTTP3 = http3_problem(haproxy_build(), HAPROXY)
needs_quic = pytest.mark.skipif(
    NO_HTTP3 is not None, reason=f"no HTTP/3 on the HAProxy under test: {NO_HTTP3}"
)
MAX_AGE = 600
HTTP3 = ("--http3", "--haproxy", HAPROXY, "--http3-max-age", str(MAX_AGE))
CA_NAME = "certagent integration CA intermediate"


def tcp_get(stack: Stack, host: str) -> tuple[CertInfo, int, dict[str, str]]:
    """A verified TLS connection for ``host`` through fe_sni, ``GET /``: cert, status, headers."""
    context = client_context(stack.cafile)
    with (
        socket.create_connection((stack.address, stack.port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
    assert der is not None
    head = reply.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:])
    return cert_info(der), int(head[0].split()[1]), headers


def h3_served(stack: Stack, host: str) -> CertInfo:
    """HTTP/3 for ``host``: its own certificate (verified), a 200, the Alt-Svc again."""
    with H3Client(stack.port, host, stack.cafile, address=stack.address) as client:
        cert = client.cert
        response = client.get("/")
    assert cert.san == (host,) and cert.issuer_cn == CA_NAME
    assert (response.status, response.body) == (200, b"ok\n")
    assert response.headers["alt-svc"] == f'h3=":{stack.port}"; ma={MAX_AGE}'
    return cert


def h3_refused(stack: Stack, host: str) -> H3HandshakeFailed:
    """HTTP/3 for ``host`` fails: the verifying client refuses the certificate it gets."""
    with pytest.raises(H3HandshakeFailed) as failed:
        H3Client(stack.port, host, stack.cafile, address=stack.address).connect()
    assert failed.value.by_client and failed.value.tls_alert is not None, failed.value
    return failed.value


def conn_cnt(stack: Stack, host: str) -> int:
    reply = stack.admin(f"show table fe_sni key {host}")
    return int(reply.split("conn_cnt=")[1].split()[0])


@needs_quic
def test_http3_serves_a_host_tcp_loaded_and_never_one_from_an_old_slot(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    a, b = "a.h3.test", "b.h3.test"
    redis_store.put([pki.bundle(a), pki.bundle(b)])
    stack = make_stack(redis_store.url, capacity=1, init_args=HTTP3)
    # never seen: QUIC reaches fe_tls alone, which holds only the default certificate
    h3_refused(stack, a)
    assert stack.marked_hosts() == {}  # and the agent was not asked
    # the first TCP connection loads the host and announces HTTP/3
    cert, status, headers = tcp_get(stack, a)
    assert (cert.san, status) == ((a,), 200)
    assert headers["alt-svc"] == f'h3=":{stack.port}"; ma={MAX_AGE}'
    # now HTTP/3 gets the host's own certificate, and each QUIC connection counts as a use
    used = conn_cnt(stack, a)
    h3_served(stack, a)
    assert conn_cnt(stack, a) == used + 1
    # b takes a's only slot: HTTP/3 for a meets the default certificate again
    assert tcp_get(stack, b)[0].san == (b,)
    assert set(stack.marked_hosts()) == {b}
    h3_refused(stack, a)
    h3_served(stack, b)
    # a over TCP is loaded again, then served over HTTP/3; b's old slot serves nobody else
    assert tcp_get(stack, a)[0].san == (a,)
    h3_served(stack, a)
    h3_refused(stack, b)
    http3 = stack.status()["http3"]
    assert http3["returns"] == 1  # a came back within the max-age of losing its slot
    assert http3["max_age"] == MAX_AGE
    assert http3["recycled_idle_s"]["recycles"] == 2
    quic = http3["quic"]
    assert quic["refused"] >= 3  # three refusals (a client may repeat its close)
    assert (quic["connections"], quic["requests"]) == (3, 3)
    check = stack.cli("check")
    assert check.returncode == 0 and "ok    HTTP/3: HAProxy serves QUIC" in check.stdout
    metrics = stack.cli("status", "--json")
    assert metrics.returncode == 0 and json.loads(metrics.stdout)["http3"]["returns"] == 1
    text = stack.cli("status").stdout
    assert "3 connections, 3 requests" in text
    assert "1 recycled hosts back within max-age 600 s; recycled slots had been idle" in text
    assert not stack.consistency_problems()


@needs_quic
def test_a_rotation_and_a_deletion_reach_http3_as_they_reach_tcp(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    host = "rotate.h3.test"
    stack = make_stack(redis_store.url, capacity=10, init_args=HTTP3)
    pems = []
    for i in (1, 2):
        chain, key = issue(pki.ca, host)
        (tmp_path / f"chain{i}.pem").write_bytes(chain)
        (tmp_path / f"key{i}.pem").write_bytes(key)
        pems.append((str(tmp_path / f"chain{i}.pem"), str(tmp_path / f"key{i}.pem")))
    added = stack.command("cert", "add", "--cert", pems[0][0], "--key", pems[0][1], "--json")
    assert added.returncode == 0, added.stderr
    record = json.loads(added.stdout)["id"]
    first = tcp_get(stack, host)[0].serial
    assert h3_served(stack, host).serial == first
    # a rotation: the slot's certificate changes in place, for both sides at once
    rotated = stack.command("cert", "rotate", record, "--cert", pems[1][0], "--key", pems[1][1])
    assert rotated.returncode == 0, rotated.stderr
    second = wait_for(
        lambda: (s := h3_served(stack, host).serial) != first and s, 5.0, "the rotated certificate"
    )
    assert tcp_get(stack, host)[0].serial == second
    # a deletion: neither side serves the certificate any longer
    removed = stack.command("cert", "rm", record)
    assert removed.returncode == 0, removed.stderr

    def unloaded() -> bool:
        try:
            H3Client(stack.port, host, stack.cafile).connect().close()
        except H3HandshakeFailed:
            return True
        return False

    wait_for(unloaded, 5.0, "HTTP/3 to stop serving the deleted certificate")
    h3_refused(stack, host)
    with pytest.raises(ssl.SSLCertVerificationError):
        tcp_get(stack, host)
    assert stack.status()["live"]["unloaded"] == 1


@needs_quic
def test_quic_sessions_resume_on_another_node_and_across_a_rotation(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    host = "resume.h3.test"
    redis_store.put([pki.bundle(host)])
    nodes = [make_stack(redis_store.url, init_args=HTTP3) for _ in range(2)]
    for node in nodes:
        wait_for(
            lambda n=node: (n.status()["tickets"] or {}).get("in_haproxy"),
            10.0,
            "the fleet's ticket keys in HAProxy",
        )
        assert tcp_get(node, host)[0].san == (host,)  # loaded on both
    with H3Client(nodes[0].port, host, nodes[0].cafile) as full:
        assert not full.resumed and full.get().status == 200
        ticket = full.wait_tickets()[-1]
    # node 0's ticket resumes on node 1: the fleet's ring is the QUIC bind's too
    with H3Client(nodes[1].port, host, nodes[1].cafile, ticket=ticket) as again:
        assert again.resumed and again.get().status == 200
    generation = nodes[0].status()["tickets"]["generation"]
    rotated = nodes[0].cli("tls-keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    wait_for(
        lambda: all(n.status()["tickets"]["generation"] == generation + 1 for n in nodes),
        5.0,
        "every node on the new ring",
    )
    # one rotation later the ticket still resumes, on either node
    for node in nodes:
        with H3Client(node.port, host, node.cafile, ticket=ticket) as later:
            assert later.resumed and later.get().status == 200


def test_init_http3_checks_the_haproxy_that_will_run_it(tmp_path: Path) -> None:
    init = subprocess.run(
        [*certagent_argv(), "init", str(tmp_path / "ca"), "--bind", "127.0.0.1:18443",
         "--store", str(tmp_path / "certs"), "--http3", "--haproxy", HAPROXY],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    build = haproxy_build()
    if NO_HTTP3 is None:
        assert init.returncode == 0, init.stderr
        assert f"HTTP/3: {build.describe()} at {HAPROXY} serves QUIC" in init.stdout
        check = subprocess.run(
            [HAPROXY, "-c", "-f", str(tmp_path / "ca" / "haproxy.cfg")], capture_output=True
        )
        assert check.returncode == 0, check.stderr.decode()
    else:  # Debian 12's 2.6: a clear refusal naming the version, and nothing written
        assert init.returncode == 1
        assert f"--http3: HAProxy {build.version} ({HAPROXY}) cannot serve" in init.stderr
        assert "needs HAProxy 3.0 or later built with QUIC" in init.stderr
        assert not (tmp_path / "ca").exists()


@pytest.mark.skipif(NO_HTTP3 is None, reason="the HAProxy under test serves HTTP/3")
def test_an_agent_told_http3_stops_on_an_haproxy_without_quic(
    make_stack: StackFactory, redis_store: RedisFixture
) -> None:
    stack = make_stack(redis_store.url, env={"CERTAGENT_HTTP3": "true"}, start=False)
    stack.start_haproxy()
    agent = stack.start_agent(wait=False)
    started = time.monotonic()
    assert agent.wait(timeout=20) == 1
    assert time.monotonic() - started < 20
    log = stack.agent_log()
    assert f"http3 = true in the configuration, but HAProxy {haproxy_build().version}" in log
    assert "run an HAProxy built with QUIC" in log


def test_the_http3_options_are_refused_alone_or_out_of_range(tmp_path: Path) -> None:
    base = InitOptions(tmp_path / "ca", "127.0.0.1:18443", str(tmp_path / "certs"))
    with pytest.raises(ConfigError, match="--haproxy is for HTTP/3: add --http3"):
        init(dataclasses.replace(base, haproxy=HAPROXY))
    with pytest.raises(ConfigError, match="--http3-max-age is for HTTP/3: add --http3"):
        init(dataclasses.replace(base, http3_max_age=600))
    with pytest.raises(ConfigError, match="--http3: cannot run /nonexistent/haproxy -vv"):
        init(dataclasses.replace(base, http3=True, haproxy="/nonexistent/haproxy"))
    if NO_HTTP3 is None:
        with pytest.raises(ConfigError, match="http3_max_age must be between 60 s and 86400 s"):
            init(dataclasses.replace(base, http3=True, haproxy=HAPROXY, http3_max_age=30))
    assert not (tmp_path / "ca").exists()  # a refused argument leaves nothing behind
