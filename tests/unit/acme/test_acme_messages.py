"""Parsing the CA's documents: what RFC 8555 says they hold, and hostile variations of them."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from certagent.acme._doc import MAX_BODY, parse_time
from certagent.acme.errors import AcmeProtocolError
from certagent.acme.messages import (
    parse_account,
    parse_authorization,
    parse_challenge,
    parse_directory,
    parse_order,
    parse_problem,
)
from certagent.acme.resources import Identifier, Problem

TOKEN = "DGyRejmCefe7v4NfDGDKfA_Ga1nF3Q-x4lc3dGc8Uuo"

# pebble 2.4.0's directory, as served on this machine
PEBBLE_DIRECTORY = {
    "keyChange": "https://127.0.0.1:14000/rollover-account-key",
    "meta": {
        "externalAccountRequired": False,
        "termsOfService": "data:text/plain,Do%20what%20thou%20wilt",
    },
    "newAccount": "https://127.0.0.1:14000/sign-me-up",
    "newNonce": "https://127.0.0.1:14000/nonce-plz",
    "newOrder": "https://127.0.0.1:14000/order-plz",
    "revokeCert": "https://127.0.0.1:14000/revoke-cert",
}

# shaped like Let's Encrypt's, with profiles and ARI
LE_DIRECTORY = {
    "keyChange": "https://acme.test/acme/key-change",
    "meta": {
        "caaIdentities": ["letsencrypt.org"],
        "profiles": {
            "classic": "https://letsencrypt.org/docs/profiles#classic",
            "shortlived": "https://letsencrypt.org/docs/profiles#shortlived",
            "tlsserver": "https://letsencrypt.org/docs/profiles#tlsserver",
        },
        "termsOfService": "https://letsencrypt.org/documents/LE-SA-v1.5-February-24-2025.pdf",
        "website": "https://letsencrypt.org",
    },
    "newAccount": "https://acme.test/acme/new-acct",
    "newNonce": "https://acme.test/acme/new-nonce",
    "newOrder": "https://acme.test/acme/new-order",
    "renewalInfo": "https://acme.test/acme/renewal-info",
    "revokeCert": "https://acme.test/acme/revoke-cert",
    "X3xZ1P0OxmA": "https://community.letsencrypt.org/t/adding-random-entries-to-the-directory/33417",
}

ORDER = {
    "status": "pending",
    "expires": "2026-01-08T18:05:23.123456789Z",
    "identifiers": [
        {"type": "dns", "value": "www.example.org"},
        {"type": "dns", "value": "*.example.org"},
    ],
    "notBefore": "2026-01-01T00:00:00+00:00",
    "notAfter": "2026-01-08T00:00:00-05:00",
    "authorizations": ["https://acme.test/authz/1", "https://acme.test/authz/2"],
    "finalize": "https://acme.test/order/1/finalize",
    "profile": "shortlived",
}

AUTHZ = {
    "status": "pending",
    "expires": "2026-01-02T14:09:30Z",
    "identifier": {"type": "dns", "value": "www.example.org"},
    "challenges": [
        {
            "url": "https://acme.test/chall/1",
            "type": "http-01",
            "status": "pending",
            "token": TOKEN,
        },
        {
            "url": "https://acme.test/chall/2",
            "type": "tls-alpn-01",
            "status": "pending",
            "token": TOKEN,
        },
        {"url": "https://acme.test/chall/3", "type": "dns-account-01", "status": "pending"},
    ],
    "wildcard": False,
}


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def with_(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(doc)
    for key, value in changes.items():
        if value is ...:
            out.pop(key, None)
        else:
            out[key] = value
    return out


# --- directory ---------------------------------------------------------------------------


def test_pebble_directory() -> None:
    d = parse_directory(dumps(PEBBLE_DIRECTORY), "https://127.0.0.1:14000/dir")
    assert d.new_order == "https://127.0.0.1:14000/order-plz"
    assert d.renewal_info is None and d.new_authz is None
    assert d.meta.terms_of_service == "data:text/plain,Do%20what%20thou%20wilt"
    assert d.meta.profiles == () and not d.meta.external_account_required


def test_directory_with_profiles_and_ari() -> None:
    d = parse_directory(dumps(LE_DIRECTORY), "https://acme.test/directory")
    assert d.renewal_info == "https://acme.test/acme/renewal-info"
    assert d.meta.profile_names == ("classic", "shortlived", "tlsserver")
    assert d.meta.caa_identities == ("letsencrypt.org",)
    assert d.meta.website == "https://letsencrypt.org"


@pytest.mark.parametrize(
    "doc",
    [
        with_(PEBBLE_DIRECTORY, newOrder=...),
        with_(PEBBLE_DIRECTORY, newNonce=12),
        with_(PEBBLE_DIRECTORY, newAccount="http://127.0.0.1:14000/sign-me-up"),
        with_(PEBBLE_DIRECTORY, newAccount="/sign-me-up"),
        with_(PEBBLE_DIRECTORY, newAccount="https://"),
        with_(PEBBLE_DIRECTORY, newAccount="https://a/b c"),
        with_(PEBBLE_DIRECTORY, newAccount="https://a/\r\nX-Injected: 1"),
        with_(PEBBLE_DIRECTORY, newAccount="https://a/" + "x" * 3000),
        with_(PEBBLE_DIRECTORY, renewalInfo="ftp://a/b"),
        with_(PEBBLE_DIRECTORY, meta=[]),
        with_(PEBBLE_DIRECTORY, meta={"externalAccountRequired": "yes"}),
        with_(PEBBLE_DIRECTORY, meta={"profiles": ["classic"]}),
        with_(PEBBLE_DIRECTORY, meta={"profiles": {"bad name": "x"}}),
        with_(PEBBLE_DIRECTORY, meta={"profiles": {"x": 1}}),
        with_(PEBBLE_DIRECTORY, meta={"profiles": {f"p{i}": "" for i in range(51)}}),
        with_(PEBBLE_DIRECTORY, meta={"caaIdentities": "letsencrypt.org"}),
    ],
)
def test_bad_directories_are_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(AcmeProtocolError, match="directory"):
        parse_directory(dumps(doc), "https://ca.test/dir")


def test_http_urls_are_accepted_from_an_http_directory_only() -> None:
    doc = {k: v.replace("https:", "http:") for k, v in PEBBLE_DIRECTORY.items() if k != "meta"}
    assert parse_directory(dumps(doc), "http://x/dir", https_only=False).new_order.startswith(
        "http:"
    )
    with pytest.raises(AcmeProtocolError):
        parse_directory(dumps(doc), "https://x/dir")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>502 Bad Gateway</html>",
        b"[]",
        b'"directory"',
        b"null",
        b"\xff\xfe{}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"newOrder": ' + b"9" * 5000 + b"}",
        b"{" + b" " * MAX_BODY + b"}",
    ],
)
def test_non_objects_are_refused(body: bytes) -> None:
    with pytest.raises(AcmeProtocolError):
        parse_directory(body, "https://ca.test/dir")


# --- account, order, authorization, challenge ---------------------------------------------


def test_account() -> None:
    doc = {
        "status": "valid",
        "contact": ["mailto:a@example.org"],
        "orders": "https://acme.test/acct/1/orders",
        "termsOfServiceAgreed": True,
        "key": {"kty": "EC"},
    }
    a = parse_account(dumps(doc), "https://acme.test/acct/1", created=True)
    assert a.url == "https://acme.test/acct/1" and a.status == "valid" and a.created
    assert a.contact == ("mailto:a@example.org",) and a.terms_of_service_agreed is True


@pytest.mark.parametrize(
    "doc",
    [
        {"status": "active"},
        {},
        {"status": "valid", "contact": "mailto:a@example.org"},
        {"status": "valid", "contact": [1]},
        {"status": "valid", "termsOfServiceAgreed": "true"},
    ],
)
def test_bad_accounts(doc: dict[str, Any]) -> None:
    with pytest.raises(AcmeProtocolError, match="account"):
        parse_account(dumps(doc), "https://acme.test/acct/1", created=False)


def test_order() -> None:
    o = parse_order(dumps(ORDER), "https://acme.test/order/1")
    assert o.status == "pending" and o.url == "https://acme.test/order/1"
    assert o.identifiers == (
        Identifier("dns", "www.example.org"),
        Identifier("dns", "*.example.org"),
    )
    assert o.names == ("www.example.org", "*.example.org")
    assert o.expires == dt.datetime(2026, 1, 8, 18, 5, 23, 123456, tzinfo=dt.UTC)
    assert o.not_after == dt.datetime(2026, 1, 8, 5, tzinfo=dt.UTC)
    assert o.profile == "shortlived" and o.certificate is None and o.error is None


def test_invalid_order_carries_its_error() -> None:
    doc = with_(
        ORDER,
        status="invalid",
        error={
            "type": "urn:ietf:params:acme:error:unauthorized",
            "detail": "Some of the identifiers requested were rejected",
            "subproblems": [
                {
                    "type": "urn:ietf:params:acme:error:rejectedIdentifier",
                    "detail": "This CA will not issue for example.net",
                    "identifier": {"type": "dns", "value": "example.net"},
                }
            ],
        },
    )
    o = parse_order(dumps(doc), "https://acme.test/order/1")
    assert o.error is not None and o.error.code == "unauthorized"
    assert o.error.subproblems[0].identifier == Identifier("dns", "example.net")
    assert "rejectedIdentifier" in o.error.describe() and "example.net" in o.error.describe()


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "done"},
        {"status": None},
        {"identifiers": []},
        {"identifiers": ...},
        {"identifiers": [{"type": "dns", "value": "bad_name.example.org"}]},
        {"identifiers": [{"type": "dns", "value": "example.org."}]},
        {"identifiers": [{"type": "email", "value": "a@example.org"}]},
        {"identifiers": [{"type": "ip", "value": "999.1.1.1"}]},
        {"identifiers": ["www.example.org"]},
        {"identifiers": [{"type": "dns", "value": f"h{i}.example.org"} for i in range(1001)]},
        {"authorizations": "https://acme.test/authz/1"},
        {"authorizations": [1]},
        {"authorizations": ["http://acme.test/authz/1"]},
        {"finalize": ...},
        {"certificate": "file:///etc/passwd"},
        {"expires": "tomorrow"},
        {"expires": "2026-02-30T00:00:00Z"},
        {"notAfter": 1767225600},
        {"error": "failed"},
        {"error": {"type": 1}},
    ],
)
def test_hostile_orders_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(AcmeProtocolError, match="order"):
        parse_order(dumps(with_(ORDER, **changes)), "https://acme.test/order/1")


def test_ip_identifiers_are_normalised() -> None:
    doc = with_(ORDER, identifiers=[{"type": "ip", "value": "2001:DB8::0:1"}])
    assert parse_order(dumps(doc), "https://a/o").identifiers[0] == Identifier("ip", "2001:db8::1")


def test_authorization() -> None:
    a = parse_authorization(dumps(AUTHZ), "https://acme.test/authz/1")
    assert a.identifier == Identifier("dns", "www.example.org") and a.name == "www.example.org"
    http = a.challenge("http-01")
    assert http is not None and http.token == TOKEN and http.status == "pending"
    assert a.challenge("dns-01") is None
    assert a.challenges[2].token is None  # a type we do not know, kept, untouched
    wild = parse_authorization(
        dumps(with_(AUTHZ, wildcard=True, identifier={"type": "dns", "value": "example.org"})),
        "https://a/z",
    )
    assert wild.name == "*.example.org"


def _challenge(**changes: Any) -> dict[str, Any]:
    return with_(AUTHZ["challenges"][0], **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"identifier": ...},
        {"identifier": {"type": "dns", "value": "-bad-.example.org"}},
        {"status": "approved"},
        {"challenges": ...},
        {"challenges": [_challenge() for _ in range(21)]},
        {"challenges": [_challenge(token="../../../etc/passwd")]},
        {"challenges": [_challenge(token="short")]},
        {"challenges": [_challenge(token=TOKEN + "\n")]},
        {"challenges": [_challenge(token=123)]},
        {"challenges": [_challenge(url="javascript:1")]},
        {"challenges": [_challenge(status="ok")]},
        {"challenges": [_challenge(type=...)]},
        {"challenges": [_challenge(validated="now")]},
        {"wildcard": "false"},
    ],
)
def test_hostile_authorizations_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(AcmeProtocolError):
        parse_authorization(dumps(with_(AUTHZ, **changes)), "https://acme.test/authz/1")


def test_challenge_answer_with_error() -> None:
    doc = _challenge(
        status="invalid",
        validated="2026-01-02T14:09:30Z",
        error={
            "type": "urn:ietf:params:acme:error:connection",
            "detail": "127.0.0.1: Connection refused\n\x1b[31mred\x1b[0m",
            "status": 400,
        },
    )
    c = parse_challenge(dumps(doc), "https://acme.test/chall/1")
    assert c.status == "invalid" and c.error is not None
    assert c.error.code == "connection" and c.error.status == 400
    assert "\n" not in c.error.detail and "\x1b" not in c.error.detail
    assert c.validated == dt.datetime(2026, 1, 2, 14, 9, 30, tzinfo=dt.UTC)


# --- problems -------------------------------------------------------------------------------


def test_problem_document() -> None:
    body = dumps(
        {
            "type": "urn:ietf:params:acme:error:rateLimited",
            "detail": "too many certificates already issued",
            "status": 429,
        }
    )
    p = parse_problem(body, 429)
    assert p == Problem(
        "urn:ietf:params:acme:error:rateLimited", "too many certificates already issued", 429
    )
    assert p.code == "rateLimited"


def test_problem_status_comes_from_http_when_missing_or_absurd() -> None:
    assert parse_problem(b'{"type": "urn:ietf:params:acme:error:malformed"}', 400).status == 400
    assert parse_problem(b'{"type": "x", "status": 9999}', 400).status == 400
    assert parse_problem(b'{"type": "x", "status": true}', 400).status == 400


@pytest.mark.parametrize(
    "body",
    [b"<html><h1>502 Bad Gateway</h1></html>", b"", b"[1]", b'{"type": 5}', b"\x00\xff"],
)
def test_anything_else_becomes_a_stand_in_problem(body: bytes) -> None:
    p = parse_problem(body, 502)
    assert p.type == "about:blank" and p.status == 502 and p.detail.startswith("HTTP 502")
    assert "\x00" not in p.detail


def test_problem_details_are_bounded_and_log_safe() -> None:
    subproblems = [{"type": "x", "detail": "d", "subproblems": [{"type": "deeper"}]}] * 3
    p = parse_problem(
        dumps({"type": "t\u2028x", "detail": "A" * 100_000, "subproblems": subproblems}), 400
    )
    assert len(p.detail) <= 1000 and p.type == "t x"
    assert len(p.subproblems) == 3 and p.subproblems[0].subproblems == ()
    too_many = dumps({"type": "x", "subproblems": [{"type": "y"}] * 101})
    assert parse_problem(too_many, 400).type == "about:blank"


def test_describe_names_at_most_five_subproblems() -> None:
    subs = tuple(Problem(f"urn:ietf:params:acme:error:e{i}", "d") for i in range(8))
    text = Problem("urn:ietf:params:acme:error:compound", "many", 400, None, subs).describe()
    assert "e4" in text and "e5" not in text and "and 3 more" in text


# --- timestamps -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-02T03:04:05Z", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
        ("2026-01-02t03:04:05z", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)),
        ("2026-01-02T03:04:05.5Z", dt.datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=dt.UTC)),
        ("2026-01-02T03:04:05.123456789Z", dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)),
        ("2026-01-02T03:04:05+02:00", dt.datetime(2026, 1, 2, 1, 4, 5, tzinfo=dt.UTC)),
        ("2016-12-31T23:59:60Z", dt.datetime(2016, 12, 31, 23, 59, 59, tzinfo=dt.UTC)),
    ],
)
def test_rfc3339(text: str, expected: dt.datetime) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-02",
        "2026-01-02T03:04:05",
        "2026-13-02T03:04:05Z",
        "2026-01-02T25:04:05Z",
        "2026-01-02T03:04:05+24:00",
        "2026-01-02T03:04:05.Z",
        "0000-01-02T03:04:05Z",
        " 2026-01-02T03:04:05Z",
    ],
)
def test_rfc3339_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time(text)
