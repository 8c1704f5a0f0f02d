"""The REST API over TLS in-process (api/tls.py): settings, reload, refused handshakes, mTLS.

Real handshakes on loopback with Python's ssl client; the same against the real
agent (and curl, sslyze, the CLI) is tests/integration/test_api_tls.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import ssl
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
import trustme
from cryptography import x509

from certagent.api import ApiServer, LoadedSlot, start_api
from certagent.api.auth import add_token, register_token
from certagent.api.grants import make_grant
from certagent.api.tls import (
    ServerTls,
    _groups_setter,
    client_context,
    refusal_reason,
    server_context,
)
from certagent.config import Settings
from certagent.errors import ConfigError
from certagent.runtime.tlspolicy import INTERMEDIATE_CIPHERS
from tests.memstore import MemoryStore


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_files(
    ca: trustme.CA, where: Path, name: str = "server", key_type: trustme.KeyType | None = None
) -> tuple[Path, Path]:
    leaf = ca.issue_cert("127.0.0.1", "localhost", key_type=key_type or trustme.KeyType.ECDSA)
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    for pem in leaf.cert_chain_pems[1:]:
        pem.write_to_path(str(cert), append=True)
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


def test_the_context_is_mozilla_intermediate(ca: trustme.CA, tmp_path: Path) -> None:
    cert, key = server_files(ca, tmp_path)
    ctx = server_context(str(cert), str(key))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == set(INTERMEDIATE_CIPHERS.split(":"))
    assert not ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE  # the client's order wins
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    assert server_context(str(cert), str(key), str(ca_file)).verify_mode == ssl.CERT_REQUIRED


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str | None:
    """An in-memory handshake; the TLS version agreed, or None if it failed."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    for _ in range(6):
        for end in (cli, srv):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return None
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    try:
        cli.do_handshake()
        srv.do_handshake()
    except ssl.SSLError:
        return None
    return srv.version()


@pytest.mark.parametrize(
    ("group", "taken"),
    [
        ("X25519", True),
        ("prime256v1", True),
        ("secp384r1", True),
        ("secp521r1", False),
        ("X448", False),
    ],
)
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_the_key_exchange_groups_are_the_data_planes(
    ca: trustme.CA, tmp_path: Path, group: str, taken: bool, version: ssl.TLSVersion
) -> None:
    """X25519, P-256 and P-384, as HAProxy's ssl-default-bind-curves (runtime/tlspolicy.py).

    An RSA certificate: in TLS 1.2 a client's groups also limit the curve of an ECDSA one.
    """
    cert, key = server_files(ca, tmp_path, key_type=trustme.KeyType.RSA)
    server = server_context(str(cert), str(key))
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    client.minimum_version = client.maximum_version = version
    setter = _groups_setter(client)
    assert setter is not None and setter(group.encode()) == 1
    assert _handshake(server, client) == (version.name.replace("_", ".") if taken else None)


def test_a_pair_that_does_not_load_is_a_config_error(ca: trustme.CA, tmp_path: Path) -> None:
    cert, key = server_files(ca, tmp_path)
    _, other_key = server_files(ca, tmp_path, "other")
    with pytest.raises(ConfigError, match="key values mismatch") as info:
        server_context(str(cert), str(other_key))
    assert "PRIVATE" not in str(info.value)
    with pytest.raises(ConfigError, match="No such file"):
        server_context(str(tmp_path / "absent.pem"), str(key))
    with pytest.raises(ConfigError, match="api_client_ca"):
        server_context(str(cert), str(key), str(tmp_path / "absent-ca.pem"))
    with pytest.raises(ConfigError, match="--api-client-cert"):
        client_context(None, tmp_path / "absent.pem")


