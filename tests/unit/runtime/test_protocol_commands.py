"""The command builders of runtime/protocol/ and the transaction, on recorded replies.

Replies are the ones HAProxy 2.6.12 (Debian 12) gives; the reply checks and parsers
of single commands are in tests/unit/runtime/test_protocol.py.
"""

from __future__ import annotations

import base64

import pytest

from certagent.errors import CommandFailed, HAProxyError, Locked, PayloadTooLarge, WrongTransaction
from certagent.runtime import protocol
from certagent.runtime.protocol import Command, Transaction

SLOT = "/certagent/slot-00001.pem"
OTHER = "/certagent/slot-00002.pem"
LIST = "/etc/certagent/certagent.crtlist"
PEM = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
DER = b"\x30\x03\x0a\x01\x00"  # an OCSPResponse's outer bytes; the protocol never parses it

MAP = "/etc/certagent/challenges.map"
TOKEN = "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0"
KEYAUTH = TOKEN + ".9jg46WB3rR_AHD-EBXdN7cBkH1WOu0tA3M9fm21mqTI"
CREATED = f"Transaction created for certificate {SLOT}!"
COMMITTED = f"Committing {SLOT}.\nSuccess!"
NO_TRANSACTION = "No ongoing transaction!"
ABORTED = f"Transaction aborted for certificate '{SLOT}'!"


# --- every builder: its command line, exactly -----------------------------------------


@pytest.mark.parametrize(
    ("command", "line"),
    [
        (protocol.prompt(), b"prompt\n"),
        (protocol.show_info(), b"show info\n"),
        (protocol.master_reload(), b"reload\n"),
        (protocol.show_certs(), b"show ssl cert\n"),
        (protocol.show_cert(SLOT), f"show ssl cert {SLOT}\n".encode()),
        (protocol.new_cert(SLOT), f"new ssl cert {SLOT}\n".encode()),
        (protocol.commit_cert(SLOT), f"commit ssl cert {SLOT}\n".encode()),
        (protocol.abort_cert(SLOT), f"abort ssl cert {SLOT}\n".encode()),
        (protocol.show_crtlists(), b"show ssl crt-list\n"),
        (protocol.show_crtlist(LIST), f"show ssl crt-list {LIST}\n".encode()),
        (protocol.add_crtlist(LIST, SLOT), f"add ssl crt-list {LIST} {SLOT}\n".encode()),
        (protocol.set_mark("fe_sni", "a.test", 7), b"set table fe_sni key a.test data.gpt0 7\n"),
        (protocol.clear_entry("fe_sni", "a.test"), b"clear table fe_sni key a.test\n"),
        (protocol.show_entry("fe_sni", "a.test"), b"show table fe_sni key a.test\n"),
        (protocol.show_marked("fe_sni"), b"show table fe_sni data.gpt0 gt 0\n"),
        (protocol.show_tls_keys("/k/tls.keys"), b"show tls-keys /k/tls.keys\n"),
        (protocol.set_tls_key("/k/tls.keys", "QUJD="), b"set ssl tls-key /k/tls.keys QUJD=\n"),
        (protocol.add_map(MAP, TOKEN, KEYAUTH), f"add map {MAP} {TOKEN} {KEYAUTH}\n".encode()),
        (protocol.del_map(MAP, TOKEN), f"del map {MAP} {TOKEN}\n".encode()),
    ],
)
def test_each_builder_spells_its_command(command: Command, line: bytes) -> None:
    assert command.payload is None
    assert command.encode() == line


def test_payload_builders() -> None:
    line = f"set ssl cert {SLOT} <<\n".encode()
    assert protocol.set_cert(SLOT, PEM).encode() == line + PEM + b"\n"
    ocsp = protocol.set_cert_ocsp(SLOT, DER)
    assert ocsp.args == ("set", "ssl", "cert", f"{SLOT}.ocsp")
    assert ocsp.payload == base64.b64encode(DER) + b"\n"
    staple = protocol.set_ocsp_response(DER)
    assert staple.encode() == b"set ssl ocsp-response <<\n" + base64.b64encode(DER) + b"\n\n"


def test_a_hostile_host_never_becomes_a_command() -> None:
    for host in ("a.test;show info", "a.test\nshow info", "a test", ""):
        with pytest.raises(ValueError, match="unsafe"):
            protocol.set_mark("fe_sni", host, 1).encode()


