"""Every error of the REST API is an RFC 9457 problem, and a client's error leaves no traceback.

Errors inside the app go through its middleware; malformed bodies through
:mod:`certagent.api.body`; requests aiohttp's HTTP parser refuses (a request line
or header over 8 KiB, not HTTP at all) through :mod:`certagent.api.server`,
which only a real server runs: those are sent on a raw socket to :func:`start_api`.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.compression_utils import HAS_BROTLI

from certagent.api import LoadedSlot, add_token, start_api
from certagent.api.problems import TITLES
from certagent.api.server import MAX_HEADER_FIELD, MAX_REQUEST_LINE
from certagent.config import Settings
from tests.apihelp import Api, running_api
from tests.memstore import MemoryStore

CERTS = "/v1/certificates"
PROBLEM_MEMBERS = {"type", "title", "status", "detail", "code"}


def assert_problem(status: int, content_type: str, body: object, want: int, code: str) -> None:
    assert (status, content_type) == (want, "application/problem+json"), body
    assert isinstance(body, dict)
    assert set(body) >= PROBLEM_MEMBERS, body
    assert body["status"] == want
    assert body["code"] == code, body
    assert body["type"] == f"urn:certagent:problem:{code}"
    assert body["title"] == TITLES[code]
    assert isinstance(body["detail"], str) and body["detail"]


def assert_quiet_client_error(caplog: pytest.LogCaptureFixture) -> None:
    """At most one log line, at INFO or below, and never a traceback.

    aiohttp's access log is left out: the test client turns it on, the agent does not.
    """
    records = _api_records(caplog)
    assert len(records) <= 1, [r.getMessage() for r in records]
    for record in records:
        assert record.levelno <= logging.INFO, record.getMessage()
        assert record.exc_info is None and record.exc_text is None, record.getMessage()
        assert "Traceback" not in caplog.text


def _api_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith(("certagent.api", "aiohttp")) and r.name != "aiohttp.access"
    ]


# --- inside the app: the test client ----------------------------------------------------------


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(MemoryStore(), tmp_path) as api:
        yield api


MULTIPART = "multipart/form-data; boundary=zzz"
PART = b'--zzz\r\nContent-Disposition: form-data; name="chain"\r\n'

MALFORMED_BODIES = {
    "part header without a colon": (MULTIPART, b"--zzz\r\nbadheader\r\n\r\nabc\r\n--zzz--\r\n"),
    "part header over the limit": (
        MULTIPART,
        PART + b"X: " + b"a" * 9000 + b"\r\n\r\nx\r\n--zzz--\r\n",
    ),
    "unknown charset": (
        MULTIPART,
        PART + b"Content-Type: text/plain; charset=nonsense\r\n\r\nabc\r\n--zzz--\r\n",
    ),
    "empty charset": (
        MULTIPART,
        PART + b'Content-Type: text/plain; charset="\r\n\r\nabc\r\n--zzz--\r\n',
    ),
    "unknown transfer encoding": (
        MULTIPART,
        PART + b"Content-Transfer-Encoding: foo\r\n\r\nabc\r\n--zzz--\r\n",
    ),
    "_charset_ field naming no charset": (
        MULTIPART,
        b'--zzz\r\nContent-Disposition: form-data; name="_charset_"\r\n\r\nfoo\r\n'
        + PART
        + b"\r\nabc\r\n--zzz--\r\n",
    ),
    "no closing boundary": (MULTIPART, PART + b"\r\nabc\r\n"),
    "no boundary at all": (MULTIPART, b"garbage"),
    "boundary parameter missing": ("multipart/form-data", b"--zzz\r\n"),
    "undecodable text": (MULTIPART, PART + b"\r\n\xff\xfe\r\n--zzz--\r\n"),
    "nested multipart": (
        MULTIPART,
        PART + b"Content-Type: multipart/mixed; boundary=yyy\r\n\r\n--yyy\r\n\r\nx\r\n--yyy--\r\n"
        b"--zzz--\r\n",
    ),
    "urlencoded with an unknown charset": (
        "application/x-www-form-urlencoded; charset=nonsense",
        b"chain=abc",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_BODIES))
async def test_malformed_form_body_is_a_400_problem_without_traceback(
    api: Api, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ctype, body = MALFORMED_BODIES[case]
    resp = await api.client.post(CERTS, data=body, headers={**api.auth, "Content-Type": ctype})
    assert_problem(resp.status, resp.content_type, await resp.json(), 400, "bad-request")
    assert "form" in (await resp.json())["detail"]
    assert_quiet_client_error(caplog)
    assert await api.records() == []


async def test_body_that_breaks_its_content_encoding_is_a_400_problem(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    resp = await api.client.post(
        CERTS,
        data=b"this is not gzip",
        headers={**api.auth, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert_problem(resp.status, resp.content_type, await resp.json(), 400, "bad-request")
    assert all(r.exc_info is None for r in caplog.records)
    ok = await api.client.post(
        CERTS,
        data=gzip.compress(b'{"chain": "x"}'),
        headers={**api.auth, "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert (await ok.json())["code"] == "bad-pem"  # decoded, then validated


@pytest.mark.parametrize(
    ("ctype", "body", "status", "code"),
    [
        ("application/json", b"{not json", 400, "bad-request"),
        ("application/json", b'{"chain": "\\ud800"}', 400, "bad-request"),
        ("application/json", b'{"chain": ""}', 400, "bad-request"),
        ("application/json", b'{"chain": " \\n\\t"}', 400, "bad-request"),
        ("text/plain", b"", 400, "bad-pem"),
        ("application/x-pem-file", b"\r\n \r\n", 400, "bad-pem"),
        ("text/plain", b"not a pem", 400, "bad-pem"),
        ("application/octet-stream", b"x", 415, "unsupported-media-type"),
        ("image/png", b"x", 415, "unsupported-media-type"),
    ],
)
async def test_body_errors_are_problems(
    api: Api, ctype: str, body: bytes, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    resp = await api.client.post(CERTS, data=body, headers={**api.auth, "Content-Type": ctype})
    assert_problem(resp.status, resp.content_type, await resp.json(), status, code)
    assert_quiet_client_error(caplog)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nothing", 404, "not-found"),
        ("GET", "/", 404, "not-found"),
        ("PATCH", CERTS, 405, "method-not-allowed"),
        ("HEAD", CERTS, 405, "method-not-allowed"),
        ("DELETE", "/healthz", 405, "method-not-allowed"),
        ("GET", f"{CERTS}?limit=0", 400, "bad-request"),
        ("GET", f"{CERTS}/nothing-here", 404, "not-found"),
    ],
)
async def test_routing_errors_are_problems_logged_once(
    api: Api, method: str, path: str, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    resp = await api.client.request(method, path, headers=api.auth)
    assert resp.status == status
    if method != "HEAD":
        assert_problem(resp.status, resp.content_type, await resp.json(), status, code)
    [record] = _api_records(caplog)
    assert record.levelno == logging.DEBUG and record.exc_info is None
    assert record.getMessage() == (
        f"{method} {path.split('?')[0]}: {status} urn:certagent:problem:{code}"
    )


async def test_refused_token_is_one_info_line(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    resp = await api.client.get(CERTS, headers={"Authorization": "Bearer cat_nope"})
    assert_problem(resp.status, resp.content_type, await resp.json(), 403, "bad-token")
    [record] = [r for r in caplog.records if r.name.startswith("certagent.api")]
    assert record.levelno == logging.INFO and record.exc_info is None
    assert "cat_nope" not in caplog.text


# --- before the app: a real server and a raw socket ------------------------------------------


@dataclass
class Served:
    host: str
    port: int
    token: str

    async def raw(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``request`` as it is; the status, headers and body of the answer."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(request.replace(b"TOKEN", self.token.encode()))
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
        return int(status_line.split()[1]), headers, body


@pytest.fixture
async def served(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Served]:
    tokens = tmp_path / "tokens"
    token = add_token(tokens, "raw")
    settings = Settings(api_bind="127.0.0.1:0", api_tokens_file=str(tokens))

    async def no_slots() -> list[LoadedSlot]:
        return []

    server = await start_api(settings, MemoryStore(), loaded=no_slots, ready=lambda: True)
    assert server is not None
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    try:
        yield Served(host, int(port), token)
    finally:
        await server.close()


def _get(target: bytes, *headers: bytes) -> bytes:
    return (
        b"GET "
        + target
        + b" HTTP/1.1\r\nHost: x\r\n"
        + b"".join(h + b"\r\n" for h in headers)
        + (b"Connection: close\r\n\r\n")
    )


UNPARSEABLE = {
    "request line over 8 KiB": (_get(b"/healthz?" + b"a" * MAX_REQUEST_LINE), 414, "uri-too-long"),
    "path over 8 KiB": (_get(b"/v1/" + b"a" * 9000), 414, "uri-too-long"),
    "header over 8 KiB": (
        _get(b"/healthz", b"X-Big: " + b"a" * (MAX_HEADER_FIELD + 1)),
        431,
        "header-too-large",
    ),
    "header name over 8 KiB": (_get(b"/healthz", b"X" * 9000 + b": 1"), 431, "header-too-large"),
    "token over 8 KiB": (
        _get(b"/v1/loaded", b"Authorization: Bearer cat_" + b"a" * 9000),
        431,
        "header-too-large",
    ),
    "too many headers": (
        _get(b"/healthz", *(b"X-%d: 1" % i for i in range(200))),
        431,
        "header-too-large",
    ),
    "not HTTP": (b"HELLO\r\n\r\n", 400, "bad-request"),
    "TLS on the HTTP port": (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
        400,
        "bad-request",
    ),
    "header without a colon": (_get(b"/healthz", b"NoColonHere"), 400, "bad-request"),
    "control character in a header": (_get(b"/healthz", b"X-A: a\x01b"), 400, "bad-request"),
    "two Content-Lengths": (
        b"POST /v1/certificates HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n"
        b"\r\nab",
        400,
        "bad-request",
    ),
    "broken chunked framing": (
        b"POST /v1/certificates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer TOKEN\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nabc\r\n0\r\n\r\n",
        400,
        "bad-request",
    ),
    "unsupported content encoding": (
        b"POST /v1/certificates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer TOKEN\r\n"
        b"Content-Type: application/json\r\nContent-Encoding: br\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n",
        415,
        "unsupported-media-type",
    ),
}


@pytest.mark.parametrize("case", list(UNPARSEABLE))
async def test_unparseable_request_is_a_problem_without_traceback(
    served: Served, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    request, status, code = UNPARSEABLE[case]
    if case == "unsupported content encoding" and HAS_BROTLI:
        pytest.skip("Brotli is installed: aiohttp decodes Content-Encoding: br")
    got, headers, body = await served.raw(request)
    assert headers["content-type"].startswith("application/problem+json")
    assert_problem(got, "application/problem+json", json.loads(body), status, code)
    assert b"aaaa" not in body and served.token.encode() not in body  # nothing echoed back
    assert_quiet_client_error(caplog)
    assert served.token not in caplog.text


async def test_connection_survives_nothing_after_a_parse_error(served: Served) -> None:
    """A refused request closes its connection; the server keeps serving new ones."""
    status, _, _ = await served.raw(_get(b"/healthz", b"X-Big: " + b"a" * 10_000))
    assert status == 431
    status, _, body = await served.raw(_get(b"/healthz"))
    assert (status, json.loads(body)) == (200, {"status": "ok"})


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (_get(b"/nothing", b"Expect: something-else"), 417, "expectation-failed"),
        (_get(b"/healthz", b"Expect: something-else"), 200, None),
        (
            b"POST /v1/certificates HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: 10\r\nConnection: close\r\n\r\n",
            401,
            "missing-token",
        ),
    ],
)
async def test_expect_header(
    served: Served,
    request_bytes: bytes,
    status: int,
    code: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    got, headers, body = await served.raw(request_bytes)
    assert got == status
    if code is not None:
        assert_problem(got, headers["content-type"].split(";")[0], json.loads(body), status, code)
    assert_quiet_client_error(caplog)


async def test_client_gone_mid_body_leaves_no_traceback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    _, writer = await asyncio.open_connection(served.host, served.port)
    writer.write(
        b"POST /v1/certificates HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + served.token.encode()
        + b'\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"chain": '
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    for _ in range(100):  # the server notices the closed connection
        if any(r.name.startswith("certagent.api") for r in caplog.records):
            break
        await asyncio.sleep(0.02)
    assert all(r.exc_info is None and r.levelno <= logging.INFO for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


async def test_aiohttp_client_sees_problems_for_oversized_headers(served: Served) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://{served.host}:{served.port}/healthz", headers={"X-Big": "a" * 9000}
        ) as resp,
    ):
        assert resp.status == 431
        assert resp.content_type == "application/problem+json"
        assert (await resp.json())["code"] == "header-too-large"
