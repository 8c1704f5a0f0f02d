"""The ticket-key ring, its rotation and what HAProxy must be sent: pure functions."""

from __future__ import annotations

import base64

import pytest

from certagent.certs.ticketkeys import (
    KEY_BYTES,
    RING_SIZE,
    TicketRing,
    fresh_key,
    keys_file,
    new_ring,
    parse_key,
    pushes,
)
from certagent.errors import CommandFailed, HAProxyError
from certagent.runtime import protocol


def keys(n: int) -> list[str]:
    return [fresh_key() for _ in range(n)]


def test_fresh_keys_are_80_random_bytes() -> None:
    a, b = fresh_key(), fresh_key()
    assert len(base64.b64decode(a)) == KEY_BYTES and a != b
    assert parse_key(a) == a


@pytest.mark.parametrize(
    "bad",
    ["", "not base64!", base64.b64encode(b"x" * 48).decode(), base64.b64encode(b"x" * 81).decode(),
     "é", base64.b64encode(b"x" * 80).decode() + "\n"],
)  # fmt: skip
def test_parse_key_refuses_without_quoting_the_key(bad: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_key(bad)
    assert bad.strip() == "" or bad.strip() not in str(caught.value)


def test_a_ring_holds_three_distinct_keys_and_never_shows_them() -> None:
    k = keys(4)
    ring = TicketRing(2, tuple(k[:3]), 100.0)
    assert all(key not in repr(ring) for key in k[:3])
    with pytest.raises(ValueError, match="holds 3 keys"):
        TicketRing(2, tuple(k[:2]), 100.0)
    with pytest.raises(ValueError, match="same key twice"):
        TicketRing(2, (k[0], k[0], k[1]), 100.0)
    with pytest.raises(ValueError, match="generation"):
        TicketRing(1, tuple(k[:3]), 100.0)
    nxt = ring.rotated(k[3], 200.0)
    assert nxt == TicketRing(3, (k[1], k[2], k[3]), 200.0)
    assert ring.due(600) == 700.0


def test_new_ring_and_its_file_oldest_first() -> None:
    ring = new_ring(5.0)
    assert ring.generation == RING_SIZE - 1 and ring.rotated_at == 5.0
    assert keys_file(ring) == ("\n".join(ring.keys) + "\n").encode()


@pytest.mark.parametrize("behind", [0, 1, 2, 3, 5])
def test_pushes_for_an_haproxy_some_rotations_behind(behind: int) -> None:
    history = keys(8)
    ring = TicketRing(7, tuple(history[5:8]), 0.0)
    held = history[5 - behind : 8 - behind] if behind <= 5 else []
    sent = pushes(held, ring)
    assert sent == history[8 - min(behind, 3) : 8]
    # replaying what was sent the way HAProxy shifts its ring gives the target
    state = list(held)
    for key in sent:
        state = [*state[1:], key]
    assert state == list(ring.keys)


@pytest.mark.parametrize("held", [[], ["x"], keys(2), keys(3), keys(4)])
def test_pushes_all_three_for_foreign_or_odd_rings(held: list[str]) -> None:
    ring = new_ring(0.0)
    assert pushes(held, ring) == list(ring.keys)


def test_pushes_all_three_when_the_ring_went_back() -> None:
    history = keys(5)
    ring = TicketRing(3, tuple(history[1:4]), 0.0)
    assert pushes(history[2:5], ring) == history[1:4]  # HAProxy ahead: start over


# --- the runtime API -------------------------------------------------------------------

SHOWN = """# id secret
# 0 (/etc/certagent/tickets/tls-ticket.keys)
0.0 {0}
0.1 {1}
0.2 {2}"""


def test_parse_show_tls_keys_in_haproxy_order() -> None:
    k = keys(3)
    assert protocol.parse_show_tls_keys(SHOWN.format(*k)) == tuple(k)
    rows = SHOWN.format(*k).splitlines()
    shuffled = "\n".join([*rows[:2], rows[4], rows[2], rows[3]])
    assert protocol.parse_show_tls_keys(shuffled) == tuple(k)


def test_parse_show_tls_keys_without_such_a_file() -> None:
    assert (
        protocol.parse_show_tls_keys("'show tls-keys' unable to locate referenced filename") is None
    )
    with pytest.raises(HAProxyError):
        protocol.parse_show_tls_keys("Unknown command: 'show tls-keys'")


def test_set_tls_key_replies_never_name_the_key() -> None:
    protocol.check_set_tls_key("/k", "TLS ticket key updated!")
    for reply in (
        "'set ssl tls-key' received a key of wrong size.",
        "'set ssl tls-key' received invalid base64 encoded TLS key.",
        "'set ssl tls-key' unable to locate referenced filename",
    ):
        with pytest.raises(CommandFailed) as caught:
            protocol.check_set_tls_key("/k", reply)
        assert caught.value.command == "set ssl tls-key /k <key>"


def test_a_key_is_a_safe_runtime_argument() -> None:
    key = fresh_key()
    assert (
        protocol.encode("set", "ssl", "tls-key", "/k", key)
        == f"set ssl tls-key /k {key}\n".encode()
    )


def test_a_logged_command_hides_the_key() -> None:
    key = fresh_key()
    assert protocol.shown(("set", "ssl", "tls-key", "/k", key)) == "set ssl tls-key /k <key>"
    assert protocol.shown(("show", "tls-keys", "/k")) == "show tls-keys /k"
