"""The runtime-API protocol against replies recorded from HAProxy 2.6.12 (Debian 12)."""

from __future__ import annotations

import pytest

from certagent.errors import CommandFailed, HAProxyError, Locked, PayloadTooLarge, WrongTransaction
from certagent.runtime import protocol

SLOT = "/certagent/slot-00001.pem"
LIST = "/etc/certagent/certagent.crtlist"
PEM = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


# --- encoding -----------------------------------------------------------------------


def test_encode_plain_command() -> None:
    assert protocol.encode("show", "ssl", "cert") == b"show ssl cert\n"


def test_encode_payload_ends_with_one_empty_line() -> None:
    data = protocol.encode("set", "ssl", "cert", SLOT, payload=PEM)
    assert data == b"set ssl cert " + SLOT.encode() + b" <<\n" + PEM + b"\n"
    assert data.endswith(b"-----\n\n")


def test_encode_adds_missing_final_newline_to_payload() -> None:
    data = protocol.encode("set", "ssl", "cert", SLOT, payload=PEM.rstrip(b"\n"))
    assert data.endswith(b"-----END CERTIFICATE-----\n\n")


@pytest.mark.parametrize(
    "arg",
    [
        "a b",
        "a;show info",
        "a\nshow info",
        "a\r",
        "",
        "x" * 1025,
        "é.example",
        "'q'",
        "a\\b",
        "a<<",
    ],
)
def test_encode_rejects_unsafe_arguments(arg: str) -> None:
    with pytest.raises(ValueError, match="unsafe"):
        protocol.encode("add", "map", "/m", arg, "v")


def test_encode_rejects_empty_command() -> None:
    with pytest.raises(ValueError):
        protocol.encode()


@pytest.mark.parametrize("payload", [PEM + b"\n" + PEM, b"\n" + PEM, PEM.replace(b"\n", b"\r\n")])
def test_encode_rejects_payload_that_would_end_early(payload: bytes) -> None:
    with pytest.raises(ValueError, match="normalise"):
        protocol.encode("set", "ssl", "cert", SLOT, payload=payload)


def test_encode_checks_size_against_bufsize() -> None:
    big = b"A" * 64 + b"\n"
    payload = big * 300  # 19.5 kB
    with pytest.raises(PayloadTooLarge, match=r"tune\.bufsize 16384"):
        protocol.encode("set", "ssl", "cert", SLOT, payload=payload)
    assert protocol.encode("set", "ssl", "cert", SLOT, payload=payload, bufsize=32768)


