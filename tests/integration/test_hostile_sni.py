"""Hostile SNI bytes never reach a runtime-API command; clients get the default certificate."""

from __future__ import annotations

import pytest

from certagent.testing import PKI, RedisFixture
from tests.integration.conftest import StackFactory

pytestmark = pytest.mark.integration

DEFAULT, CLOSED = "default certificate", "closed"

# Each name carries the marker "evil" so the agent's log can be searched for it.
# HAProxy's TLS layer itself aborts the handshake (no certificate at all) for an
# empty name, a name over 255 bytes and a name with a NUL byte (ssl_sock.c,
# ssl_sock_switchctx_cbk: "len == 0 || len > TLSEXT_MAXLEN_host_name || memchr(0)").
HOSTILE: list[tuple[str, bytes | None, str]] = [
    ("no server_name extension", None, DEFAULT),
    ("empty name", b"", CLOSED),
    ("300 characters", b"evil" + b"a" * 292 + b".test", CLOSED),
    ("254 LDH characters", b"evil" + b"a" * 58 + (b"." + b"b" * 63) * 3, DEFAULT),
    ("semicolon (CLI command separator)", b"evil.test;show info", DEFAULT),
    ("CR/LF (CLI line break)", b"evil.test\r\nset ssl cert /x <<", DEFAULT),
    ("LF only", b"evil.test\nshow map", DEFAULT),
    ("space", b"evil.test add map", DEFAULT),
    ("percent", b"evil%2e.example.test", DEFAULT),
    ("unicode (UTF-8)", "evil-bücher.example.test".encode(), DEFAULT),
    ("non-LDH bytes", b"evil\xff\xfe\x01.example.test", DEFAULT),
    ("NUL byte", b"evil.test\x00.example.test", CLOSED),
    ("underscore", b"evil_host.example.test", DEFAULT),
    ("slot name", b"/certagent/slot-00001.pem#evil", DEFAULT),
    ("trailing dot", b"evil.example.test.", DEFAULT),
    ("single label", b"evil", DEFAULT),
    ("leading hyphen", b"-evil.example.test", DEFAULT),
    ("IPv4 literal", b"127.0.0.1", DEFAULT),
    ("numeric top label", b"evil.10.0.0.1", DEFAULT),
]


def test_hostile_sni_gets_default_certificate_and_no_command(
    make_stack: StackFactory, redis_store: RedisFixture, pki: PKI
) -> None:
    redis_store.put([pki.bundle("normal.hostile.test")])
    stack = make_stack(redis_store.url, capacity=10)
    # One slot in use, so a hostile name could in principle land in a real slot.
    assert stack.handshake("normal.hostile.test").san == ("normal.hostile.test",)
    before = stack.status()
    commands_before = len(stack.runtime_commands())

    outcomes = {}
    for label, sni, _ in HOSTILE:
        der = stack.hello(sni)
        outcomes[label] = (
            DEFAULT if der == stack.default_der else CLOSED if der is None else "other cert"
        )
    assert outcomes == {label: expected for label, _, expected in HOSTILE}

    assert stack.status()["ensure"] == before["ensure"], "the Lua action let a hostile name pass"

    # The same bytes sent straight to the agent's socket (bypassing the Lua check);
    # a line feed ends a request line there, so those names are sent up to it.
    for _label, sni, _ in HOSTILE:
        if sni and b"\n" not in sni:
            assert stack.ensure(sni) == "invalid", sni

    new_commands = stack.runtime_commands()[commands_before:]
    assert [c for c in new_commands if "evil" in c.lower() or c.startswith("set ssl cert")] == []
    after = stack.status()
    assert after["loader"]["loads"] == before["loader"]["loads"]
    assert after["ensure"]["loaded"] == before["ensure"]["loaded"]
    assert after["ensure"]["store_lookups"] == before["ensure"]["store_lookups"]
    assert after["ensure"]["invalid"] > before["ensure"]["invalid"]
    assert not [name for name in stack.marked_hosts() if "evil" in name]
    assert not [name for name in stack.ssl_certs() if "evil" in name]

    # A normal host still works afterwards, warm and cold.
    assert stack.handshake("normal.hostile.test").san == ("normal.hostile.test",)
    redis_store.put([pki.bundle("later.hostile.test")])
    assert stack.handshake("later.hostile.test").san == ("later.hostile.test",)