def test_a_changed_pair_is_used_from_the_next_connection_a_broken_one_never(
    ca: trustme.CA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "certagent.api.tls")
    cert, key = server_files(ca, tmp_path)
    clock = [0.0]
    tls = ServerTls(str(cert), str(key), clock=lambda: clock[0])
    first = tls.context()
    assert tls.context() is first  # nothing changed: the same context
    new_cert, new_key = server_files(ca, tmp_path, "renewed")
    replace(new_cert, cert)  # the certificate is written first: its key does not match
    broken = tls.context()
    assert broken is first and "key values mismatch" in caplog.text
    clock[0] += 5
    assert tls.context() is first and caplog.text.count("key values mismatch") == 1
    replace(new_key, key)
    renewed = tls.context()
    assert renewed is not first and "re-read" in caplog.text
    assert tls.context() is renewed


def replace(source: Path, target: Path) -> None:
    """Write ``target`` as deploy tools do: a new file renamed over it (a new inode)."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.copy(source, tmp)
    tmp.replace(target)


def test_refusal_reasons() -> None:
    err = ssl.SSLError(1, "x")
    err.reason = "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    assert refusal_reason(err) == "no-client-certificate"
    err.reason = "SOMETHING_NEW"
    assert refusal_reason(err) == "handshake-failed"
    assert refusal_reason(TimeoutError()) == "timeout"
    assert refusal_reason(ConnectionAbortedError("SSL handshake is taking longer than 10 s")) == (
        "timeout"
    )
    assert refusal_reason(ConnectionResetError()) == "connection-lost"


@pytest.fixture
async def mutual(ca: trustme.CA, tmp_path: Path) -> AsyncIterator[tuple[ApiServer, Path]]:
    cert, key = server_files(ca, tmp_path)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tokens = tmp_path / "tokens"
    add_token(tokens, "admin")
    settings = Settings(
        api_bind="127.0.0.1:0",
        api_tokens_file=str(tokens),
        api_tls_cert=str(cert),
        api_tls_key=str(key),
        api_client_ca=str(ca_file),
    )

    async def nothing() -> list[LoadedSlot]:
        return []

    server = await start_api(settings, MemoryStore(), loaded=nothing, ready=lambda: True)
    assert server is not None and server.url.startswith("https://127.0.0.1:")
    try:
        yield server, tmp_path
    finally:
        await server.close()


def audit(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "certagent.audit"]


async def test_mutual_tls_refuses_in_the_handshake_and_maps_a_subject_to_a_token(
    mutual: tuple[ApiServer, Path], ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "certagent.audit")
    server, where = mutual
    ca_file = where / "ca.pem"
    host, port = server.url.removeprefix("https://").split(":")

    # no client certificate: the server ends the handshake (TLS 1.3: on the first read)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=client_context(ca_file))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
        await reader.readexactly(1)
    writer.close()
    # plain HTTP to the TLS port
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await reader.read() == b""
    writer.close()
    await _until(lambda: len(audit(caplog)) == 2)
    assert [(a["event"], a["outcome"], a["code"]) for a in audit(caplog)] == [
        ("tls-handshake", "refused", "no-client-certificate"),
        ("tls-handshake", "refused", "plain-http"),
    ]

    # a client certificate from the CA, its subject given to a token: no bearer needed
    client = ca.issue_cert("deploy@example.test", common_name="deploy")
    pem = where / "client.pem"
    client.private_key_and_cert_chain_pem.write_to_path(str(pem))
    subject = x509.load_pem_x509_certificate(client.cert_chain_pems[0].bytes()).subject
    register_token(
        server.tokens.path,
        "deploy",
        None,
        grant=make_grant(scopes=["read"], subject=subject.rfc4514_string(), now=datetime.now(UTC)),
    )
    tls = client_context(ca_file, pem)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session:
        async with session.get(server.url + "/v1/certificates") as resp:
            assert resp.status == 200, await resp.text()
        async with session.post(server.url + "/v1/domains", json={"name": "a.b.test"}) as resp:
            assert (resp.status, (await resp.json())["code"]) == (403, "forbidden")
    lines = audit(caplog)[2:]
    assert [(a["token"], a["client"], a["status"]) for a in lines] == [
        ("deploy", subject.rfc4514_string(), 200),
        ("deploy", subject.rfc4514_string(), 403),
    ]
    metrics = server.metrics().decode()
    assert 'certagent_api_tls_refused_total{reason="plain-http"} 1.0' in metrics


async def _until(done: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not done():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)