def test_command_encoding_checks_the_bufsize() -> None:
    big = protocol.set_cert(SLOT, (b"B" * 64 + b"\n") * 300)
    with pytest.raises(PayloadTooLarge):
        big.encode()
    assert big.encode(bufsize=65536).startswith(b"set ssl cert ")


def test_a_command_in_a_log_hides_payloads_and_ticket_keys() -> None:
    assert str(protocol.set_cert(SLOT, PEM)) == f"set ssl cert {SLOT} <<payload"
    assert str(protocol.set_tls_key("/k", "c2VjcmV0")) == "set ssl tls-key /k <key>"
    assert str(protocol.show_marked("fe_sni")) == "show table fe_sni data.gpt0 gt 0"


# --- session ----------------------------------------------------------------------------


def test_identity_from_show_info() -> None:
    reply = "Name: HAProxy\nVersion: 2.6.12-1+deb12u1\nPid: 5538\nStart_time_sec: 17\n"
    assert protocol.parse_identity(reply) == protocol.Identity(5538, 17, "2.6.12-1+deb12u1")
    assert protocol.parse_identity("Pid: 9\n") == protocol.Identity(9, 0, "?")
    with pytest.raises(HAProxyError, match="Pid='x'"):
        protocol.parse_identity("Pid: x\n")
    with pytest.raises(HAProxyError, match="unexpected"):
        protocol.parse_identity("Unknown command.")


# --- crt-lists and the usage table ---------------------------------------------------------


def test_the_crtlists_of_the_configuration() -> None:
    reply = f"{LIST}\n/etc/haproxy/other.crtlist\n"
    assert protocol.parse_show_crtlists(reply) == (LIST, "/etc/haproxy/other.crtlist")
    assert protocol.parse_show_crtlists("") == ()


def test_a_table_dump_names_its_table() -> None:
    dump = "# table: fe_sni, type: string, size:4000, used:1\n0x55: key=a.test use=0 exp=9 gpt0=1"
    assert protocol.is_table_dump("fe_sni", dump)
    assert not protocol.is_table_dump("fe_sni", "No such table: fe_sni")
    assert not protocol.is_table_dump("fe", dump)


def test_marks_answer_nothing() -> None:
    protocol.check_set_mark("")
    with pytest.raises(CommandFailed, match="set table"):
        protocol.check_set_mark("Data type not stored in this table\n")


def test_unmark_is_a_zero_mark_then_a_clear() -> None:
    assert [c.args for c in protocol.unmark("fe_sni", "a.test")] == [
        ("set", "table", "fe_sni", "key", "a.test", "data.gpt0", "0"),
        ("clear", "table", "fe_sni", "key", "a.test"),
    ]
    replies = iter(["", "", "", protocol.IN_USE])
    protocol.check_unmark(replies)
    protocol.check_unmark(replies)  # an entry a connection holds is already neutral
    assert next(replies, None) is None
    with pytest.raises(CommandFailed):
        protocol.check_unmark(iter(["", "No such table: fe_sni"]))
    with pytest.raises(CommandFailed):
        protocol.check_unmark(iter(["Unknown table", ""]))


# --- the transaction ------------------------------------------------------------------------


def test_a_transaction_is_set_commit_abort() -> None:
    t = Transaction(SLOT, PEM)
    assert [c.args for c in t.commands()] == [
        ("set", "ssl", "cert", SLOT),
        ("commit", "ssl", "cert", SLOT),
        ("abort", "ssl", "cert", SLOT),
    ]
    assert t.commands()[0].payload == PEM and t.size == 3
    t.check([CREATED, COMMITTED, NO_TRANSACTION])


def test_a_transaction_with_an_ocsp_response() -> None:
    t = Transaction(SLOT, PEM, DER)
    assert [c.args[3] for c in t.commands()] == [SLOT, f"{SLOT}.ocsp", SLOT, SLOT]
    assert t.size == 4
    updated = f"Transaction updated for certificate {SLOT}!"
    t.check([CREATED, updated, COMMITTED, NO_TRANSACTION])


