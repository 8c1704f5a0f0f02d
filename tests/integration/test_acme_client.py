"""The ACME client against Debian's pebble on loopback (certagent.testing.pebble).

Challenges are answered by tiny in-test servers on the ports pebble validates on:
an aiohttp app for HTTP-01 and an asyncio TLS server offering ``acme-tls/1`` for
TLS-ALPN-01.  What pebble 2.4 lacks (profiles, renewalInfo, a 429) comes from a
small HTTPS proxy in front of it that forwards everything else unchanged (the Host
header included, so pebble's URLs point at the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certagent.acme import (
    ACME_TLS_ALPN,
    HTTP01_PREFIX,
    AccountDoesNotExist,
    AccountKey,
    AcmeClient,
    AcmeProblem,
    AcmeProtocolError,
    Authorization,
    CaUnavailable,
    CertKeyType,
    Challenge,
    ExternalAccountBinding,
    ExternalAccountRequired,
    IssuedCertificate,
    ProfileNotOffered,
    RateLimited,
    cert_id,
    obtain_certificate,
    tls_alpn01_certificate,
)
from certagent.acme.jws import b64url
from certagent.errors import ConfigError
from certagent.testing import free_port
from certagent.testing.acmeproxy import AcmeProxy
from certagent.testing.pebble import Pebble
from certagent.testing.tlsclient import handshake_async
from tests.integration.pebblerun import running

# Not skipped without pebble: Pebble.start() fails saying "run scripts/install.sh".
pytestmark = pytest.mark.integration

EAB_KID = "kid-certagent"
EAB_KEY = b64url(b"certagent test EAB MAC key, 32+ bytes long")


# --- pebble ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pebble(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Pebble]:
    """One pebble for the module, with its defaults: 5 % of good nonces rejected."""
    with running(Pebble(tmp_path_factory.mktemp("pebble")), request) as ca:
        yield ca


@pytest.fixture
def own_pebble(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pebble]:
    """A pebble of the test's own, for tests that stop or restart it."""
    with running(Pebble(tmp_path / "pebble", nonce_reject=0), request) as ca:
        yield ca


def client_for(
    ca: Pebble, key: AccountKey | None = None, *, url: str | None = None, timeout: float = 5
) -> AcmeClient:
    return AcmeClient(
        url or ca.directory_url,
        key or AccountKey.generate(),
        ca_file=str(ca.ca_file),
        request_timeout=timeout,
    )


async def registered(ca: Pebble, key: AccountKey | None = None, **kw: Any) -> AcmeClient:
    client = client_for(ca, key, **kw)
    await client.register(terms_agreed=True, contact=["ops@example.org"])
    return client


# --- challenge responders ---------------------------------------------------------------------


@dataclass
class Http01Solver:
    """Answers HTTP-01 from a dict served by an aiohttp app on pebble's httpPort."""

    challenge_types: Sequence[str] = ("http-01",)
    answers: dict[str, str] = field(default_factory=dict)
    fetched: int = 0

    async def present(self, authz: Authorization, challenge: Challenge, keyauth: str) -> None:
        assert challenge.token is not None
        self.answers[challenge.token] = keyauth

    async def cleanup(self, authz: Authorization, challenge: Challenge) -> None:
        assert challenge.token is not None
        del self.answers[challenge.token]

    async def handle(self, request: web.Request) -> web.Response:
        self.fetched += 1
        answer = self.answers.get(request.match_info["token"])
        if answer is None:
            return web.Response(status=404, text="no such challenge\n")
        return web.Response(text=answer)


