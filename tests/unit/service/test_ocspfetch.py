"""OCSP fetching: once when loaded without a response, skipped when another agent fetched."""

from __future__ import annotations

import asyncio
import datetime as dt

from cryptography.hazmat.primitives import serialization

from certagent.certs.pem import parse_bundle
from certagent.runtime.pool import Slot, SlotPool
from certagent.service.ocspfetch import OcspFetcher
from certagent.store.base import StoredCertificate
from certagent.testing.certs import issue, key_pem, make_ca, shared_key
from certagent.testing.ocsp import issue_with_responder, ocsp_response
from tests.memstore import MemoryStore


async def test_fetch_store_and_reschedule_then_skip_what_another_agent_fetched() -> None:
    ca = make_ca()
    key = shared_key()
    leaf = issue_with_responder(ca, "f.example.test", "http://127.0.0.1:9/", key)
    chain = leaf.public_bytes(serialization.Encoding.PEM) + ca.chain_pem
    store = MemoryStore()
    record = await store.add(parse_bundle(chain, key_pem(key)))
    pool = SlotPool(10, "/certagent/slot-")
    pool.place(Slot("/certagent/slot-00001.pem", "FP", record.id, {"f.example.test"}))
    asked: list[str] = []

    async def post(url: str, body: bytes) -> bytes:
        asked.append(url)
        return ocsp_response(ca, leaf)

    fetcher = OcspFetcher(store, pool, post=post)
    found = await store.lookup_all("f.example.test")
    fetcher.loaded("f.example.test", found)
    fetcher.loaded("f.example.test", found)  # already scheduled: once
    stop = asyncio.Event()
    task = asyncio.create_task(fetcher.run(stop))
    for _ in range(100):
        if fetcher.counters.fetched:
            break
        await asyncio.sleep(0.02)
    assert asked == ["http://127.0.0.1:9/"]
    assert store.ocsp[record.id] is not None
    assert fetcher.status()["queued"] == 1  # the next one, halfway to nextUpdate

    # another agent fetched a newer response meanwhile: this one only reschedules
    newer = ocsp_response(ca, leaf, this_update=dt.datetime.now(dt.UTC))
    await store.put_ocsp(record.id, newer, dt.datetime.now(dt.UTC))
    await fetcher._turn(record.id, "f.example.test", None)
    assert asked == ["http://127.0.0.1:9/"] and fetcher.counters.skipped == 1

    # a certificate that left HAProxy is dropped when its turn comes
    pool.clear()
    await fetcher._turn(record.id, "f.example.test", None)
    assert fetcher.counters.skipped == 2
    stop.set()
    await task


def test_a_certificate_without_a_responder_is_not_scheduled() -> None:
    ca = make_ca()
    chain, key = issue(ca, "n.example.test", key=shared_key())
    fetcher = OcspFetcher(MemoryStore(), SlotPool(1, "/s-"))
    bundle = parse_bundle(chain, key)
    assert bundle.ocsp_url is None
    fetcher.loaded("n.example.test", (StoredCertificate("x", bundle),))
    assert fetcher.status()["queued"] == 0


def test_the_responder_is_read_once_with_the_leaf_and_schedules_a_fetch() -> None:
    ca = make_ca()
    key = shared_key()
    leaf = issue_with_responder(ca, "r.example.test", "http://127.0.0.1:9/ocsp", key)
    chain = leaf.public_bytes(serialization.Encoding.PEM) + ca.chain_pem
    bundle = parse_bundle(chain, key_pem(key))
    assert bundle.ocsp_url == "http://127.0.0.1:9/ocsp"
    fetcher = OcspFetcher(MemoryStore(), SlotPool(1, "/s-"))
    fetcher.loaded("r.example.test", (StoredCertificate("x", bundle),))
    assert fetcher.status()["queued"] == 1
