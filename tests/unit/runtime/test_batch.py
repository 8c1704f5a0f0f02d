"""A batch of loads: its commands in order, and the judgement of recorded replies (sans I/O)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from certagent.certs.pem import parse_bundle
from certagent.errors import CommandFailed, WrongTransaction
from certagent.runtime import protocol
from certagent.runtime.batch import BatchVerdict, Load, judge, load_commands
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import Slot, SlotState
from certagent.store.base import StoredCertificate
from certagent.testing.certs import issue, make_ca, shared_key
from tests.unit.runtime.fakehaproxy import HAProxyModel

LIST = "/etc/certagent/certagent.crtlist"
NAMES = HAProxyNames(LIST, "fe_sni", 3_600_000)
S1, S2 = "/certagent/slot-00001.pem", "/certagent/slot-00002.pem"
CA = make_ca()
DER = b"\x30\x03\x0a\x01\x00"


def stored(host: str, ocsp: bytes | None = None) -> StoredCertificate:
    chain, key = issue(CA, host, key=shared_key())
    return StoredCertificate(id=f"id-{host}", bundle=parse_bundle(chain, key), ocsp=ocsp)


A, B = stored("a.example.test"), stored("b.example.test")


def shape(commands: Sequence[protocol.Command]) -> list[str]:
    return [" ".join(c.args[:3]) + (" <<" if c.payload is not None else "") for c in commands]


def test_a_load_into_a_new_slot() -> None:
    commands = load_commands(NAMES, [Load(A, S1, SlotState.NEW, None)])
    assert shape(commands) == [
        "new ssl cert", "set ssl cert <<", "commit ssl cert", "abort ssl cert", "add ssl crt-list",
    ]  # fmt: skip
    assert commands[1].payload == A.bundle.pem
    assert commands[-1].args == ("add", "ssl", "crt-list", LIST, S1)


def test_a_known_slot_skips_new_and_a_listed_one_the_crtlist_line() -> None:
    known = load_commands(NAMES, [Load(A, S1, SlotState.KNOWN, None)])
    transaction = ["set ssl cert <<", "commit ssl cert", "abort ssl cert"]
    assert shape(known) == [*transaction, "add ssl crt-list"]
    listed = load_commands(NAMES, [Load(A, S1, SlotState.LISTED, None)])
    assert shape(listed) == transaction


def test_recycling_unmarks_the_victims_hosts_first_and_staples_in_the_transaction() -> None:
    victim = Slot(S1, "F", "id-old", {"y.test", "x.test"})
    load = Load(stored("c.example.test", ocsp=DER), S1, SlotState.LISTED, victim)
    assert load.old_hosts == ("x.test", "y.test")
    commands = load_commands(NAMES, [load])
    assert [c.args for c in commands[:4]] == [
        ("set", "table", "fe_sni", "key", "x.test", "data.gpt0", "0"),
        ("clear", "table", "fe_sni", "key", "x.test"),
        ("set", "table", "fe_sni", "key", "y.test", "data.gpt0", "0"),
        ("clear", "table", "fe_sni", "key", "y.test"),
    ]
    assert shape(commands[4:]) == [
        "set ssl cert <<", "set ssl cert <<", "commit ssl cert", "abort ssl cert",
    ]  # fmt: skip
    assert commands[5].args[3] == f"{S1}.ocsp"
    # the batch and a transaction sent alone are one implementation
    assert commands[4:] == load.transaction.commands()


def test_judging_a_good_batch() -> None:
    loads = [Load(A, S1, SlotState.NEW, None), Load(B, S2, SlotState.LISTED, None)]
    replies = [
        f"New empty certificate store '{S1}'!",
        f"Transaction created for certificate {S1}!",
        f"Committing {S1}\nSuccess!",
        "No ongoing transaction!",
        f"Inserting certificate '{S1}' in crt-list '{LIST}'.\nSuccess!",
        f"Transaction created for certificate {S2}!",
        f"Committing {S2}.\nSuccess!",
        "No ongoing transaction!",
    ]
    assert judge(NAMES, loads, replies) == BatchVerdict(created=(S1,), stale=())
    assert [ld.error for ld in loads] == [None, None]


def test_a_failed_load_does_not_shift_the_next_ones_replies() -> None:
    loads = [Load(A, S1, SlotState.NEW, None), Load(B, S2, SlotState.NEW, None)]
    replies = [
        f"New empty certificate store '{S1}'!",
        f"Transaction created for certificate {S1}!",
        f"Committing {S1}\ninconsistencies between private key and certificate loaded.\nFailed!",
        f"Transaction aborted for certificate '{S1}'!",
        f"Can't edit the crt-list: certificate '{S1}' is empty!",
        f"New empty certificate store '{S2}'!",
        f"Transaction created for certificate {S2}!",
        f"Committing {S2}\nSuccess!",
        "No ongoing transaction!",
        f"Inserting certificate '{S2}' in crt-list '{LIST}'.\nSuccess!",
    ]
    verdict = judge(NAMES, loads, replies)
    assert verdict == BatchVerdict(created=(S1, S2), stale=())  # S1 exists, empty: a spare
    assert isinstance(loads[0].error, CommandFailed) and loads[1].error is None


def test_a_spare_listed_after_its_commit_failed_is_stale() -> None:
    """A spare name from an earlier agent may hold a certificate: listed, it would serve it."""
    load = Load(A, S1, SlotState.KNOWN, None)
    replies = [
        f"Transaction created for certificate {S1}!",
        f"Committing {S1}\nunable to load certificate\nCan't commit {S1}!",
        f"Transaction aborted for certificate '{S1}'!",
        f"Inserting certificate '{S1}' in crt-list '{LIST}'.\nSuccess!",
    ]
    assert judge(NAMES, [load], replies) == BatchVerdict(created=(), stale=(S1,))
    assert load.error is not None


def test_a_foreign_transaction_stops_the_whole_batch() -> None:
    load = Load(A, S1, SlotState.LISTED, None)
    replies = [f"Transaction updated for certificate {S2}!", "The ongoing...", "The ongoing..."]
    with pytest.raises(WrongTransaction):
        judge(NAMES, [load], replies)


def test_a_refused_unmark_means_the_wrong_usage_table() -> None:
    load = Load(A, S1, SlotState.LISTED, Slot(S1, "F", None, {"x.test"}))
    with pytest.raises(CommandFailed, match="set table"):
        judge(NAMES, [load], ["No such table: fe_sni", "", "", "", ""])


def test_a_batch_against_the_fake_haproxy_model() -> None:
    model = HAProxyModel(crt_list=LIST, certs={S2: b"leftover"}, marks={"x.test": 2})
    model.in_use.add("x.test")  # a live connection holds the old host's entry
    victim = Slot(S2, "F", None, {"x.test"})
    loads = [
        Load(A, S1, SlotState.NEW, None),
        Load(stored("c.example.test", ocsp=DER), S2, SlotState.KNOWN, victim),
    ]
    replies = [model(c.args, c.payload) for c in load_commands(NAMES, loads)]
    assert judge(NAMES, loads, replies) == BatchVerdict(created=(S1,), stale=())
    assert [ld.error for ld in loads] == [None, None]
    assert model.listed == [S1, S2] and model.transaction is None
    assert model.marks == {"x.test": 0}  # neutral, kept while its connection lasts
