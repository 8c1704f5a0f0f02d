"""Every bad upload gets its own 4xx status and code, a message saying what to do, and
leaves the store as it was; odd but valid PEM (CRLF, blank lines) is accepted and normalised."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from certagent.certs.pem import parse_bundle
from certagent.certs.validate import UploadPolicy
from certagent.store.base import Store
from certagent.testing.certs import (
    CA,
    any_key_pem,
    cert_pem,
    issue,
    issue_odd,
    key_pem,
    make_ca,
    make_ca_path,
    make_key,
    make_odd_key,
    shared_key,
)
from tests.apihelp import STORE_KINDS, Api, check_response, make_store, running_api

CERTS = "/v1/certificates"
MAX_BYTES = 16 * 1024  # small, so size tests stay small
POLICY = UploadPolicy(max_bytes=MAX_BYTES)


@dataclass(frozen=True)
class PKI:
    ca: CA
    other: CA
    deep: CA


@pytest.fixture(scope="module")
def pki() -> PKI:
    return PKI(make_ca(), make_ca("unrelated CA"), make_ca_path(2))


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path)


@pytest.fixture
async def api(store: Store, tmp_path: Path, pki: PKI) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path, policy=POLICY) as api:
        # one certificate already there: a refused upload must leave it exactly as it is
        chain, key = issue(pki.ca, "existing.example.test", key=shared_key())
        resp = await api.client.post(
            CERTS, json={"chain": chain.decode(), "key": key.decode()}, headers=api.auth
        )
        assert resp.status == 201
        yield api


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


Maker = Callable[[PKI], tuple[bytes, bytes | None]]


def _key_mismatch(p: PKI) -> tuple[bytes, bytes | None]:
    chain, _ = issue(p.ca, "km.example.test")
    return chain, key_pem(make_key())


def _expired(p: PKI) -> tuple[bytes, bytes | None]:
    return issue(
        p.ca,
        "old.example.test",
        not_before=_now() - dt.timedelta(days=100),
        not_after=_now() - dt.timedelta(days=1),
    )


def _not_yet_valid(p: PKI) -> tuple[bytes, bytes | None]:
    return issue(
        p.ca,
        "new.example.test",
        not_before=_now() + dt.timedelta(days=1),
        not_after=_now() + dt.timedelta(days=90),
    )


def _odd(key_type: str) -> Maker:
    def make(p: PKI) -> tuple[bytes, bytes | None]:
        key = make_odd_key(key_type)  # type: ignore[arg-type]
        return cert_pem(issue_odd(p.ca, "odd.example.test", key=key)), any_key_pem(key)

    return make


def _out_of_order(p: PKI) -> tuple[bytes, bytes | None]:
    key = make_key()
    leaf = cert_pem(issue_odd(p.deep, "order.example.test", key=key))
    inter2, inter1 = (cert_pem(c) for c in p.deep.chain)
    return leaf + inter1 + inter2, key_pem(key)


def _unrelated(p: PKI) -> tuple[bytes, bytes | None]:
    chain, key = issue(p.ca, "unrel.example.test")
    return chain + p.other.chain_pem, key


def _no_names(p: PKI) -> tuple[bytes, bytes | None]:
    key = make_key()
    cert = issue_odd(
        p.ca,
        key=key,
        subject=x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "no host here")]),
    )
    return cert_pem(cert), key_pem(key)


def _csr(p: PKI) -> tuple[bytes, bytes | None]:
    key = make_key()
    from cryptography.hazmat.primitives import hashes, serialization

    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "csr.example.test")]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM), key_pem(key)


def _encrypted(p: PKI) -> tuple[bytes, bytes | None]:
    key = make_key()
    chain, _ = issue(p.ca, "enc.example.test", key=key)
    return chain, key_pem(key, password=b"secret")


def _two_keys(p: PKI) -> tuple[bytes, bytes | None]:
    chain, key = issue(p.ca, "two.example.test")
    return chain + key, key_pem(make_key())


def _repeated(p: PKI) -> tuple[bytes, bytes | None]:
    chain, key = issue(p.ca, "rep.example.test")
    return chain + p.ca.chain_pem, key


def _too_long(p: PKI) -> tuple[bytes, bytes | None]:
    deep = make_ca_path(6)
    key = make_key()
    leaf = cert_pem(issue_odd(deep, "long.example.test", key=key))
    return leaf + deep.chain_pem, key_pem(key)


BAD_UPLOADS: dict[str, tuple[Maker, int, str, str]] = {
    # name: (make, status, code, a word the message must hold)
    "garbage": (lambda p: (b"hello, this is not a certificate\n", None), 400, "bad-pem", "PEM"),
    "truncated PEM": (
        lambda p: (issue(p.ca, "t.example.test")[0][:300], None),
        400,
        "bad-pem",
        "END",
    ),
    "binary DER": (lambda p: (b"\x30\x82\x01\x0a" + b"\x00" * 40, None), 400, "bad-pem", "DER"),
    "certificate request": (_csr, 400, "bad-pem", "request"),
    "certificate without key": (
        lambda p: (issue(p.ca, "nokey.example.test")[0], None),
        422,
        "missing-key",
        "key",
    ),
    "key mismatch": (_key_mismatch, 422, "key-mismatch", "key"),
    "expired": (_expired, 422, "expired", "renew"),
    "not yet valid": (_not_yet_valid, 422, "not-yet-valid", "valid only from"),
    "RSA 1024": (_odd("rsa1024"), 422, "weak-key", "1024"),
    "curve P-521": (_odd("p521"), 422, "unsupported-key", "P-521"),
    "curve secp256k1": (_odd("secp256k1"), 422, "unsupported-key", "secp256k1"),
    "Ed25519": (_odd("ed25519"), 422, "unsupported-key", "Ed25519"),
    "chain out of order": (_out_of_order, 422, "chain-order", "out of order"),
    "unrelated chain": (_unrelated, 422, "unrelated-chain", "not part of"),
    "no SAN and no CN": (_no_names, 422, "no-names", "subjectAltName"),
    "encrypted key": (_encrypted, 422, "encrypted-key", "passphrase"),
    "two keys": (_two_keys, 422, "multiple-keys", "2 private keys"),
    "certificate repeated in the chain": (_repeated, 422, "duplicate-certificate", "repeats"),
    "chain too long": (_too_long, 422, "chain-too-long", "at most"),
}


@pytest.mark.parametrize("case", list(BAD_UPLOADS))
@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_bad_upload_is_refused_and_store_unchanged(
    api: Api, pki: PKI, case: str, method: str
) -> None:
    make, status, code, word = BAD_UPLOADS[case]
    chain, key = make(pki)
    before = await api.records()
    path = CERTS if method == "POST" else f"{CERTS}/{before[0].id}"
    body = {"chain": chain.decode("latin-1"), **({"key": key.decode()} if key else {})}
    resp = await api.client.request(method, path, json=body, headers=api.auth)
    problem = await resp.json()
    assert (resp.status, problem["code"]) == (status, code), problem["detail"]
    assert resp.content_type == "application/problem+json"
    check_response(
        CERTS if method == "POST" else f"{CERTS}/{{id}}",
        method,
        status,
        "application/problem+json",
        problem,
    )
    assert problem["type"] == f"urn:certagent:problem:{code}"
    assert word.lower() in problem["detail"].lower(), problem["detail"]
    assert "PRIVATE KEY-----" not in problem["detail"]
    assert await api.records() == before


async def test_clock_seam_decides_expiry(store: Store, tmp_path: Path, pki: PKI) -> None:
    chain, key = issue(pki.ca, "clock.example.test", key=shared_key())
    later = _now() + dt.timedelta(days=400)
    async with running_api(store, tmp_path, policy=POLICY, now=lambda: later) as api:
        resp = await api.client.post(
            CERTS, json={"chain": chain.decode(), "key": key.decode()}, headers=api.auth
        )
        assert resp.status == 422
        assert (await resp.json())["code"] == "expired"
        assert await api.records() == []


# --- size limit ------------------------------------------------------------------------------


async def test_over_the_limit_by_content_length_is_413_before_reading(api: Api) -> None:
    before = await api.records()
    body = b"-----BEGIN CERTIFICATE-----\n" + b"A" * (3 * MAX_BYTES)
    resp = await api.client.post(
        CERTS, data=body, headers={**api.auth, "Content-Type": "application/x-pem-file"}
    )
    assert resp.status == 413
    problem = await resp.json()
    check_response(CERTS, "post", 413, "application/problem+json", problem)
    assert problem["code"] == "too-large"
    assert "limit" in problem["detail"]
    assert await api.records() == before


async def test_over_the_limit_without_content_length_is_413(api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"A" * 1024

    before = await api.records()
    resp = await api.client.post(
        CERTS, data=chunks(), headers={**api.auth, "Content-Type": "application/x-pem-file"}
    )
    assert resp.status == 413
    assert (await resp.json())["code"] == "too-large"
    assert await api.records() == before


async def test_pem_over_the_limit_inside_a_small_enough_body_is_413(api: Api, pki: PKI) -> None:
    chain, key = issue(pki.ca, "big.example.test")
    padding = b"# " + b"x" * 70 + b"\n"
    chain = padding * (MAX_BYTES // len(padding)) + chain  # text outside blocks is ignored...
    resp = await api.client.post(  # ...but counts towards the limit
        CERTS, json={"chain": chain.decode(), "key": key.decode()}, headers=api.auth
    )
    assert resp.status == 413
    assert (await resp.json())["code"] == "too-large"


async def test_expect_100_continue_is_refused_before_the_body(api: Api) -> None:
    """A client that asks first is told 413 (or 401) without sending the body at all."""
    import asyncio

    host, port = api.client.server.host, api.client.server.port
    for auth, status in ((f"Authorization: Bearer {api.token}\r\n", 413), ("", 401)):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            (
                f"POST {CERTS} HTTP/1.1\r\nHost: x\r\n{auth}"
                "Content-Type: application/x-pem-file\r\n"
                f"Content-Length: {10 * MAX_BYTES}\r\nExpect: 100-continue\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        assert b"application/problem+json" in head
        writer.close()


# --- malformed requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "ctype", "status", "code"),
    [
        (b'{"chain": ', "application/json", 400, "bad-request"),
        (b"\xff\xfe", "application/json", 400, "bad-request"),
        (b'["chain"]', "application/json", 400, "bad-request"),
        (b"[" * 12000 + b"]" * 12000, "application/json", 400, "bad-request"),
        (b'{"chain": 5}', "application/json", 400, "bad-request"),
        (b'{"chain": "x", "key": 5}', "application/json", 400, "bad-request"),
        (b'{"cert": "x"}', "application/json", 400, "bad-request"),
        (b"chain=x&extra=y", "application/x-www-form-urlencoded", 400, "bad-request"),
        (
            b"-----BEGIN CERTIFICATE-----",
            "application/x-www-form-urlencoded",
            415,
            "unsupported-media-type",
        ),
        (b"<xml/>", "application/xml", 415, "unsupported-media-type"),
        (b"", "application/x-pem-file", 400, "bad-pem"),
    ],
)
async def test_malformed_request_is_4xx(
    api: Api, data: bytes, ctype: str, status: int, code: str
) -> None:
    before = await api.records()
    resp = await api.client.post(CERTS, data=data, headers={**api.auth, "Content-Type": ctype})
    problem = await resp.json()
    assert (resp.status, problem["code"]) == (status, code), problem
    check_response(CERTS, "post", status, "application/problem+json", problem)
    assert await api.records() == before


async def test_missing_or_wrong_token_uploads_nothing(api: Api, pki: PKI) -> None:
    chain, key = issue(pki.ca, "tok.example.test", key=shared_key())
    body = {"chain": chain.decode(), "key": key.decode()}
    before = await api.records()
    resp = await api.client.post(CERTS, json=body)
    assert resp.status == 401
    assert (await resp.json())["code"] == "missing-token"
    resp = await api.client.post(CERTS, json=body, headers={"Authorization": "Bearer cat_nope"})
    assert resp.status == 403
    assert (await resp.json())["code"] == "bad-token"
    assert await api.records() == before


# --- odd but valid PEM -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(lambda pem: pem.replace(b"\n", b"\r\n"), id="CRLF"),
        pytest.param(
            lambda pem: pem.replace(b"-----\n", b"-----\n\n").replace(
                b"\n-----END", b"\n\n-----END"
            ),
            id="blank lines inside blocks",
        ),
        pytest.param(
            lambda pem: b"\n\n  \n" + pem.replace(b"\n", b"\n \t\n") + b"\n\n",
            id="whitespace lines",
        ),
    ],
)
@pytest.mark.parametrize("as_json", [True, False])
async def test_odd_line_endings_are_accepted_and_normalised(
    api: Api, pki: PKI, mangle: Callable[[bytes], bytes], as_json: bool
) -> None:
    chain, key = issue(pki.ca, "crlf.example.test")
    odd_chain, odd_key = mangle(chain), mangle(key)
    assert odd_chain != chain
    if as_json:
        resp = await api.client.post(
            CERTS, json={"chain": odd_chain.decode(), "key": odd_key.decode()}, headers=api.auth
        )
    else:
        form = aiohttp.FormData()
        form.add_field("chain", odd_chain, filename="c.pem")
        form.add_field("key", odd_key, filename="k.pem")
        resp = await api.client.post(CERTS, data=form, headers=api.auth)
    assert resp.status == 201, await resp.text()
    stored = await api.store.lookup("crlf.example.test")
    assert stored is not None
    assert stored.bundle.pem == parse_bundle(chain, key).pem
    assert b"\r" not in stored.bundle.pem
    assert b"\n\n" not in stored.bundle.pem
