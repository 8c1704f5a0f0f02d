"""AcmeClient against a scripted CA in memory: nonces, badNonce, errors, polling, deadlines."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from cryptography import x509

from certagent.acme import (
    AccountDoesNotExist,
    AccountKey,
    AcmeClient,
    AcmeDeadline,
    AcmeError,
    AcmeProblem,
    AcmeProtocolError,
    CaUnavailable,
    ChallengeFailed,
    ExternalAccountBinding,
    ExternalAccountRequired,
    OrderFailed,
    ProfileNotOffered,
    RateLimited,
    UserActionRequired,
)
from certagent.acme._connection import BAD_NONCE_RETRIES, DIRECTORY_TTL
from certagent.acme.ari import cert_id
from certagent.acme.jws import b64url
from certagent.acme.transport import HttpResponse
from certagent.errors import AgentError, ConfigError
from certagent.testing.certs import cert_pem, issue_cert, make_ca, shared_key
from tests.unit.acme.fakeca import (
    BASE,
    DIRECTORY_URL,
    FakeCa,
    FakeClock,
    Sent,
    directory,
    json_response,
    problem,
)

ACCOUNT = f"{BASE}/acct/1"
ORDER_URL = f"{BASE}/order/1"
AUTHZ_URL = f"{BASE}/authz/1"
CHALL_URL = f"{BASE}/chall/1"
TOKEN = "DGyRejmCefe7v4NfDGDKfA_Ga1nF3Q-x4lc3dGc8Uuo"


@pytest.fixture(scope="module")
def key() -> AccountKey:
    return AccountKey.generate()


@pytest.fixture
def ca() -> FakeCa:
    return FakeCa()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def client(ca: FakeCa, clock: FakeClock, key: AccountKey) -> AcmeClient:
    return AcmeClient(DIRECTORY_URL, key, account_url=ACCOUNT, transport=ca, clock=clock.clock())


def order_doc(status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {
        "status": status,
        "identifiers": [{"type": "dns", "value": "a.example.org"}],
        "authorizations": [AUTHZ_URL],
        "finalize": f"{ORDER_URL}/finalize",
        **extra,
    }


def authz_doc(
    status: str = "pending", chall_status: str = "pending", **chall: Any
) -> dict[str, Any]:
    return {
        "status": status,
        "identifier": {"type": "dns", "value": "a.example.org"},
        "challenges": [
            {"type": "http-01", "url": CHALL_URL, "status": chall_status, "token": TOKEN, **chall}
        ],
    }


def created(doc: dict[str, Any], location: str) -> HttpResponse:
    return json_response(doc, 201, {"location": location})


# --- nonces -------------------------------------------------------------------------------


async def test_nonce_fetched_once_then_taken_from_responses(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", ORDER_URL, json_response(order_doc()))
    for _ in range(3):
        await client.order(ORDER_URL)
    assert len(ca.requests("HEAD")) == 1 and len(ca.requests("GET")) == 1
    posts = ca.requests("POST")
    assert [p.protected["nonce"] for p in posts] == ["nonce1", "nonce2", "nonce3"]
    assert all(p.protected["kid"] == ACCOUNT and p.payload is None for p in posts)
    assert all(p.headers["Content-Type"] == "application/jose+json" for p in posts)


async def test_bad_nonce_is_retried_with_the_nonce_it_came_with(
    ca: FakeCa, client: AcmeClient
) -> None:
    ca.route(
        "POST",
        ORDER_URL,
        problem(
            "badNonce", "JWS has an invalid anti-replay nonce", headers={"replay-nonce": "fresh1"}
        ),
        problem("badNonce", "again", headers={"replay-nonce": "fresh2"}),
        json_response(order_doc()),
    )
    order = await client.order(ORDER_URL)
    assert order.status == "pending"
    nonces = [p.protected["nonce"] for p in ca.requests("POST")]
    assert nonces[1:] == ["fresh1", "fresh2"]


async def test_bad_nonce_retries_are_bounded(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", ORDER_URL, problem("badNonce", "always"))
    with pytest.raises(AcmeProblem, match="badNonce"):
        await client.order(ORDER_URL)
    assert len(ca.requests("POST")) == BAD_NONCE_RETRIES + 1


async def test_nonce_pool_ignores_hostile_nonces_and_is_bounded(
    ca: FakeCa, client: AcmeClient
) -> None:
    ca.route("HEAD", f"{BASE}/nonce", HttpResponse(200, {"replay-nonce": "bad nonce\r\nX: 1"}))
    with pytest.raises(AcmeProtocolError, match="no valid Replay-Nonce"):
        await client.order(ORDER_URL)
    for i in range(100):
        client._nonces.append(f"n{i}")
    assert len(client._nonces) == 32


async def test_new_nonce_failure_is_reported(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("HEAD", f"{BASE}/nonce", HttpResponse(503, {"retry-after": "7"}))
    with pytest.raises(CaUnavailable) as caught:
        await client.order(ORDER_URL)
    assert caught.value.retry_after == 7


# --- directory ---------------------------------------------------------------------------


async def test_directory_is_cached_for_an_hour(
    ca: FakeCa, client: AcmeClient, clock: FakeClock
) -> None:
    await client.directory()
    await client.directory()
    assert len(ca.requests("GET", DIRECTORY_URL)) == 1
    clock.now += DIRECTORY_TTL + 1
    await client.directory()
    await client.directory(refresh=True)
    assert len(ca.requests("GET", DIRECTORY_URL)) == 3


async def test_directory_errors(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("GET", DIRECTORY_URL, HttpResponse(200, {}, b"<html>"))
    with pytest.raises(AcmeProtocolError, match="not valid JSON"):
        await client.directory()
    ca.route("GET", DIRECTORY_URL, HttpResponse(502, {}, b"<html>Bad Gateway</html>"))
    with pytest.raises(CaUnavailable, match=r"502.*Bad Gateway"):
        await client.directory()
    ca.route("GET", DIRECTORY_URL, HttpResponse(301, {"location": "https://elsewhere/"}))
    with pytest.raises(AcmeProtocolError, match="redirect"):
        await client.directory()


@pytest.mark.parametrize("url", ["", "ftp://ca/dir", "/dir", "https://"])
def test_directory_url_is_checked(url: str, key: AccountKey) -> None:
    with pytest.raises(ConfigError):
        AcmeClient(url, key, transport=FakeCa())


# --- accounts -----------------------------------------------------------------------------


async def test_register_sends_jwk_contact_terms_and_eab(
    ca: FakeCa, clock: FakeClock, key: AccountKey
) -> None:
    ca.route("POST", f"{BASE}/acct", created({"status": "valid"}, ACCOUNT))
    client = AcmeClient(DIRECTORY_URL, key, transport=ca, clock=clock.clock())
    eab = ExternalAccountBinding("kid-1", b"k" * 32)
    account = await client.register(
        contact=["ops@example.org", "mailto:x@example.org"], terms_agreed=True, eab=eab
    )
    assert account.created and account.url == ACCOUNT == client.account_url
    sent = ca.requests("POST")[0]
    assert sent.protected["jwk"] == key.jwk and "kid" not in sent.protected
    assert sent.payload["contact"] == ["mailto:ops@example.org", "mailto:x@example.org"]
    assert sent.payload["termsOfServiceAgreed"] is True
    binding = sent.payload["externalAccountBinding"]
    assert set(binding) == {"protected", "payload", "signature"}


async def test_existing_account_and_only_return_existing(
    ca: FakeCa, clock: FakeClock, key: AccountKey
) -> None:
    ca.route("POST", f"{BASE}/acct", json_response({"status": "valid"}, 200, {"location": ACCOUNT}))
    client = AcmeClient(DIRECTORY_URL, key, transport=ca, clock=clock.clock())
    account = await client.find_account()
    assert not account.created and client.account_url == ACCOUNT
    assert ca.requests("POST")[0].payload == {"onlyReturnExisting": True}
    ca.route("POST", f"{BASE}/acct", problem("accountDoesNotExist", "No account by that key"))
    with pytest.raises(AccountDoesNotExist, match="register the account again"):
        await client.find_account()


async def test_account_answer_without_location(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", f"{BASE}/acct", json_response({"status": "valid"}, 201))
    with pytest.raises(AcmeProtocolError, match="Location"):
        await client.register()
    ca.route("POST", f"{BASE}/acct", created({"status": "valid"}, "http://ca.test/acct/1"))
    with pytest.raises(AcmeProtocolError, match="Location"):
        await client.register()


async def test_eab_required_by_the_directory_fails_before_sending(
    ca: FakeCa, client: AcmeClient
) -> None:
    ca.route(
        "GET",
        DIRECTORY_URL,
        json_response(directory(meta={"externalAccountRequired": True})),
    )
    with pytest.raises(ExternalAccountRequired, match="external account binding"):
        await client.register(terms_agreed=True)
    assert ca.requests("POST") == []


async def test_eab_required_by_the_ca(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", f"{BASE}/acct", problem("externalAccountRequired", "EAB required"))
    with pytest.raises(ExternalAccountRequired):
        await client.register()


async def test_requests_that_need_an_account(ca: FakeCa, clock: FakeClock, key: AccountKey) -> None:
    client = AcmeClient(DIRECTORY_URL, key, transport=ca, clock=clock.clock())
    with pytest.raises(AcmeError, match="no ACME account"):
        await client.new_order(["a.example.org"])


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "error", "text"),
    [
        (problem("rateLimited", "too many", 429, {"retry-after": "30"}), RateLimited, "30 s"),
        (HttpResponse(429, {"retry-after": "5"}, b""), RateLimited, "5.0 s"),
        (problem("rateLimited", "no header", 429), RateLimited, "no Retry-After"),
        (problem("serverInternal", "oops", 500), CaUnavailable, "oops"),
        (HttpResponse(503, {"retry-after": "120"}, b"down"), CaUnavailable, "120 s"),
        (problem("accountDoesNotExist", "gone"), AccountDoesNotExist, "gone"),
        (problem("userActionRequired", "new terms", 403), UserActionRequired, "operator"),
        (problem("rejectedIdentifier", "not here"), AcmeProblem, "rejectedIdentifier"),
        (problem("unauthorized", "no", 403), AcmeProblem, "403 unauthorized"),
    ],
)
async def test_error_mapping(
    ca: FakeCa, client: AcmeClient, response: HttpResponse, error: type[AcmeError], text: str
) -> None:
    ca.route("POST", f"{BASE}/order", response)
    with pytest.raises(error, match=text) as caught:
        await client.new_order(["a.example.org"])
    assert isinstance(caught.value, AgentError)
    assert f"{BASE}/order" in str(caught.value)


async def test_retry_after_as_http_date(ca: FakeCa, client: AcmeClient, clock: FakeClock) -> None:
    clock.now = 1_792_479_600.0  # Tue, 20 Oct 2026 07:00:00 GMT
    header = {"retry-after": "Tue, 20 Oct 2026 07:01:30 GMT"}
    ca.route("POST", f"{BASE}/order", problem("rateLimited", "slow down", 429, header))
    with pytest.raises(RateLimited) as caught:
        await client.new_order(["a.example.org"])
    assert caught.value.retry_after == 90
    assert caught.value.problem.code == "rateLimited" and caught.value.status == 429


# --- orders -------------------------------------------------------------------------------


async def test_new_order(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", f"{BASE}/order", created(order_doc(), ORDER_URL))
    order = await client.new_order(["A.example.org", "a.example.org", "*.example.org"])
    assert order.url == ORDER_URL and order.authorizations == (AUTHZ_URL,)
    assert ca.requests("POST")[0].payload == {
        "identifiers": [
            {"type": "dns", "value": "a.example.org"},
            {"type": "dns", "value": "*.example.org"},
        ]
    }


async def test_profile_offered_is_sent(ca: FakeCa, client: AcmeClient) -> None:
    meta = {"profiles": {"classic": "90 days", "shortlived": "6 days"}}
    ca.route("GET", DIRECTORY_URL, json_response(directory(meta=meta)))
    ca.route("POST", f"{BASE}/order", created(order_doc(profile="shortlived"), ORDER_URL))
    order = await client.new_order(["a.example.org"], profile="shortlived")
    assert order.profile == "shortlived"
    assert ca.requests("POST")[0].payload["profile"] == "shortlived"
    with pytest.raises(ProfileNotOffered, match="offers: classic, shortlived") as caught:
        await client.new_order(["a.example.org"], profile="tlsserver")
    assert caught.value.offered == ("classic", "shortlived")


async def test_profile_without_any_on_offer(ca: FakeCa, client: AcmeClient) -> None:
    with pytest.raises(ProfileNotOffered, match="none"):
        await client.new_order(["a.example.org"], profile="classic")
    assert ca.requests("POST") == []


async def test_replaces_only_with_ari(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", f"{BASE}/order", created(order_doc(), ORDER_URL))
    await client.new_order(["a.example.org"], replaces="aYhb.AIdl")
    assert "replaces" not in ca.requests("POST")[-1].payload
    ca.route("GET", DIRECTORY_URL, json_response(directory(renewalInfo=f"{BASE}/ari")))
    await client.directory(refresh=True)
    await client.new_order(["a.example.org"], replaces="aYhb.AIdl")
    assert ca.requests("POST")[-1].payload["replaces"] == "aYhb.AIdl"


async def test_answer_challenge_posts_an_empty_object(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", AUTHZ_URL, json_response(authz_doc()))
    ca.route(
        "POST",
        CHALL_URL,
        json_response(
            {"type": "http-01", "url": CHALL_URL, "status": "processing", "token": TOKEN}
        ),
    )
    authz = await client.authorization(AUTHZ_URL)
    challenge = authz.challenges[0]
    assert client.key_authorization(challenge) == f"{TOKEN}.{client.account_key.thumbprint}"
    answered = await client.answer_challenge(challenge)
    assert answered.status == "processing"
    sent = ca.requests("POST", CHALL_URL)[0]
    assert sent.jws["payload"] == b64url(b"{}") and sent.payload == {}


def _sequence(*docs: dict[str, Any], headers: dict[str, str] | None = None) -> list[HttpResponse]:
    return [json_response(doc, 200, headers) for doc in docs]


async def test_poll_authorization_backs_off(
    ca: FakeCa, client: AcmeClient, clock: FakeClock
) -> None:
    ca.route(
        "POST",
        AUTHZ_URL,
        *_sequence(authz_doc(), authz_doc(), authz_doc(), authz_doc("valid", "valid")),
    )
    authz = await client.poll_authorization(AUTHZ_URL, deadline=client.deadline(10))
    assert authz.status == "valid"
    assert clock.sleeps == pytest.approx([0.1, 0.15, 0.225])


async def test_poll_honours_retry_after(ca: FakeCa, client: AcmeClient, clock: FakeClock) -> None:
    ca.route(
        "POST",
        ORDER_URL,
        json_response(order_doc("processing"), 200, {"retry-after": "3"}),
        json_response(order_doc("valid", certificate=f"{BASE}/cert/1")),
    )
    order = await client.poll_order(ORDER_URL, deadline=client.deadline(10))
    assert order.status == "valid" and clock.sleeps == [3.0]


async def test_poll_stops_at_the_deadline(ca: FakeCa, client: AcmeClient, clock: FakeClock) -> None:
    ca.route("POST", AUTHZ_URL, json_response(authz_doc(), 200, {"retry-after": "60"}))
    with pytest.raises(AcmeDeadline, match="still pending") as caught:
        await client.poll_authorization(AUTHZ_URL, deadline=client.deadline(5))
    assert clock.sleeps == [5.0] and caught.value.url == AUTHZ_URL
    posts = ca.requests("POST", AUTHZ_URL)
    assert len(posts) == 2 and posts[-1].timeout == pytest.approx(0.05)


async def test_requests_in_a_poll_get_at_most_the_time_left(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", ORDER_URL, json_response(order_doc("ready")))
    await client.poll_order(ORDER_URL, deadline=client.deadline(2.5))
    await client.poll_order(ORDER_URL, deadline=client.deadline(60))
    assert [s.timeout for s in ca.requests("POST", ORDER_URL)] == [2.5, 10.0]


async def test_invalid_authorization_says_what_the_ca_saw(ca: FakeCa, client: AcmeClient) -> None:
    error = {
        "type": "urn:ietf:params:acme:error:connection",
        "detail": "127.0.0.1: Fetching http://a.example.org/.well-known/acme-challenge/x: "
        "Connection refused",
        "status": 400,
    }
    ca.route("POST", AUTHZ_URL, json_response(authz_doc("invalid", "invalid", error=error)))
    with pytest.raises(
        ChallengeFailed, match=r"could not validate a\.example\.org by http-01"
    ) as caught:
        await client.poll_authorization(AUTHZ_URL, deadline=client.deadline(5))
    assert caught.value.problem is not None and caught.value.problem.code == "connection"
    assert "Connection refused" in str(caught.value)
    assert isinstance(caught.value, OrderFailed)


@pytest.mark.parametrize("status", ["deactivated", "expired", "revoked"])
async def test_other_final_authorization_states(
    ca: FakeCa, client: AcmeClient, status: str
) -> None:
    ca.route("POST", AUTHZ_URL, json_response(authz_doc(status)))
    with pytest.raises(ChallengeFailed, match=f"authorization {status}"):
        await client.poll_authorization(AUTHZ_URL, deadline=client.deadline(5))


async def test_invalid_order(ca: FakeCa, client: AcmeClient) -> None:
    error = {"type": "urn:ietf:params:acme:error:badCSR", "detail": "key too small"}
    ca.route("POST", ORDER_URL, json_response(order_doc("invalid", error=error)))
    with pytest.raises(OrderFailed, match="badCSR: key too small"):
        await client.poll_order(ORDER_URL, deadline=client.deadline(5))


async def test_finalize_sends_the_csr(ca: FakeCa, client: AcmeClient) -> None:
    ca.route("POST", f"{ORDER_URL}/finalize", json_response(order_doc("processing")))
    ca.route("POST", ORDER_URL, json_response(order_doc("ready")))
    order = await client.order(ORDER_URL)
    done = await client.finalize(order, b"\x30\x03\x02\x01\x00")
    assert done.status == "processing" and done.url == ORDER_URL
    assert ca.requests("POST", f"{ORDER_URL}/finalize")[0].payload == {"csr": "MAMCAQA"}


# --- certificates, ARI, revocation ------------------------------------------------------------


async def test_certificate_download(ca: FakeCa, client: AcmeClient) -> None:
    pki = make_ca()
    leaf = issue_cert(pki, "a.example.org", key=shared_key())
    chain = cert_pem(leaf) + pki.chain_pem
    ca.route(
        "POST", f"{BASE}/cert/1", HttpResponse(200, {}, b"\r\n" + chain.replace(b"\n", b"\r\n"))
    )
    assert await client.certificate(f"{BASE}/cert/1") == chain
    assert ca.requests("POST")[0].headers["Accept"] == "application/pem-certificate-chain"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not pem",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n",
    ],
)
async def test_bad_certificate_downloads(ca: FakeCa, client: AcmeClient, body: bytes) -> None:
    ca.route("POST", f"{BASE}/cert/1", HttpResponse(200, {}, body))
    with pytest.raises(AcmeProtocolError):
        await client.certificate(f"{BASE}/cert/1")


async def test_renewal_info(ca: FakeCa, client: AcmeClient) -> None:
    pki = make_ca()
    leaf = issue_cert(pki, "a.example.org", key=shared_key())
    assert await client.renewal_info(leaf) is None  # no renewalInfo in the directory
    ca.route("GET", DIRECTORY_URL, json_response(directory(renewalInfo=f"{BASE}/ari/")))
    await client.directory(refresh=True)
    window = {"suggestedWindow": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z"}}
    url = f"{BASE}/ari/{cert_id(leaf)}"
    ca.route("GET", url, json_response(window, 200, {"retry-after": "21600"}))
    info = await client.renewal_info(leaf)
    assert info is not None and info.retry_after == 21600 and info.end.day == 2
    sent = ca.requests("GET", url)[0]
    assert sent.body is None and sent.headers["Accept"] == "application/json"
    ca.route("GET", url, problem("malformed", "unknown certificate", 404))
    with pytest.raises(AcmeProblem, match="404"):
        await client.renewal_info(cert_id(leaf))


async def test_revoke(ca: FakeCa, client: AcmeClient) -> None:
    pki = make_ca()
    leaf = issue_cert(pki, "a.example.org", key=shared_key())
    ca.route("POST", f"{BASE}/revoke", HttpResponse(200))
    await client.revoke(leaf, reason=4)
    payload = ca.requests("POST")[0].payload
    assert payload["reason"] == 4
    assert (
        x509.load_der_x509_certificate(
            __import__("base64").urlsafe_b64decode(payload["certificate"] + "==")
        )
        == leaf
    )


async def test_no_key_material_in_logs(
    ca: FakeCa, clock: FakeClock, key: AccountKey, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="certagent")
    ca.route("POST", f"{BASE}/acct", created({"status": "valid"}, ACCOUNT))
    ca.route("POST", f"{BASE}/order", problem("badNonce", "x"), created(order_doc(), ORDER_URL))
    async with AcmeClient(DIRECTORY_URL, key, transport=ca, clock=clock.clock()) as client:
        await client.register(eab=ExternalAccountBinding("kid", b"hmac-secret-bytes"))
        await client.new_order(["a.example.org"])
    assert ca.closed
    text = caplog.text
    assert "registered" in text and "badNonce" in text
    assert "PRIVATE" not in text and "hmac-secret" not in text
    assert key.jwk["x"] not in text


def test_sent_helper_decodes(key: AccountKey) -> None:
    from certagent.acme.jws import sign_request

    sent = Sent("POST", "u", sign_request(key, {"a": 1}, url="u", nonce="n", kid="k"), {}, 1.0)
    assert sent.payload == {"a": 1} and json.loads(sent.body or b"")["signature"]
