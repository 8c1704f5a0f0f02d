from __future__ import annotations

import re

import pytest

from certagent.certs import hostname
from certagent.errors import InvalidHostname


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.example.test", "a.example.test"),
        ("WWW.Example.TEST", "www.example.test"),
        (b"a.example.test", "a.example.test"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("a-b.c-d.test", "a-b.c-d.test"),
        ("1.2.3.example", "1.2.3.example"),  # numeric labels, not an IP (1.2.3.4 is refused)
        ("a" * 63 + ".test", "a" * 63 + ".test"),
    ],
)
def test_normalise_accepts(raw: str | bytes, expected: str) -> None:
    assert hostname.normalise(raw) == expected
    assert hostname.is_valid(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "localhost",
        "example.test.",
        ".example.test",
        "a..example.test",
        "-a.example.test",
        "a-.example.test",
        "a_b.example.test",
        "a b.example.test",
        "*.example.test",
        "../etc/passwd",
        "a.example.test/../../x",
        "a/b.example.test",
        "a.example.test\x00",
        "a.example.test\n",
        "a.example.test\r\nshow info",
        "bücher.example",
        b"b\xc3\xbccher.example",
        "a" * 64 + ".test",
        ".".join(["a" * 63] * 4),  # 255 characters
    ],
)
def test_normalise_rejects(raw: str | bytes) -> None:
    with pytest.raises(InvalidHostname):
        hostname.normalise(raw)
    assert not hostname.is_valid(raw)


def test_length_limit_is_253() -> None:
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(longest) == hostname.MAX_LENGTH == 253
    assert hostname.normalise(longest) == longest
    too_long = longest + "b"  # every label still at most 63 characters
    with pytest.raises(InvalidHostname, match="longer than 253"):
        hostname.normalise(too_long)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("*.Example.test", "*.example.test"),
        ("a.example.test", "a.example.test"),
        ("*.a.b.test", "*.a.b.test"),
    ],
)
def test_normalise_pattern_accepts(raw: str, expected: str) -> None:
    assert hostname.normalise_pattern(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["*.test", "*", "*.", "**.example.test", "a.*.example.test", "*.*.example.test", "*a.b.c"],
)
def test_normalise_pattern_rejects(raw: str) -> None:
    with pytest.raises(InvalidHostname):
        hostname.normalise_pattern(raw)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.example.test", "*.example.test"),
        ("x.a.example.test", "*.a.example.test"),
        ("example.test", None),
    ],
)
def test_wildcard_for(name: str, expected: str | None) -> None:
    assert hostname.wildcard_for(name) == expected


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("a.example.test", "a.example.test", True),
        ("a.example.test", "b.example.test", False),
        ("*.example.test", "a.example.test", True),
        ("*.example.test", "example.test", False),
        ("*.example.test", "x.a.example.test", False),
        ("*.example.test", "a.other.test", False),
        ("*.a.example.test", "x.a.example.test", True),
    ],
)
def test_covers(pattern: str, name: str, expected: bool) -> None:
    assert hostname.covers(pattern, name) is expected


@pytest.mark.parametrize("ip", ["127.0.0.1", "192.0.2.1", "10.0.0.255", "1.2.3.4", "host.123"])
def test_ip_literals_and_numeric_tlds_are_not_hostnames(ip: str) -> None:
    with pytest.raises(InvalidHostname):
        hostname.normalise(ip)
    with pytest.raises(InvalidHostname):
        hostname.normalise_pattern(ip)
    assert hostname.normalise("123.example.com") == "123.example.com"  # numeric labels elsewhere


@pytest.mark.parametrize("name", ["host.1a", "a.b.0x", "x.9-z"])
def test_the_top_level_label_starts_with_a_letter(name: str) -> None:
    with pytest.raises(InvalidHostname, match="must start with a letter"):
        hostname.normalise(name)
    assert hostname.normalise("x.a1") == "x.a1"
    assert hostname.normalise("x.xn--p1ai") == "x.xn--p1ai"


@pytest.mark.parametrize(
    "name",
    ["a.b", "*.a.b", "1.2.3.example", "x.a1", "Host.Example.COM", "00.0", "host.1a", "a.123",
     "a-.b", "*.b", "a..b", "a.b-", "*.*.a.b", "a" * 64 + ".b"],
)  # fmt: skip
def test_the_openapi_pattern_says_what_normalise_pattern_accepts(name: str) -> None:
    from certagent.api.query import NAME_PATTERN

    try:
        hostname.normalise_pattern(name)
        accepted = True
    except InvalidHostname:
        accepted = False
    assert (re.fullmatch(NAME_PATTERN, name) is not None) is accepted, name
