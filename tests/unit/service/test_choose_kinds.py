"""choose_kinds: the best certificate of each kind, so a renewal's successor is swapped in."""

from __future__ import annotations

import datetime as dt

from certagent.certs.pem import parse_bundle
from certagent.config import DualCerts
from certagent.service.ensure import choose_kinds
from certagent.store.base import StoredCertificate
from certagent.store.records import best_first
from certagent.testing.certs import issue, make_ca

NOW = dt.datetime.now(dt.UTC)


def stored(cert_id: str, key_type: str, days: int) -> StoredCertificate:
    chain, key = issue(
        make_ca(), "kinds.test", key_type=key_type, not_after=NOW + dt.timedelta(days=days)
    )
    return StoredCertificate(cert_id, parse_bundle(chain, key))


def test_a_renewed_certificate_and_the_one_it_replaces_load_as_one() -> None:
    old, new = stored("old", "ec", 10), stored("new", "ec", 60)
    for policy in DualCerts:
        assert choose_kinds(best_first([old, new]), policy) == (new,)


def test_one_certificate_of_each_kind_with_both() -> None:
    ec_old, ec_new, rsa = stored("e1", "ec", 10), stored("e2", "ec", 60), stored("r", "rsa", 30)
    found = best_first([ec_old, rsa, ec_new])
    assert choose_kinds(found, DualCerts.BOTH) == (ec_new, rsa)
    assert choose_kinds(found, DualCerts.ECDSA) == (ec_new,)
    assert choose_kinds(found, DualCerts.RSA) == (rsa,)
    assert choose_kinds((ec_old,), DualCerts.RSA) == (ec_old,)  # only the other kind: kept