@contextlib.asynccontextmanager
async def http01(port: int) -> AsyncIterator[Http01Solver]:
    solver = Http01Solver()
    app = web.Application()
    app.router.add_get(HTTP01_PREFIX + "{token}", solver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield solver
    finally:
        await runner.cleanup()


@dataclass
class TlsAlpnSolver:
    """Answers TLS-ALPN-01: an asyncio TLS server that picks the RFC 8737 cert by SNI."""

    workdir: Path
    challenge_types: Sequence[str] = ("tls-alpn-01",)
    contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)
    handshakes: int = 0

    async def present(self, authz: Authorization, challenge: Challenge, keyauth: str) -> None:
        made = tls_alpn01_certificate(authz.identifier.value, keyauth)
        path = self.workdir / f"{made.name}.pem"
        path.write_bytes(made.pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols([ACME_TLS_ALPN])
        context.load_cert_chain(path)
        self.contexts[made.name] = context

    async def cleanup(self, authz: Authorization, challenge: Challenge) -> None:
        del self.contexts[authz.identifier.value]

    def server_context(self) -> ssl.SSLContext:
        default = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        default.set_alpn_protocols([ACME_TLS_ALPN])
        placeholder = tls_alpn01_certificate("placeholder.invalid", "x.y")
        path = self.workdir / "placeholder.pem"
        path.write_bytes(placeholder.pem)
        default.load_cert_chain(path)

        def by_name(tls: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
            context = self.contexts.get(name or "")
            if context is not None:
                tls.context = context
                self.handshakes += 1

        default.sni_callback = by_name  # type: ignore[assignment]
        return default


@contextlib.asynccontextmanager
async def tls_alpn01(port: int, workdir: Path) -> AsyncIterator[TlsAlpnSolver]:
    solver = TlsAlpnSolver(workdir)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == ACME_TLS_ALPN
        writer.close()

    server = await asyncio.start_server(
        serve, "127.0.0.1", port, ssl=solver.server_context(), ssl_handshake_timeout=5
    )
    try:
        yield solver
    finally:
        server.close()
        await server.wait_closed()


async def verify(issued: IssuedCertificate, ca: Pebble, tmp_path: Path) -> None:
    """Serve the issued chain and key; a client trusting pebble's root verifies every name."""
    root = tmp_path / f"pebble-root-{time.monotonic_ns()}.pem"
    root.write_bytes(ca.roots_pem())
    bundle = tmp_path / f"issued-{time.monotonic_ns()}.pem"
    bundle.write_bytes(issued.pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(bundle)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    port = free_port()
    server = await asyncio.start_server(serve, "127.0.0.1", port, ssl=server_ctx)
    try:
        client_ctx = ssl.create_default_context(cafile=str(root))
        for name in issued.names:
            info = await handshake_async(port, name, client_ctx)
            assert name in info.san
        with pytest.raises(ssl.SSLCertVerificationError):
            await handshake_async(port, "other.example.org", client_ctx)
    finally:
        server.close()
        await server.wait_closed()


# --- accounts ---------------------------------------------------------------------------------


async def test_register_then_find_the_account(pebble: Pebble) -> None:
    key = AccountKey.generate()
    async with client_for(pebble, key) as client:
        account = await client.register(terms_agreed=True, contact=["ops@example.org"])
        assert account.created and account.status == "valid"
        assert account.contact == ("mailto:ops@example.org",)
        again = await client.register(terms_agreed=True)
        assert not again.created and again.url == account.url
    async with client_for(pebble, key) as client:
        found = await client.find_account()
        assert found.url == account.url and client.account_url == account.url
    async with client_for(pebble) as stranger:
        with pytest.raises(AccountDoesNotExist, match="register the account again"):
            await stranger.find_account()


async def test_rsa_account_key(pebble: Pebble, tmp_path: Path) -> None:
    client = await registered(pebble, AccountKey.generate("rsa"))
    async with client, http01(pebble.http_port) as solver:
        issued = await obtain_certificate(client, ["rsa-account.example.org"], solver)
    await verify(issued, pebble, tmp_path)


async def test_external_account_binding(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    ca = Pebble(tmp_path / "pebble", eab_required=True, eab_keys={EAB_KID: EAB_KEY})
    with running(ca, request):
        async with client_for(ca) as client:
            with pytest.raises(ExternalAccountRequired, match="external account binding"):
                await client.register(terms_agreed=True)
            assert ca.requests("POST", "/sign-me-up") == 0  # refused before asking
            wrong = ExternalAccountBinding.from_b64(EAB_KID, b64url(b"not the key"))
            with pytest.raises(AcmeProblem, match="sign-me-up"):
                await client.register(terms_agreed=True, eab=wrong)
            unknown = ExternalAccountBinding.from_b64("kid-unknown", EAB_KEY)
            with pytest.raises(AcmeProblem):
                await client.register(terms_agreed=True, eab=unknown)
            good = ExternalAccountBinding.from_b64(EAB_KID, EAB_KEY)
            account = await client.register(terms_agreed=True, eab=good)
            assert account.created and account.status == "valid"
            async with http01(ca.http_port) as solver:
                issued = await obtain_certificate(client, ["eab.example.org"], solver)
            assert issued.names == ("eab.example.org",)


# --- certificates ---------------------------------------------------------------------------


@pytest.mark.parametrize("key_type", ["ecdsa", "rsa"])
async def test_http01_certificate(pebble: Pebble, tmp_path: Path, key_type: CertKeyType) -> None:
    names = [f"http-{key_type}.example.org", f"www.http-{key_type}.example.org"]
    async with await registered(pebble) as client, http01(pebble.http_port) as solver:
        issued = await obtain_certificate(client, names, solver, key_type=key_type)
    assert issued.names == tuple(names) and solver.answers == {}
    assert solver.fetched >= 2  # pebble validates from several connections
    public = x509.load_pem_x509_certificate(issued.chain_pem).public_key()
    if key_type == "ecdsa":
        assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    else:
        assert isinstance(public, rsa.RSAPublicKey) and public.key_size == 2048
    await verify(issued, pebble, tmp_path)


async def test_tls_alpn01_certificate(pebble: Pebble, tmp_path: Path) -> None:
    names = ["alpn.example.org", "www.alpn.example.org"]
    async with (
        await registered(pebble) as client,
        tls_alpn01(pebble.tls_port, tmp_path) as solver,
    ):
        issued = await obtain_certificate(client, names, solver)
    assert solver.contexts == {} and solver.handshakes >= 2
    await verify(issued, pebble, tmp_path)


async def test_both_key_types_for_one_name(pebble: Pebble, tmp_path: Path) -> None:
    name = "both.example.org"
    async with await registered(pebble) as client, http01(pebble.http_port) as solver:
        issued = [
            await obtain_certificate(client, [name], solver, key_type=kind)
            for kind in ("ecdsa", "rsa")
        ]
    assert [i.key_type for i in issued] == ["ecdsa", "rsa"]
    assert issued[0].key_pem != issued[1].key_pem
    for one in issued:
        await verify(one, pebble, tmp_path)


async def test_twenty_orders_through_pebbles_nonce_rejection(
    pebble: Pebble, caplog: pytest.LogCaptureFixture
) -> None:
    """Pebble rejects 5 % of good nonces: every badNonce is retried, no order fails."""
    caplog.set_level(logging.DEBUG, logger="certagent.acme")
    before, issued_before = pebble.orders(), pebble.certificates()
    async with await registered(pebble) as client, http01(pebble.http_port) as solver:
        issued = await asyncio.gather(
            *(obtain_certificate(client, [f"n{i}.nonce.example.org"], solver) for i in range(20))
        )
    assert len({i.chain_pem for i in issued}) == 20
    assert pebble.orders() - before == 20
    assert pebble.certificates() - issued_before == 20
    retries = caplog.text.count("ACME badNonce")
    print(f"badNonce answers retried over 20 orders: {retries}")


async def test_bad_nonce_retries_are_bounded(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with running(Pebble(tmp_path / "pebble", nonce_reject=100), request) as ca:
        async with client_for(ca) as client:
            with pytest.raises(AcmeProblem, match="badNonce"):
                await client.register(terms_agreed=True)
        assert ca.requests("POST", "/sign-me-up") == 6  # the first try and 5 retries


# --- a CA that forgot us, a CA that is down -------------------------------------------------


async def test_account_does_not_exist_after_a_pebble_restart(own_pebble: Pebble) -> None:
    key = AccountKey.generate()
    async with await registered(own_pebble, key) as client:
        own_pebble.restart_ca()
        with pytest.raises(AccountDoesNotExist, match="register the account again"):
            await client.new_order(["restart.example.org"])
        account = await client.register(terms_agreed=True)
        assert account.created
        async with http01(own_pebble.http_port) as solver:
            await obtain_certificate(client, ["restart.example.org"], solver)


async def test_ca_down_is_ca_unavailable_quickly(own_pebble: Pebble) -> None:
    """A stopped CA is known at once (connection refused), not after a request timeout."""
    async with await registered(own_pebble, timeout=30) as client:
        own_pebble.stop_ca()
        started = time.monotonic()
        with pytest.raises(CaUnavailable, match=r"cannot reach the ACME CA .*retried later"):
            await client.new_order(["down.example.org"])
        async with client_for(own_pebble, timeout=30) as fresh:
            with pytest.raises(CaUnavailable):
                await fresh.directory()
        elapsed = time.monotonic() - started
        assert elapsed < 5.0, f"took {elapsed:.2f} s"
        own_pebble.start_ca()
        await client.register(terms_agreed=True)  # a new pebble: a new account
        async with http01(own_pebble.http_port) as solver:
            await obtain_certificate(client, ["down.example.org"], solver)


# --- what pebble 2.4 lacks: a proxy adds profiles, renewalInfo and a 429 -------------------------


@contextlib.asynccontextmanager
async def double(ca: Pebble) -> AsyncIterator[AcmeProxy]:
    """:class:`AcmeProxy` (its own thread) for the duration of an async test."""
    proxy = await asyncio.to_thread(AcmeProxy(ca).start)
    try:
        yield proxy
    finally:
        await asyncio.to_thread(proxy.stop)


async def test_rate_limited_with_retry_after(pebble: Pebble) -> None:
    async with double(pebble) as proxy:
        proxy.rate_limit_orders = "17"
        async with await registered(pebble, url=proxy.directory_url) as client:
            started = time.monotonic()
            with pytest.raises(RateLimited, match="retry after 17 s") as caught:
                await client.new_order(["limited.example.org"])
            assert caught.value.retry_after == 17
            assert time.monotonic() - started < 2  # raised, not slept
            proxy.rate_limit_orders = "Wed, 21 Oct 2015 07:28:00 GMT"  # in the past
            with pytest.raises(RateLimited) as caught:
                await client.new_order(["limited.example.org"])
            assert caught.value.retry_after == 0


async def test_profile_selection(pebble: Pebble) -> None:
    async with double(pebble) as proxy:
        proxy.profiles = {"classic": "90 days", "shortlived": "6 days"}
        async with await registered(pebble, url=proxy.directory_url) as client:
            with pytest.raises(ProfileNotOffered, match="offers: classic, shortlived"):
                await client.new_order(["profile.example.org"], profile="tlsserver")
            assert proxy.new_orders == []
            async with http01(pebble.http_port) as solver:
                await obtain_certificate(
                    client, ["profile.example.org"], solver, profile="shortlived"
                )
    assert proxy.new_orders[-1]["profile"] == "shortlived"


async def test_renewal_info_and_replaces(pebble: Pebble) -> None:
    async with (
        double(pebble) as proxy,
        http01(pebble.http_port) as solver,
        await registered(pebble, url=proxy.directory_url) as client,
    ):
        issued = await obtain_certificate(client, ["ari.example.org"], solver)
        leaf = x509.load_pem_x509_certificate(issued.chain_pem)
        assert await client.renewal_info(leaf) is None  # no ARI in the directory yet
        ident = cert_id(leaf)
        windows = {
            ident: {
                "suggestedWindow": {
                    "start": "2026-01-02T04:00:00Z",
                    "end": "2026-01-03T04:00:00Z",
                },
                "explanationURL": "https://ca.example/incident",
            }
        }
        proxy.window = windows.get
        await client.directory(refresh=True)
        info = await client.renewal_info(leaf)
        assert info is not None and info.retry_after == 21600
        assert (info.start.day, info.end.day) == (2, 3)
        assert info.explanation_url == "https://ca.example/incident"
        await obtain_certificate(client, ["ari.example.org"], solver, replaces=ident)
    assert "replaces" not in proxy.new_orders[0]
    assert proxy.new_orders[-1]["replaces"] == ident


# --- the transport: bounded bodies, timeouts, trust ---------------------------------------------


@contextlib.asynccontextmanager
async def https_server(ca: Pebble, handler: Any) -> AsyncIterator[str]:
    """An HTTPS server on 127.0.0.1 with pebble's endpoint certificate; yields its /dir URL."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.endpoint_cert, ca.endpoint_key)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    try:
        yield f"https://127.0.0.1:{port}/dir"
    finally:
        await runner.cleanup()


async def test_transport_bounds_bodies_and_time(pebble: Pebble) -> None:
    big = b"{" + b" " * (2 << 20) + b"}"
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("kind") == "slow":
            await asyncio.wait_for(release.wait(), 30)
        if request.query.get("kind") == "chunked":
            response = web.StreamResponse()
            await response.prepare(request)
            for _ in range(40):
                await response.write(b" " * 65536)
            return response
        return web.Response(body=big, content_type="application/json")

    async with https_server(pebble, handler) as url:
        for kind in ("sized", "chunked"):
            async with client_for(pebble, url=f"{url}?kind={kind}") as client:
                with pytest.raises(AcmeProtocolError, match=r"(more|larger) than"):
                    await client.directory()
        async with client_for(pebble, url=f"{url}?kind=slow", timeout=0.3) as client:
            started = time.monotonic()
            with pytest.raises(CaUnavailable, match=r"did not answer within 0\.3 s"):
                await client.directory()
            assert time.monotonic() - started < 5
        release.set()
        async with AcmeClient(url, AccountKey.generate()) as untrusting:  # system trust store
            with pytest.raises(CaUnavailable, match="does not trust"):
                await untrusting.directory()
    with pytest.raises(ConfigError, match="trust bundle"):
        AcmeClient(url, AccountKey.generate(), ca_file="/nonexistent/ca.pem")
