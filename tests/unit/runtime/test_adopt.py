"""Adoption: the slot pool rebuilt from a fake HAProxy behind a runtime socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from certagent.certs.selfsigned import PLACEHOLDER_NAME
from certagent.errors import StrayTransaction
from certagent.runtime.adopt import adopt
from certagent.runtime.client import RuntimeClient
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import SlotPool, SlotState
from tests.unit.runtime.fakehaproxy import FakeRuntimeSocket, HAProxyModel, fingerprint

LIST = "/etc/certagent/certagent.crtlist"
NAMES = HAProxyNames(LIST, "fe_sni", 3_600_000)
PREFIX = "/certagent/slot-"
S1, S2, S3, S4, S5 = (f"{PREFIX}{n:05d}.pem" for n in range(1, 6))
A = b"-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n"
FREE = b"-----BEGIN CERTIFICATE-----\nPLACEHOLDER\n-----END CERTIFICATE-----\n"


async def adopted(model: HAProxyModel, sockdir: Path) -> SlotPool:
    pool = SlotPool(10, PREFIX)
    async with FakeRuntimeSocket(sockdir / "admin.sock", model) as fake:
        client = RuntimeClient(str(fake.path), timeout=1.0)
        await client.connect()
        try:
            await adopt(client, pool, NAMES, now=50.0)
        finally:
            await client.close()
    return pool


async def test_an_empty_haproxy_gives_an_empty_pool(sockdir: Path) -> None:
    model = HAProxyModel(crt_list=LIST, certs={"/etc/certagent/default.pem": b"d"})
    pool = await adopted(model, sockdir)
    assert len(pool) == 0 and pool.free_slots == ()
    assert pool.growth(1) == [(S1, SlotState.NEW)]


async def test_slots_free_and_spare_names_and_marked_hosts_are_adopted(sockdir: Path) -> None:
    model = HAProxyModel(
        crt_list=LIST,
        certs={"/etc/certagent/default.pem": b"d", S1: A, S2: FREE, S3: None},
        listed=[S1, S2],
        marks={"a.example.test": 1, "www.a.example.test": 1, "gone.test": 4},
        names={A: ("a.example.test", "*.a.example.test"), FREE: (PLACEHOLDER_NAME,)},
    )
    pool = await adopted(model, sockdir)
    (slot,) = pool.slots
    assert slot.name == S1 and slot.fingerprint == fingerprint(A)
    assert slot.hosts == {"a.example.test", "www.a.example.test"}
    assert slot.names == ("a.example.test", "*.a.example.test") and slot.loaded_at == 50.0
    assert pool.for_wildcard("*.a.example.test") is slot
    assert pool.free_slots == (S2,)
    assert pool.growth(3) == [(S2, SlotState.LISTED), (S3, SlotState.KNOWN), (S4, SlotState.NEW)]
    # a mark of a slot that holds no certificate is taken back
    assert "gone.test" not in model.marks


async def test_two_slots_with_one_certificate_keep_the_hosts_of_one(sockdir: Path) -> None:
    model = HAProxyModel(
        crt_list=LIST,
        certs={S1: A, S5: A},
        listed=[S1, S5],
        marks={"a.example.test": 1, "b.example.test": 5},
        names={A: ("a.example.test", "b.example.test")},
    )
    pool = await adopted(model, sockdir)
    first, second = pool.get(S1), pool.get(S5)
    assert first is not None and second is not None
    assert pool.for_fingerprint(fingerprint(A)) is first
    assert first.hosts == {"a.example.test"} and second.hosts == set()
    assert second.fingerprint == f"duplicate:{S5}"  # recycled first
    assert model.marks == {"a.example.test": 1}


async def test_an_open_transaction_is_never_touched(sockdir: Path) -> None:
    model = HAProxyModel(crt_list=LIST, certs={S1: A}, listed=[S1], transaction=(S1, None))
    model.marks["a.example.test"] = 1
    with pytest.raises(StrayTransaction, match=S1):
        await adopted(model, sockdir)
    assert model.transaction == (S1, None)
    verbs = {" ".join(args[:3]) for args in model.log}
    assert verbs == {"show info", "show ssl cert"}  # read, nothing written