def test_a_staple_alone_keeps_the_certificate() -> None:
    t = Transaction(SLOT, None, DER)
    assert [c.args[:3] for c in t.commands()] == [
        ("set", "ssl", "cert"), ("commit", "ssl", "cert"), ("abort", "ssl", "cert"),
    ]  # fmt: skip
    assert t.commands()[0].args[3] == f"{SLOT}.ocsp"
    t.check([CREATED, COMMITTED, NO_TRANSACTION])
    with pytest.raises(ValueError, match="needs a certificate"):
        Transaction(SLOT, None, None)


def test_a_failed_commit_is_reported_and_its_abort_not_judged() -> None:
    t = Transaction(SLOT, PEM)
    failed = f"Committing {SLOT}\ninconsistencies between private key and certificate loaded."
    with pytest.raises(CommandFailed, match="inconsistencies"):
        t.check([CREATED, failed + "\nFailed!", ABORTED])


def test_a_refused_set_is_reported_first() -> None:
    t = Transaction(SLOT, PEM)
    refused = "unable to load certificate from file '/c'.\nCan't load the payload\nCan't update /c!"
    with pytest.raises(CommandFailed, match="set ssl cert"):
        t.check([refused, f"No ongoing transaction! !\nCan't commit {SLOT}!", NO_TRANSACTION])


def test_a_set_merged_into_another_transaction_is_wrong_transaction() -> None:
    t = Transaction(SLOT, PEM)
    merged = f"Transaction updated for certificate {OTHER}!"
    about = f"The ongoing transaction is about '{OTHER}' but you are trying to set '{SLOT}'"
    with pytest.raises(WrongTransaction, match="slot-00002"):
        t.check([merged, about, about])
    with pytest.raises(WrongTransaction):
        t.check([CREATED, f"Committing {OTHER}\nSuccess!", NO_TRANSACTION])


def test_a_locked_transaction_says_so() -> None:
    t = Transaction(SLOT, PEM)
    with pytest.raises(Locked):
        t.check([protocol.LOCKED, f"No ongoing transaction! !\nCan't commit {SLOT}!", ""])
    with pytest.raises(Locked):
        t.check([CREATED, protocol.LOCKED, protocol.LOCKED])


def test_a_transaction_needs_one_reply_per_command() -> None:
    with pytest.raises(ValueError, match="2 replies for 3"):
        Transaction(SLOT, PEM).check([CREATED, COMMITTED])


def test_a_crtlist_line_with_options_goes_as_a_payload() -> None:
    command = protocol.add_crtlist_line(LIST, "/certagent/chal-1.pem", "[alpn acme-tls/1]")
    assert command.encode() == (
        f"add ssl crt-list {LIST} <<\n/certagent/chal-1.pem [alpn acme-tls/1]\n\n".encode()
    )
    # answered like a plain line: one '.' per bind using the crt-list
    reply = f"Inserting certificate '/certagent/chal-1.pem' in crt-list '{LIST}'.\nSuccess!"
    protocol.check_add_crtlist(LIST, "/certagent/chal-1.pem", reply)


@pytest.mark.parametrize(
    "options", ["alpn acme-tls/1", "[alpn acme-tls/1]\nshow info", "[alpn x] [y]", "[alpn a;b]"]
)
def test_crtlist_options_are_one_bracketed_list_of_plain_words(options: str) -> None:
    with pytest.raises(ValueError, match="unsafe crt-list options"):
        protocol.add_crtlist_line(LIST, "/certagent/chal-1.pem", options)


@pytest.mark.parametrize("key", ["a b", "a;b", "a\nb", "", "a'b"])
def test_map_keys_and_values_are_plain_tokens(key: str) -> None:
    with pytest.raises(ValueError, match="unsafe runtime-API argument"):
        protocol.add_map(MAP, key, KEYAUTH).encode()
    with pytest.raises(ValueError, match="unsafe runtime-API argument"):
        protocol.add_map(MAP, TOKEN, key).encode()


def test_map_replies() -> None:
    protocol.check_empty("add map", "")  # success: nothing
    with pytest.raises(CommandFailed):
        protocol.check_empty("add map", "Unknown map identifier. Please use #<id> or <file>.")
    assert protocol.check_del_map("del map", "") is True
    assert protocol.check_del_map("del map", "Key not found.") is False
