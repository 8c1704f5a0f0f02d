"""OCSP stapling from the store: stapled at load, refreshed live, absent when there is none."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certagent.api import add_token
from certagent.certs.pem import parse_bundle
from certagent.testing import PKI, RedisFixture, Stack, certagent_argv, free_port, wait_for
from certagent.testing.certs import key_pem, shared_key
from certagent.testing.ocsp import Responder, issue_with_responder, ocsp_response
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration


def stapled(stack: Stack, host: str) -> str | None:
    """The ``This Update`` of the response stapled for ``host`` (openssl s_client -status)."""
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{stack.port}", "-servername", host,
         "-status", "-CAfile", str(stack.cafile), "-verify_return_error"],
        input="", capture_output=True, text=True, timeout=10,
    ).stdout  # fmt: skip
    assert f"subject=CN = {host}" in out or f"CN={host}" in out.replace(" ", ""), out[-2000:]
    assert "Verify return code: 0 (ok)" in out, out[-2000:]
    if "OCSP response: no response sent" in out:
        return None
    assert "Cert Status: good" in out, out[-2000:]
    found = re.search(r"This Update: (.+)", out)
    assert found is not None, out[-2000:]
    return found.group(1).strip()


def put_ocsp(bind: str, token: str, cert_id: str, der: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://{bind}/v1/certificates/{cert_id}/ocsp",
        data=der,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/ocsp-response"},
        method="PUT",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_stapled_at_load_refreshed_live_and_absent_without_one(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI, tmp_path: Path
) -> None:
    hosts = {h: pki.chain_and_key(h) for h in ("a.ocsp.test", "b.ocsp.test", "c.ocsp.test")}
    store = redis_store.open()
    ids = {}
    leaves = {}
    async def add_all() -> None:
        for host, (chain, key) in hosts.items():
            ids[host] = (await store.add(parse_bundle(chain, key))).id
            leaves[host] = x509.load_pem_x509_certificate(chain)
        await store.close()

    asyncio.run(add_all())
    t1 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    first = ocsp_response(pki.ca, leaves["a.ocsp.test"], this_update=t1)
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "ocsp")
    bind = f"127.0.0.1:{free_port()}"
    stack = make_stack(
        redis_store.url,
        env={"CERTAGENT_API_TOKENS_FILE": str(tokens), "CERTAGENT_API_BIND": bind},
    )
    # a response kept before the first connection: stapled by the load itself (CLI, store)
    stored = subprocess.run(
        [*certagent_argv(), "cert", "ocsp", "--config", str(stack.config_path),
         ids["a.ocsp.test"], str(_write(tmp_path / "r1", first))],
        env=stack.env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    assert "stapling for" in stored.stdout and "good" in stored.stdout
    pid = stack.worker_pid()
    first_seen = stapled(stack, "a.ocsp.test")
    assert first_seen is not None

    # a newer response through the REST API: stapled within a second, no reload
    t2 = t1 + dt.timedelta(hours=1)
    second = ocsp_response(pki.ca, leaves["a.ocsp.test"], this_update=t2)
    status, body = put_ocsp(bind, token, ids["a.ocsp.test"], second)
    assert status == 200, body
    wait_for(
        lambda: ((s := stapled(stack, "a.ocsp.test")) is not None and s != first_seen) or None,
        2.0,
        "the new response to be stapled",
    )
    assert stack.worker_pid() == pid  # no reload

    # a certificate without a response handshakes normally, with nothing stapled
    assert stapled(stack, "b.ocsp.test") is None
    # ... and gets stapling as soon as a response is stored for it (loaded already)
    fresh = ocsp_response(pki.ca, leaves["b.ocsp.test"])
    status, body = put_ocsp(bind, token, ids["b.ocsp.test"], fresh)
    assert status == 200, body
    wait_for(lambda: stapled(stack, "b.ocsp.test"), 2.0, "b's first stapled response")

    # a response about another certificate is refused, and changes nothing
    status, body = put_ocsp(bind, token, ids["c.ocsp.test"], second)
    assert status == 422 and '"bad-ocsp"' in body, body
    assert stapled(stack, "c.ocsp.test") is None
    assert stack.status()["live"]["stapled"] >= 2


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_responses_are_fetched_from_the_certificates_responder(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    host = "fetched.ocsp.test"
    key = shared_key()
    with Responder() as responder:
        leaf = issue_with_responder(pki.ca, host, responder.url, key)
        responder.set(leaf, ocsp_response(pki.ca, leaf))
        chain = leaf.public_bytes(serialization.Encoding.PEM) + pki.ca.chain_pem
        redis_store.put([parse_bundle(chain, key_pem(key))])
        stack = make_stack(redis_store.url)
        assert stapled(stack, host) is None  # loaded without one: a fetch is scheduled
        first = wait_for(lambda: stapled(stack, host), 5.0, "the fetched response, stapled")
        assert responder.requests == 1
        fetch = stack.status()["ocsp_fetch"]
        assert (fetch["fetched"], fetch["failed"]) == (1, 0), fetch
        assert fetch["queued"] == 1  # the next fetch: halfway to nextUpdate, not now
        assert first is not None
