"""The issuance roles' pure parts: checks, encodings, key layout, feed decoding, consumers.

What both stores check and encode the same way (:mod:`certagent.store.issuing`), the
Redis key layout of the issuance keys (every one on ``{global}`` in a cluster), a
record's ``managed`` field, the ``challenge`` and ``domain`` events, and the change
feed's consumers, which must ignore kinds they do not handle.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from redis.crc import key_slot

from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.pem import parse_bundle
from certagent.errors import InvalidHostname, LeaseLost
from certagent.service.ensure import NegativeCache
from certagent.store.base import Change, Store
from certagent.store.directory._index import ChangeLog
from certagent.store.issuance import AcmeAccount, Lease, PublishedChallenge
from certagent.store.issuing import (
    account_aad,
    check_account,
    check_challenge,
    check_name,
    check_node,
    check_time,
    check_token,
    check_ttl,
    clean_error,
    decode_challenge,
    decode_registration,
    encode_challenge,
    encode_registration,
    lease_lost,
    lease_value,
    parse_lease_value,
)
from certagent.store.records import make_record
from certagent.store.redis._layout import F_MANAGED, META_FIELDS, Keys
from certagent.store.redis._packed import unpack
from certagent.store.redis._records import (
    RecordEncoder,
    decode_change,
    decode_record,
    encode_record,
    meta_fields,
)
from certagent.store.view import StoreView
from certagent.testing.certs import CA, issue, make_ca, shared_key
from tests.memstore import MemoryStore
from tests.unit.service.test_live_outage import make as make_live

TOKEN = "Zm9vYmFyYmF6cXV4cXV1eA-_0123456789abcdefghij"
THUMB = "NzI5ODEyOTg3NDIxOTg3NDMyMTk4NzQzMjE5ODc0MzI"


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def challenge(**changes: object) -> PublishedChallenge:
    fields: dict[str, object] = {
        "kind": "http-01",
        "name": "A.Example.Test",
        "token": TOKEN,
        "key_authorization": f"{TOKEN}.{THUMB}",
        "expires_at": 1_900_000_000.5,
    }
    fields.update(changes)
    return PublishedChallenge(**fields)  # type: ignore[arg-type]


# --- checks ----------------------------------------------------------------------------------


def test_names_nodes_tokens_and_ttls_are_checked() -> None:
    assert check_name("A.Example.Test") == "a.example.test"
    assert check_name("*.example.test") == "*.example.test"
    for bad in ("example", "a b.test", "../x.test", "a.test\n", "{global}.test"):
        with pytest.raises(InvalidHostname):
            check_name(bad)
    assert check_node("node-1.dc:7@x") == "node-1.dc:7@x"
    for bad_node in ("", "-x", "a b", "x" * 129, "a\nb", "{global}"):
        with pytest.raises(ValueError, match="node"):
            check_node(bad_node)
    assert check_token(TOKEN) == TOKEN
    for bad_token in ("short", "a" * 257, "a/b" + "c" * 20, "a.b" + "c" * 20, "{global}" * 3):
        with pytest.raises(ValueError, match="token"):
            check_token(bad_token)
    assert check_time(5, "until") == 5.0
    for bad_time in (float("nan"), float("-inf"), "5"):
        with pytest.raises(ValueError, match="until must be a time"):
            check_time(bad_time, "until")  # type: ignore[arg-type]
    assert check_ttl(0.25) == 0.25
    for bad_ttl in (0, -1, float("nan"), float("inf"), 86_401):
        with pytest.raises(ValueError, match="TTL"):
            check_ttl(bad_ttl)


def test_a_challenge_is_checked_and_round_trips() -> None:
    checked = check_challenge(challenge())
    assert checked.name == "a.example.test"
    assert decode_challenge(encode_challenge(checked)) == checked
    assert decode_challenge(encode_challenge(checked).decode()) == checked
    with pytest.raises(ValueError, match="kind"):
        check_challenge(challenge(kind="dns-01"))
    with pytest.raises(ValueError, match="key authorization"):
        check_challenge(challenge(key_authorization=f"other{TOKEN}.{THUMB}"))
    with pytest.raises(ValueError, match="key authorization"):
        check_challenge(challenge(key_authorization=TOKEN))
    with pytest.raises(ValueError, match="time"):
        check_challenge(challenge(expires_at=float("nan")))
    for raw in (b"{", b"[]", b'{"kind": "http-01"}', b"null"):
        with pytest.raises(ValueError, match="not a stored challenge"):
            decode_challenge(raw)
    with pytest.raises(InvalidHostname):
        decode_challenge(encode_challenge(checked).replace(b"a.example.test", b"a..test"))


def test_leases_registrations_errors_and_accounts_encode_plainly() -> None:
    lease = Lease("a.example.test", "node-1", 1_700_000_000_123, 5.0)
    assert lease_value(lease) == "1700000000123 node-1"
    assert parse_lease_value(b"1700000000123 node-1") == (1_700_000_000_123, "node-1")
    assert parse_lease_value(None) is None and parse_lease_value("x node") is None
    assert parse_lease_value("12") is None
    lost = lease_lost(lease, b"1700000000999 node-2")
    assert isinstance(lost, LeaseLost)
    assert str(lost) == (
        "the lease of node node-1 on a.example.test (token 1700000000123) is no longer held:"
        " it lapsed and node node-2 holds it now (token 1700000000999); nothing was stored"
        " (that node's order counts)"
    )
    assert "no node holds it now" in str(lease_lost(lease, None))

    assert encode_registration(1_700_000_000.4, True) == "1700000000 1"
    registration = decode_registration("a.example.test", b"1700000000 0")
    assert registration.added_at == datetime.fromtimestamp(1_700_000_000, UTC)
    assert registration.issue is False
    with pytest.raises(ValueError, match="registration"):
        decode_registration("a.example.test", "1700000000 yes")

    assert clean_error("urn:ietf:params:acme:error:rateLimited\r\n\ttoo many") == (
        "urn:ietf:params:acme:error:rateLimited too many"
    )
    assert len(clean_error("x" * 5000)) == 500

    assert account_aad("https://ca.test/dir") == b"acme-account https://ca.test/dir"
    now = datetime.now(UTC)
    key = b"-----BEGIN PRIVATE KEY-----\n..."
    check_account(AcmeAccount("https://ca.test/dir", key, None, ("mailto:a@b.test",), now))
    for bad in (
        AcmeAccount("https://ca.test/a b", key, None, (), now),
        AcmeAccount("https://ca.test/dir", key, "https://ca.test/\n", (), now),
        AcmeAccount("https://ca.test/dir", key, None, ("mailto:a b",), now),
        AcmeAccount("https://ca.test/dir", b"not a key", None, (), now),
    ):
        with pytest.raises(ValueError, match="ACME"):
            check_account(bad)


# --- the Redis key layout ----------------------------------------------------------------


def test_every_issuance_key_is_on_the_global_slot_of_a_cluster() -> None:
    single, cluster = Keys("certagent:"), Keys("certagent:", cluster=True)
    assert single.lease("a.example.test") == "certagent:acme:lease:a.example.test"
    assert single.fence() == "certagent:acme:fence"
    assert single.challenges() == "certagent:acme:challenges"
    assert single.acks(TOKEN) == f"certagent:acme:acks:{TOKEN}"
    assert single.nodes() == "certagent:acme:nodes"
    assert single.domains() == "certagent:acme:domains"
    assert single.domain_info() == "certagent:acme:domain-info"
    assert single.backoff("*.example.test") == "certagent:acme:backoff:*.example.test"
    assert single.pause() == "certagent:acme:pause"
    assert single.order_slots() == "certagent:acme:orders"
    account = single.account("https://ca.test/dir")
    assert account.startswith("certagent:acme:account:") and len(account) == 23 + 32
    assert account != single.account("https://ca.test/dir2")
    assert cluster.lease("a.example.test") == "certagent:{global}:acme:lease:a.example.test"
    keys = [
        cluster.account("https://ca.test/dir"),
        cluster.lease("a.example.test"),
        cluster.fence(),
        cluster.challenges(),
        cluster.acks(TOKEN),
        cluster.nodes(),
        cluster.domains(),
        cluster.domain_info(),
        cluster.backoff("a.example.test"),
        cluster.pause(),
        cluster.order_slots(),
    ]
    assert {key_slot(k.encode()) for k in keys} == {key_slot(cluster.events().encode())}
    assert not any(k.startswith(single.name_pattern()[:-1]) for k in keys)


# --- records: the managed field -----------------------------------------------------------


def test_managed_round_trips_and_is_absent_for_uploads(ca: CA) -> None:
    chain, key = issue(ca, "m.example.test", key=shared_key())
    bundle = parse_bundle(chain, key)
    ring = KeyRing.from_text(generate_key_line("k1"))
    now = datetime(2030, 1, 1, tzinfo=UTC)
    upload = make_record("r1", bundle, version=1, updated_at=now)
    issued = make_record("r2", bundle, version=1, updated_at=now, managed="acme")
    assert upload.managed == "" and issued.managed == "acme"
    assert F_MANAGED not in encode_record(ring, upload, bundle)
    fields = encode_record(ring, issued, bundle)
    assert fields[F_MANAGED] == b"acme"

    def row(encoded: dict[object, object]) -> list[object]:
        return [encoded.get(f) for f in META_FIELDS]

    decoded = meta_fields(row(fields))  # type: ignore[arg-type]
    assert decoded is not None and decode_record("r2", decoded) == issued
    old = meta_fields(row(encode_record(ring, upload, bundle)))  # type: ignore[arg-type]
    assert old is not None and decode_record("r1", old).managed == ""
    prepared = RecordEncoder(ring).prepare(bundle, now, managed="acme")
    assert prepared.record.managed == "acme"
    assert unpack(prepared.payload).meta()[F_MANAGED] == b"acme"
    assert unpack(RecordEncoder(ring).prepare(bundle, now).payload).meta()[F_MANAGED] is None
    with pytest.raises(ValueError, match="managed"):
        encode_record(
            ring, make_record("r3", bundle, version=1, updated_at=now, managed="A B"), bundle
        )
    with pytest.raises(ValueError, match="managed"):
        decode_record("r2", {**decoded, F_MANAGED: b"NOT OK"})


# --- the change feed ---------------------------------------------------------------------


def test_the_feed_decodes_challenge_and_domain_events_and_drops_malformed_ones() -> None:
    def event(kind: str, change_id: str, names: str) -> dict[bytes, bytes]:
        return {b"kind": kind.encode(), b"id": change_id.encode(), b"names": names.encode()}

    assert decode_change(event("challenge", TOKEN, "a.example.test")) == Change(
        "challenge", TOKEN, ("a.example.test",)
    )
    assert decode_change(event("domain", "a.example.test", "a.example.test")) == Change(
        "domain", "a.example.test", ("a.example.test",)
    )
    assert decode_change(event("put", "abc", "a.example.test b.example.test")) == Change(
        "put", "abc", ("a.example.test", "b.example.test")
    )
    for bad in (
        event("challenge", "no/token", "a.example.test"),
        event("challenge", TOKEN, ""),  # a corrupt challenge withdrawn: no name
        event("challenge", TOKEN, "a.example.test b.example.test"),
        event("domain", "a.example.test", "b.example.test"),
        event("domain", "bad name", "bad name"),
        event("renewal", "x", "a.example.test"),
    ):
        assert decode_change(bad) is None


def test_the_directory_change_log_keeps_issuance_changes_apart_from_records() -> None:
    log = ChangeLog("file:///x")
    log.append(
        [
            Change("put", "a.example.test.pem", ("a.example.test",)),
            Change("domain", "a.example.test.pem", ("a.example.test.pem",)),
            Change("challenge", TOKEN, ("a.example.test",)),
            Change("challenge", TOKEN, ("a.example.test",)),
            Change("delete", "a.example.test.pem", ("a.example.test",)),
        ]
    )
    assert log.since(0) == (
        Change("delete", "a.example.test.pem", ("a.example.test",)),
        Change("challenge", TOKEN, ("a.example.test",)),
        Change("domain", "a.example.test.pem", ("a.example.test.pem",)),
    )


async def test_the_live_updater_ignores_issuance_changes() -> None:
    live, loader = make_live(3)
    negative = NegativeCache(30, 100)
    negative.add("h1.test")
    live.negative = negative
    await live.apply(
        [
            Change("challenge", TOKEN, ("h1.test",)),
            Change("domain", "h2.test", ("h2.test",)),
        ]
    )
    assert loader.unloaded == [] and live.counters.orphans == 0  # no slot looked at
    assert "h1.test" in negative
    assert live.counters.changes == 2


# --- the in-memory roles (tests/memstore.py), and a view forwards them ---------------------


def test_a_view_forwards_the_stores_issuance() -> None:
    store = MemoryStore()
    view: Store = StoreView(store, writer=MemoryStore())
    assert view.issuance() is store.issuance()
    assert store.issuance().shared

