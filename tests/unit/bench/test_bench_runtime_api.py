"""The bench's runtime-API commands (``bench._runtime_api``) against replies recorded from
HAProxy 2.6.12 (Debian 12), and the pure parts of ``bench.profile_load``."""

from __future__ import annotations

import pytest

from bench import _runtime_api as api
from bench.profile_load.perf_samples import Frame, _entry_point, _give_inlined_frames_a_dso
from bench.profile_load.session import CHUNK_BYTES, CHUNK_CMDS, _chunks, check_replies
from certagent.errors import HAProxyError, WrongTransaction

SLOT = "/certagent/slot-000002"
NEW = "/certagent/new-1"
LIST = "/tmp/REC/pool.crtlist"
PEM = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
TABLE_REPLY = (
    "# table: fe, type: string, size:4000, used:3\n"
    "0x7fc7b0058448: key=h000000.pool.test use=0 exp=3599970 gpt0=1 conn_cnt=0\n"
    "0x7fc7b005e608: key=h000001.pool.test use=0 exp=3599970 gpt0=1 conn_cnt=0\n"
    "0x7fc7b0065958: key=h000002.pool.test use=0 exp=3599970 gpt0=1 conn_cnt=0"
)

RECORDED: list[tuple[api.Step, str]] = [
    (api.set_cert(SLOT, PEM), f"Transaction created for certificate {SLOT}!"),
    (api.abort_open(SLOT), f"Transaction aborted for certificate '{SLOT}'!"),
    (api.commit_cert(SLOT), f"Committing {SLOT}.\nSuccess!"),
    (api.abort_closed(SLOT), "No ongoing transaction!"),
    (api.new_cert(NEW), f"New empty certificate store '{NEW}'!"),
    (api.commit_cert(NEW), f"Committing {NEW}\nSuccess!"),
    (
        api.add_to_crtlist(LIST, NEW),
        f"Inserting certificate '{NEW}' in crt-list '{LIST}'.\nSuccess!",
    ),
    (api.show_table_key("fe", "h000000.pool.test"), TABLE_REPLY.split("\n0x7fc7b005e608")[0]),
    (api.show_table("fe"), TABLE_REPLY),
    (api.show_loaded("fe"), TABLE_REPLY),
    (api.add_map("/tmp/REC/hosts.map", "x.test", "v"), ""),
    (api.set_map("/tmp/REC/hosts.map", "x.test", SLOT), ""),
    (api.del_map("/tmp/REC/hosts.map", "x.test"), ""),
    (api.set_gpt0("fe", "x.test", 1), ""),
    (api.clear_table_key("fe", "x.test"), ""),
    (api.show_version(), "2.6.12-1+deb12u4"),
]


@pytest.mark.parametrize(("step", "reply"), RECORDED, ids=lambda v: getattr(v, "text", ""))
def test_every_step_accepts_haproxys_success_reply(step: api.Step, reply: str) -> None:
    step.check(reply)


@pytest.mark.parametrize(
    ("step", "reply"),
    [
        (api.set_cert(SLOT, PEM), "Can't replace a certificate which is not referenced"),
        (api.abort_open(SLOT), "No ongoing transaction!"),
        (api.abort_closed(SLOT), f"Transaction aborted for certificate '{SLOT}'!"),
        (api.commit_cert(SLOT), "No ongoing transaction!"),
        (api.new_cert(NEW), f"Certificate '{NEW}' already exists!"),
        (api.del_map("/m", "x.test"), "Key not found."),
        (api.add_map("/m", "x.test", "v"), "Unknown map identifier."),
        (api.show_table_key("fe", "h000001.pool.test"), TABLE_REPLY.split("\n0x7fc7b005e608")[0]),
        (api.show_table("fe"), ""),
        (api.show_version(), ""),
    ],
    ids=lambda v: getattr(v, "text", ""),
)
def test_every_step_refuses_another_reply(step: api.Step, reply: str) -> None:
    with pytest.raises(HAProxyError):
        step.check(reply)


def test_a_set_answered_for_another_certificate_is_a_wrong_transaction() -> None:
    with pytest.raises(WrongTransaction):
        api.set_cert(SLOT, PEM).check("Transaction updated for certificate /certagent/slot-9!")


def test_a_load_is_set_commit_abort_as_the_agent_sends_it() -> None:
    assert [s.text for s in api.load(SLOT, PEM)] == [
        f"set ssl cert {SLOT}",
        f"commit ssl cert {SLOT}",
        f"abort ssl cert {SLOT}",
    ]
    assert api.load(SLOT, PEM)[0].command.payload == PEM


def test_a_line_for_stack_admin_goes_through_the_agents_encoder() -> None:
    assert api.line(api.show_loaded("fe_sni")) == "show table fe_sni data.gpt0 gt 0"
    assert api.line(api.set_gpt0("fe", "a.test", 3)) == "set table fe key a.test data.gpt0 3"
    with pytest.raises(ValueError, match="unsafe"):
        api.line(api.show_table("fe; shutdown"))


def test_table_used_reads_the_header() -> None:
    assert api.table_used(TABLE_REPLY) == 3
    assert api.table_used("Unknown table.") == -1


def test_check_replies_names_the_batch_and_the_reply() -> None:
    steps = [api.add_map("/m", "a.test", "v"), api.del_map("/m", "a.test")]
    check_replies(steps, ["", ""], "maps")
    with pytest.raises(RuntimeError, match=r"maps: unexpected reply #1: 'Key not found.'"):
        check_replies(steps, ["", "Key not found."], "maps")


def test_chunks_hold_at_most_128_commands_and_64_kb() -> None:
    small = [api.show_version()] * (CHUNK_CMDS * 2 + 5)
    assert [len(c) for c in _chunks(small)] == [CHUNK_CMDS, CHUNK_CMDS, 5]
    big = [api.set_cert(SLOT, (b"A" * 60 + b"\n") * 200)] * 12  # 12,240 bytes each
    assert CHUNK_BYTES // 12_240 == 5
    assert [len(c) for c in _chunks(big)] == [5, 5, 2]


def test_a_sample_is_attributed_to_the_library_call_haproxy_made() -> None:
    frames = [
        Frame(0x10, "OSSL_DECODER_from_bio", "libcrypto.so.3"),
        Frame(0x20, "ossl_inline_helper", "inlined"),
        Frame(0x30, "PEM_read_bio_PrivateKey", "libcrypto.so.3"),
        Frame(0x4FF, "", "haproxy"),
    ]
    _give_inlined_frames_a_dso(frames)
    assert frames[1].dso == "libcrypto.so.3"
    callsites = {0x500: "PEM_read_bio_PrivateKey"}  # return address = perf's ip + 1
    assert _entry_point(frames, callsites) == "PEM_read_bio_PrivateKey  <- haproxy (static fn)"
    assert _entry_point([Frame(1, "", "haproxy")], {}) == "(HAProxy's own code) static fn"
    assert _entry_point(frames, {}) == "(no HAProxy->library call found)"
