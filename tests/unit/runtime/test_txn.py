"""A transaction sent on its own, against a fake HAProxy 2.6.12 behind a runtime socket."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from certagent.errors import CommandFailed, Locked, WrongTransaction
from certagent.runtime import protocol, txn
from certagent.runtime.client import RuntimeClient
from certagent.runtime.protocol import Transaction
from tests.unit.runtime.fakehaproxy import FakeRuntimeSocket, HAProxyModel

SLOT = "/certagent/slot-00001.pem"
OTHER = "/certagent/slot-00002.pem"
OLD = b"-----BEGIN CERTIFICATE-----\nOLD\n-----END CERTIFICATE-----\n"
NEW = b"-----BEGIN CERTIFICATE-----\nNEW\n-----END CERTIFICATE-----\n"
DER = b"\x30\x03\x0a\x01\x00"


@pytest.fixture
async def haproxy(sockdir: Path) -> AsyncIterator[tuple[HAProxyModel, RuntimeClient]]:
    model = HAProxyModel(certs={SLOT: OLD, OTHER: OLD}, listed=[SLOT, OTHER])
    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        await client.connect()
        model.log.clear()
        yield model, client
        await client.close()


def verbs(model: HAProxyModel) -> list[str]:
    return [" ".join(args[:3]) for args in model.log]


async def test_a_transaction_commits_and_leaves_nothing_open(
    haproxy: tuple[HAProxyModel, RuntimeClient],
) -> None:
    model, client = haproxy
    await txn.commit(client, Transaction(SLOT, NEW))
    assert model.certs[SLOT] == NEW and model.transaction is None
    assert verbs(model) == ["set ssl cert", "commit ssl cert", "abort ssl cert"]


async def test_a_failed_commit_is_aborted_in_the_same_write(
    haproxy: tuple[HAProxyModel, RuntimeClient],
) -> None:
    model, client = haproxy
    with pytest.raises(CommandFailed, match="inconsistencies"):
        await txn.commit(client, Transaction(SLOT, NEW + b"MISMATCH\n"))
    assert model.certs[SLOT] == OLD  # still serving the old certificate
    assert model.transaction is None  # the trailing abort closed it
    assert verbs(model) == ["set ssl cert", "commit ssl cert", "abort ssl cert"]


async def test_a_locked_transaction_is_sent_again(
    haproxy: tuple[HAProxyModel, RuntimeClient],
) -> None:
    model, client = haproxy
    model.locked = 2  # the set and the commit of the first attempt
    await txn.commit(client, Transaction(SLOT, NEW))
    assert model.certs[SLOT] == NEW and model.transaction is None
    assert verbs(model).count("set ssl cert") == 2


async def test_locked_for_too_long_gives_up(haproxy: tuple[HAProxyModel, RuntimeClient]) -> None:
    model, client = haproxy
    model.locked = 100
    with pytest.raises(Locked):
        await txn.commit(client, Transaction(SLOT, NEW), retries=2)
    assert verbs(model).count("set ssl cert") == 3
    assert model.certs[SLOT] == OLD


async def test_a_foreign_transaction_is_detected_and_never_committed(
    haproxy: tuple[HAProxyModel, RuntimeClient],
) -> None:
    model, client = haproxy
    model.transaction = (OTHER, OLD)  # another writer's, open
    with pytest.raises(WrongTransaction, match="slot-00002"):
        await txn.commit(client, Transaction(SLOT, NEW))
    # our commit and abort named our certificate: HAProxy refused both
    assert model.transaction is not None and model.transaction[0] == OTHER
    assert model.certs == {SLOT: OLD, OTHER: OLD}


async def test_the_first_staple_keeps_the_certificate(
    haproxy: tuple[HAProxyModel, RuntimeClient],
) -> None:
    model, client = haproxy
    await txn.commit(client, Transaction(SLOT, None, DER))
    assert model.log[0] == ("set", "ssl", "cert", f"{SLOT}.ocsp")
    assert model.certs[SLOT] == OLD and model.transaction is None


async def test_a_fresh_response_replaces_the_stapled_one(
    haproxy: tuple[HAProxyModel, RuntimeClient], sockdir: Path
) -> None:
    model, client = haproxy
    await txn.replace_ocsp(client, DER)
    assert model.log == [("set", "ssl", "ocsp-response")]

    def refuse(args: tuple[str, ...], payload: bytes | None) -> str:
        if args == ("show", "info"):
            return "Pid: 1\n"
        assert payload == base64.b64encode(DER) + b"\n"
        return "OCSP single response: Certificate ID does not match any certificate or issuer."

    async with FakeRuntimeSocket(sockdir / "other.sock", refuse) as fake:
        other = RuntimeClient(str(fake.path), timeout=1.0)
        await other.connect()
        with pytest.raises(CommandFailed, match="Certificate ID does not match"):
            await txn.replace_ocsp(other, DER)
        await other.close()
    assert protocol.set_ocsp_response(DER).payload == base64.b64encode(DER) + b"\n"
