"""obtain_certificate against a scripted CA that issues from the CSR it is sent."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from certagent.acme import (
    AccountKey,
    AcmeClient,
    AcmeDeadline,
    AcmeError,
    AcmeProtocolError,
    Authorization,
    Challenge,
    ChallengeFailed,
    obtain_certificate,
)
from certagent.acme.transport import HttpResponse
from certagent.errors import StoreUnavailable
from certagent.testing.certs import CA, cert_pem, make_ca, shared_key
from tests.unit.acme.fakeca import BASE, DIRECTORY_URL, FakeCa, FakeClock, Sent, b64d, json_response

TOKEN = "DGyRejmCefe7v4NfDGDKfA_Ga1nF3Q-x4lc3dGc8Uuo"
ORDER_URL = f"{BASE}/order/1"


@dataclass
class Solver:
    challenge_types: Sequence[str] = ("tls-alpn-01", "http-01")
    presented: list[tuple[str, str, str]] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    fail_cleanup: bool = False

    async def present(self, authz: Authorization, challenge: Challenge, keyauth: str) -> None:
        self.presented.append((authz.name, challenge.type, keyauth))

    async def cleanup(self, authz: Authorization, challenge: Challenge) -> None:
        self.cleaned.append(authz.name)
        if self.fail_cleanup:
            raise StoreUnavailable("the store went away")


class IssuingCa:
    """Scripts FakeCa as a CA that validates every answered challenge and signs the CSR."""

    def __init__(self, fake: FakeCa, names: Sequence[str], *, reuse: Sequence[str] = ()) -> None:
        self.fake = fake
        self.pki: CA = make_ca()
        self.names = list(names)
        self.answered: set[str] = set(reuse)
        self.order_status = "pending"
        self.certificate: bytes | None = None
        self.issue_for: Sequence[str] | None = None  # sign other names than asked
        self.wrong_key = False
        self.authz_final = "valid"
        fake.route("POST", f"{BASE}/order", self.new_order)
        fake.route("POST", ORDER_URL, self.order)
        fake.route("POST", f"{ORDER_URL}/finalize", self.finalize)
        fake.route("POST", f"{BASE}/cert/1", self.download)
        for i, name in enumerate(self.names):
            fake.route("POST", f"{BASE}/authz/{i}", self.authz_handler(i, name))
            fake.route("POST", f"{BASE}/chall/{i}", self.challenge_handler(name))

    def order_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.order_status,
            "identifiers": [{"type": "dns", "value": n} for n in self.names],
            "authorizations": [f"{BASE}/authz/{i}" for i in range(len(self.names))],
            "finalize": f"{ORDER_URL}/finalize",
        }
        if self.certificate is not None:
            doc["certificate"] = f"{BASE}/cert/1"
        return doc

    def new_order(self, sent: Sent) -> HttpResponse:
        if all(n in self.answered for n in self.names):
            self.order_status = "ready"
        return json_response(self.order_doc(), 201, {"location": ORDER_URL})

    def order(self, sent: Sent) -> HttpResponse:
        if self.order_status == "pending" and all(n in self.answered for n in self.names):
            self.order_status = "ready"
        elif self.order_status == "processing":
            self.order_status = "valid"
        return json_response(self.order_doc())

    def authz_handler(self, i: int, name: str) -> Any:
        def handle(sent: Sent) -> HttpResponse:
            status = self.authz_final if name in self.answered else "pending"
            chall_status = {"valid": "valid", "pending": "pending"}.get(status, "invalid")
            challenges = [
                {"type": t, "url": f"{BASE}/chall/{i}", "status": chall_status, "token": TOKEN}
                for t in ("http-01", "tls-alpn-01", "dns-01")
            ]
            if chall_status == "invalid":
                challenges[0]["error"] = {"type": "urn:ietf:params:acme:error:dns", "detail": "NX"}
            doc = {"status": status, "identifier": {"type": "dns", "value": name}}
            return json_response({**doc, "challenges": challenges})

        return handle

    def challenge_handler(self, name: str) -> Any:
        def handle(sent: Sent) -> HttpResponse:
            assert sent.payload == {}
            self.answered.add(name)
            doc = {"type": "tls-alpn-01", "url": sent.url, "status": "processing", "token": TOKEN}
            return json_response(doc)

        return handle

    def finalize(self, sent: Sent) -> HttpResponse:
        csr = x509.load_der_x509_csr(b64d(sent.payload["csr"]))
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = self.issue_for or san.get_values_for_type(x509.DNSName)
        public_key = shared_key().public_key() if self.wrong_key else csr.public_key()
        now = dt.datetime.now(dt.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(self.pki.cert.subject)
            .public_key(public_key)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=6))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
            .sign(self.pki.key, hashes.SHA256())
        )
        self.certificate = cert_pem(leaf) + self.pki.chain_pem
        self.order_status = "processing"
        return json_response(self.order_doc())

    def download(self, sent: Sent) -> HttpResponse:
        assert self.certificate is not None
        return HttpResponse(
            200, {"content-type": "application/pem-certificate-chain"}, self.certificate
        )


@pytest.fixture(scope="module")
def key() -> AccountKey:
    return AccountKey.generate()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_client(fake: FakeCa, key: AccountKey, clock: FakeClock) -> AcmeClient:
    return AcmeClient(
        DIRECTORY_URL, key, account_url=f"{BASE}/acct/1", transport=fake, clock=clock.clock()
    )


async def test_obtain_ecdsa_certificate(key: AccountKey, clock: FakeClock) -> None:
    fake = FakeCa()
    IssuingCa(fake, ["a.example.org", "b.example.org"])
    solver = Solver()
    client = make_client(fake, key, clock)
    issued = await obtain_certificate(client, ["a.example.org", "b.example.org"], solver)
    assert issued.names == ("a.example.org", "b.example.org") and issued.key_type == "ecdsa"
    leaf = x509.load_pem_x509_certificate(issued.chain_pem)
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    assert issued.pem.endswith(issued.key_pem) and "PRIVATE" not in repr(issued)
    assert sorted(p[0] for p in solver.presented) == ["a.example.org", "b.example.org"]
    assert {p[1] for p in solver.presented} == {"tls-alpn-01"}  # the solver's first choice
    assert all(p[2] == f"{TOKEN}.{key.thumbprint}" for p in solver.presented)
    assert sorted(solver.cleaned) == ["a.example.org", "b.example.org"]
    assert issued.order_url == ORDER_URL and issued.certificate_url == f"{BASE}/cert/1"


async def test_obtain_rsa_certificate_with_reused_authorizations(
    key: AccountKey, clock: FakeClock
) -> None:
    fake = FakeCa()
    IssuingCa(fake, ["a.example.org"], reuse=["a.example.org"])
    solver = Solver()
    issued = await obtain_certificate(
        make_client(fake, key, clock), ["a.example.org"], solver, key_type="rsa"
    )
    leaf = x509.load_pem_x509_certificate(issued.chain_pem)
    assert isinstance(leaf.public_key(), rsa.RSAPublicKey)
    assert solver.presented == [] and fake.requests("POST", f"{BASE}/authz/0") == []


async def test_validation_failure_still_cleans_up(key: AccountKey, clock: FakeClock) -> None:
    fake = FakeCa()
    ca = IssuingCa(fake, ["a.example.org"])
    ca.authz_final = "invalid"
    solver = Solver(challenge_types=("http-01",))
    with pytest.raises(ChallengeFailed, match="dns: NX"):
        await obtain_certificate(make_client(fake, key, clock), ["a.example.org"], solver)
    assert solver.cleaned == ["a.example.org"]


async def test_a_failing_cleanup_is_logged_not_raised(
    key: AccountKey, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeCa()
    IssuingCa(fake, ["a.example.org"])
    solver = Solver(fail_cleanup=True)
    await obtain_certificate(make_client(fake, key, clock), ["a.example.org"], solver)
    assert "could not remove the tls-alpn-01 answer for a.example.org" in caplog.text


async def test_no_challenge_the_solver_can_answer(key: AccountKey, clock: FakeClock) -> None:
    fake = FakeCa()
    IssuingCa(fake, ["a.example.org"])
    solver = Solver(challenge_types=("dns-account-01",))
    with pytest.raises(AcmeError, match="offers http-01, tls-alpn-01, dns-01"):
        await obtain_certificate(make_client(fake, key, clock), ["a.example.org"], solver)
    assert solver.presented == []


async def test_a_certificate_that_does_not_fit_is_refused(
    key: AccountKey, clock: FakeClock
) -> None:
    fake = FakeCa()
    ca = IssuingCa(fake, ["a.example.org"])
    ca.wrong_key = True
    with pytest.raises(AcmeProtocolError, match="does not fit our key"):
        await obtain_certificate(make_client(fake, key, clock), ["a.example.org"], Solver())
    fake = FakeCa()
    ca = IssuingCa(fake, ["a.example.org"])
    ca.issue_for = ["other.example.org"]
    with pytest.raises(AcmeProtocolError, match=r"lacks a\.example\.org"):
        await obtain_certificate(make_client(fake, key, clock), ["a.example.org"], Solver())


async def test_deadline_over_the_whole_flow(key: AccountKey, clock: FakeClock) -> None:
    fake = FakeCa()
    ca = IssuingCa(fake, ["a.example.org"])
    ca.authz_final = "pending"  # the CA never finishes validating
    solver = Solver()
    with pytest.raises(AcmeDeadline):
        await obtain_certificate(
            make_client(fake, key, clock), ["a.example.org"], solver, timeout=3
        )
    assert sum(clock.sleeps) == pytest.approx(3.0)
    assert solver.cleaned == ["a.example.org"]
