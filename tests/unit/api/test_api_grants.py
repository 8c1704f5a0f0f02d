"""What a token may do (api/grants.py) and how the tokens file keeps it (api/auth.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from certagent.api.auth import (
    TokenFile,
    add_token,
    hash_token,
    parse_tokens,
    register_token,
    token_entries,
)
from certagent.api.grants import (
    EVERYTHING,
    Grant,
    NamePattern,
    Rate,
    Scope,
    make_grant,
    parse_duration,
    parse_rate,
)
from certagent.errors import ConfigError

NOW = datetime(2030, 1, 1, tzinfo=UTC)
HASH = "a" * 64


@pytest.mark.parametrize(
    ("pattern", "inside", "outside"),
    [
        (
            "example.com",
            ["example.com"],
            ["a.example.com", "*.example.com", "example.co", "xexample.com"],
        ),
        (
            "*.example.com",
            ["a.example.com", "*.example.com", "a-b.example.com"],
            ["example.com", "a.b.example.com", "*.a.example.com", "aexample.com"],
        ),
        (
            ".example.com",
            ["example.com", "a.example.com", "a.b.example.com", "*.example.com", "*.a.example.com"],
            ["aexample.com", "example.com.evil.test", "com"],
        ),
        ("*.Customer.TEST", ["a.customer.test"], ["b.other.test", "customer.test"]),
    ],
)
def test_patterns_cover_what_they_say(pattern: str, inside: list[str], outside: list[str]) -> None:
    parsed = NamePattern.parse(pattern)
    assert all(parsed.covers(name) for name in inside), [n for n in inside if not parsed.covers(n)]
    assert not any(parsed.covers(name) for name in outside), [
        n for n in outside if parsed.covers(n)
    ]
    assert str(parsed) == pattern.lower()


@pytest.mark.parametrize("bad", ["", "*", "*.com", ".com", "a..b", "**.example.com", "1.2.3.4"])
def test_patterns_that_are_no_pattern_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"example\.com"):
        NamePattern.parse(bad)


def test_a_certificate_is_allowed_only_if_every_name_is() -> None:
    grant = Grant(patterns=(NamePattern.parse("*.a.test"), NamePattern.parse("b.test")))
    assert grant.allows_names(["x.a.test", "b.test"])
    assert not grant.allows_names(["x.a.test", "c.test"])
    assert EVERYTHING.allows_names(["anything.test"]) and not EVERYTHING.limited


def test_admin_has_every_scope_and_others_only_theirs() -> None:
    assert all(EVERYTHING.allows(scope) for scope in Scope)
    read = Grant(scopes=frozenset({Scope.READ}))
    assert read.allows(Scope.READ) and not read.allows(Scope.CERTIFICATES)


@pytest.mark.parametrize(
    ("raw", "seconds"), [("90s", 90), ("15m", 900), ("12h", 43200), ("30d", 2592000)]
)
def test_durations(raw: str, seconds: int) -> None:
    assert parse_duration(raw) == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["", "0s", "10", "1w", "-5m", "1.5h", "s"])
def test_durations_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="90s, 15m, 12h or 30d"):
        parse_duration(bad)


def test_rates() -> None:
    assert parse_rate("10/s") == Rate(10, "s") and parse_rate("10/s").burst == 10
    assert parse_rate("0.5/s").per_second == 0.5 and parse_rate("0.5/s").burst == 1
    assert parse_rate("120/m").per_second == 2
    for bad in ("0/s", "10", "10/d", "/s", "-1/s", "1e3/s"):
        with pytest.raises(ConfigError, match="N/s"):
            parse_rate(bad)


def test_a_line_without_attributes_is_an_admin_token_as_before(tmp_path: Path) -> None:
    (entry,) = parse_tokens(f"deploy:{HASH}\n")
    assert entry.grant == EVERYTHING
    path = tmp_path / "tokens"
    token = add_token(path, "deploy")
    assert path.read_text().splitlines()[-1] == f"deploy:{hash_token(token)}"  # the old format


def test_attributes_round_trip_through_the_file(tmp_path: Path) -> None:
    grant = make_grant(
        scopes=["domains", "read"],
        names=["*.customer.test", ".Example.com", "*.customer.test"],
        expires_in="30d",
        rate="5/s",
        subject="CN=deploy job,O=Example #1",
        now=NOW,
    )
    assert grant.patterns == (
        NamePattern.parse("*.customer.test"),
        NamePattern.parse(".example.com"),
    )
    assert grant.expires == NOW + timedelta(days=30)
    path = tmp_path / "tokens"
    token = add_token(path, "panel", grant)
    line = path.read_text().splitlines()[-1]
    assert line == (
        f"panel:{hash_token(token)} scopes=read,domains names=*.customer.test,.example.com"
        " expires=2030-01-31T00:00:00Z rate=5/s subject=CN=deploy%20job,O=Example%20%231"
    )
    (entry,) = token_entries(path)
    assert entry.grant == grant and entry.name == "panel"
    assert TokenFile.load(path).for_subject("CN=deploy job,O=Example #1") == entry


def test_a_subject_only_line_matches_no_bearer_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    grant = make_grant(subject="CN=ci", now=NOW)
    assert register_token(path, "ci", None, grant=grant) == "added"
    assert path.read_text().splitlines()[-1] == "ci:- subject=CN=ci"
    tokens = TokenFile.load(path)
    assert tokens.match("-") is None and tokens.match("ci") is None
    assert tokens.for_subject("CN=ci") is not None and tokens.for_subject("CN=other") is None
    with pytest.raises(ConfigError, match="already has the client certificate subject"):
        add_token(path, "twin", make_grant(subject="CN=ci", now=NOW))
    assert register_token(path, "ci", None, grant=grant, replace=True) == "unchanged"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (f"x:{HASH} scopes=root", "scope 'root'"),
        (f"x:{HASH} colour=blue", "unknown attribute 'colour=blue'"),
        (f"x:{HASH} scopes", "unknown attribute"),
        (f"x:{HASH} rate=1/s rate=2/s", "given twice"),
        (f"x:{HASH} names=", "no pattern"),
        (f"x:{HASH} names=*.com", "name pattern"),
        (f"x:{HASH} expires=soon", "ISO 8601"),
        ("x:-", "no subject"),
        (f"x:{HASH} subject=CN=a\ny:{HASH} subject=CN=a", "appears twice"),
    ],
)
def test_malformed_attributes_refuse_the_file(line: str, match: str) -> None:
    """Fail closed: an attribute this version does not know never widens a token."""
    with pytest.raises(ConfigError, match=match) as info:
        parse_tokens(line + "\n")
    assert HASH not in str(info.value)


def test_expiry_is_a_whole_second_and_checked_against_now() -> None:
    grant = make_grant(expires_in="90s", now=NOW + timedelta(microseconds=5))
    assert grant.expires == NOW + timedelta(seconds=91)
    assert not grant.expired(NOW + timedelta(seconds=90)) and grant.expired(grant.expires)