def test_encode_size_limit_keeps_maxrewrite_headroom() -> None:
    line = b"B" * 99 + b"\n"
    fits = line * ((16384 - 1024 - 40) // 100)
    protocol.encode("set", "ssl", "cert", SLOT, payload=fits)
    with pytest.raises(PayloadTooLarge):
        protocol.encode("set", "ssl", "cert", SLOT, payload=fits + line * 20)


# --- framing --------------------------------------------------------------------------


def test_splitter_first_prompt_and_replies() -> None:
    s = protocol.ReplySplitter()
    assert list(s.feed(b"\n> ")) == [""]
    assert list(s.feed(b"New empty certificate store '/c'!\n\n> ")) == [
        "New empty certificate store '/c'!"
    ]


def test_splitter_strips_payload_continuation_prompts() -> None:
    s = protocol.ReplySplitter()
    reply = b"+ + + + + Transaction created for certificate /c!\n\n> "
    assert list(s.feed(reply)) == ["Transaction created for certificate /c!"]


def test_splitter_handles_arbitrary_chunking() -> None:
    stream = b"Committing /c\nSuccess!\n\n> \n> Key not found.\n\n> "
    for size in range(1, len(stream)):
        s = protocol.ReplySplitter()
        out: list[str] = []
        for i in range(0, len(stream), size):
            out.extend(s.feed(stream[i : i + size]))
        assert out == ["Committing /c\nSuccess!", "", "Key not found."]
        assert s.pending == 0


def test_splitter_keeps_partial_reply() -> None:
    s = protocol.ReplySplitter()
    assert list(s.feed(b"Committing /c\nSucc")) == []
    assert s.pending == len(b"Committing /c\nSucc")


# --- certificate replies ------------------------------------------------------------------


def test_new_cert() -> None:
    protocol.check_new_cert(SLOT, f"New empty certificate store '{SLOT}'!")
    with pytest.raises(CommandFailed, match="already exists"):
        protocol.check_new_cert(SLOT, "Certificate '/x' already exists!")


@pytest.mark.parametrize("verb", ["created", "updated"])
def test_set_cert_names_our_certificate(verb: str) -> None:
    protocol.check_set_cert(SLOT, f"Transaction {verb} for certificate {SLOT}!")


def test_set_cert_merged_into_foreign_transaction_is_detected() -> None:
    other = "/certagent/slot-00002.pem"
    with pytest.raises(WrongTransaction, match="slot-00002"):
        protocol.check_set_cert(SLOT, f"Transaction updated for certificate {other}!")


def test_set_cert_locked_is_retryable_error() -> None:
    with pytest.raises(Locked):
        protocol.check_set_cert(SLOT, protocol.LOCKED + "\nCan't update /c!")


@pytest.mark.parametrize(
    "reply",
    [
        "Can't replace a certificate which is not referenced by the configuration!\n"
        "Can't update /certagent/nothere.pem!",
        "unable to load certificate from file '/c'.\nCan't load the payload\nCan't update /c!",
        "",
    ],
)
def test_set_cert_errors(reply: str) -> None:
    with pytest.raises(CommandFailed):
        protocol.check_set_cert(SLOT, reply)


@pytest.mark.parametrize("dots", ["", ".", ".."])
def test_commit_success_with_instance_progress_dots(dots: str) -> None:
    protocol.check_commit_cert(SLOT, f"Committing {SLOT}{dots}\nSuccess!")


def test_commit_failures() -> None:
    with pytest.raises(CommandFailed, match="inconsistencies"):
        protocol.check_commit_cert(
            SLOT,
            f"Committing {SLOT}\ninconsistencies between private key and certificate loaded "
            f"'{SLOT}'.\nFailed!",
        )
    with pytest.raises(CommandFailed, match="No ongoing transaction"):
        protocol.check_commit_cert(SLOT, f"No ongoing transaction! !\nCan't commit {SLOT}!")


def test_commit_of_another_certificate_is_detected() -> None:
    with pytest.raises(WrongTransaction):
        protocol.check_commit_cert(SLOT, "Committing /certagent/slot-00009.pem\nSuccess!")


def test_abort_cert() -> None:
    protocol.check_abort_cert(SLOT, f"Transaction aborted for certificate '{SLOT}'!")
    with pytest.raises(CommandFailed):
        protocol.check_abort_cert(SLOT, "No ongoing transaction!")


@pytest.mark.parametrize("dots", [".", ".."])
def test_add_crtlist_with_one_dot_per_bind(dots: str) -> None:
    protocol.check_add_crtlist(
        LIST, SLOT, f"Inserting certificate '{SLOT}' in crt-list '{LIST}'{dots}\nSuccess!"
    )


def test_add_crtlist() -> None:
    protocol.check_add_crtlist(
        LIST, SLOT, f"Inserting certificate '{SLOT}' in crt-list '{LIST}'.\nSuccess!"
    )
    with pytest.raises(CommandFailed):
        protocol.check_add_crtlist(LIST, SLOT, f"crt-list '{LIST}' does not exist!")
    with pytest.raises(CommandFailed):
        protocol.check_add_crtlist(
            LIST, SLOT, f"Inserting certificate '/other' in crt-list '{LIST}'.\nSuccess!"
        )


def test_map_replies() -> None:
    protocol.check_empty("add map", "")
    with pytest.raises(CommandFailed, match="Unknown map"):
        protocol.check_empty("add map", "Unknown map identifier. Please use #<id> or <file>.")
    assert protocol.check_del_map("del map", "") is True
    assert protocol.check_del_map("del map", "Key not found.") is False
    with pytest.raises(CommandFailed):
        protocol.check_del_map("del map", "Unknown map identifier.")


# --- show parsers -----------------------------------------------------------------------------


def test_show_ssl_cert_with_transaction() -> None:
    reply = (
        "# transaction\n*/certagent/slot-00001.pem\n# filename\n"
        "/certagent/slot-00001.pem\n/etc/certagent/default.pem"
    )
    got = protocol.parse_show_ssl_cert(reply)
    assert got.transaction == "/certagent/slot-00001.pem"
    assert got.names == ("/certagent/slot-00001.pem", "/etc/certagent/default.pem")


def test_show_ssl_cert_without_transaction() -> None:
    got = protocol.parse_show_ssl_cert("# filename\n/etc/certagent/default.pem")
    assert got == protocol.CertList(("/etc/certagent/default.pem",), None)


def test_show_ssl_cert_unexpected_text() -> None:
    with pytest.raises(HAProxyError):
        protocol.parse_show_ssl_cert("Unknown command")


def test_cert_details() -> None:
    reply = (
        "Filename: /certagent/slot-00001.pem\nStatus: Used\n"
        "Serial: 7B5CAF2C377755F9832D537D705FEAF4062B5BFF\n"
        "notBefore: Nov 22 02:53:14 2026 GMT\nnotAfter: Dec 22 02:53:14 2026 GMT\n"
        "Subject Alternative Name: DNS:a.example.test, DNS:*.B.example.test, IP Address:1.2.3.4\n"
        "Algorithm: EC256\nSHA1 FingerPrint: a85040e56c8a07b953fe40e7a5c1cb4bb2f39392\n"
        "Subject: /CN=a.example.test\nIssuer: /CN=a.example.test\nOCSP Response Key: "
    )
    d = protocol.parse_cert_details(reply)
    assert d.name == "/certagent/slot-00001.pem"
    assert d.status == "Used"
    assert d.fingerprint_sha1 == "A85040E56C8A07B953FE40E7A5C1CB4BB2F39392"
    assert d.dns_names == ("a.example.test", "*.b.example.test")
    assert d.subject == "/CN=a.example.test"


def test_cert_details_of_transaction_and_garbage() -> None:
    d = protocol.parse_cert_details("Filename: */c.pem\nStatus: Unused\n")
    assert d.name == "/c.pem"
    assert d.fingerprint_sha1 == ""
    with pytest.raises(HAProxyError):
        protocol.parse_cert_details("Can't display the certificate: Not found or the .")


def test_show_crtlist_entries_and_options() -> None:
    reply = "# /etc/l.crtlist\n/certagent/slot-00001.pem\n/certagent/slot-00002.pem [alpn h2] a.b"
    assert protocol.parse_show_crtlist(reply) == (
        "/certagent/slot-00001.pem",
        "/certagent/slot-00002.pem",
    )


def test_show_map() -> None:
    reply = (
        "0x55b824c740a0 a.example.test /certagent/slot-00001.pem\n"
        "0x55b824c740b0 b.example.test /certagent/slot-00002.pem\nnoise"
    )
    assert protocol.parse_show_map(reply) == [
        ("a.example.test", "/certagent/slot-00001.pem"),
        ("b.example.test", "/certagent/slot-00002.pem"),
    ]


def test_show_info() -> None:
    info = protocol.parse_show_info("Name: HAProxy\nPid: 5538\nUptime_sec: 9\nStart_time_sec: 17\n")
    assert info["Pid"] == "5538"
    assert info["Start_time_sec"] == "17"
    with pytest.raises(HAProxyError):
        protocol.parse_show_info("Permission denied")


def test_show_table() -> None:
    reply = (
        "# table: fe_sni, type: string, size:102400, used:3\n"
        "0x55b824c74628: key=a.example.test use=0 exp=3599953 conn_cnt=1\n"
        "0x7ff5e8042388: key=b.example.test use=2 exp=12 conn_cnt=40\n"
        "0x7ff5e8042399: key=we ird use=0 exp=1 conn_cnt=1\n"
    )
    got = protocol.parse_show_table(reply)
    assert [(e.key, e.expire_ms, e.conn_cnt) for e in got] == [
        ("a.example.test", 3599953, 1),
        ("b.example.test", 12, 40),
    ]
