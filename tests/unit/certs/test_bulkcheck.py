"""UploadChecker: validate_upload's answers, with the shared chain worked once.

Every case of test_validate.py also runs through an UploadChecker and must get
the same bundle or the same error; these tests check the fast path is taken
for usual uploads and that its caches cannot be fooled.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certagent.certs import bulkcheck
from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.errors import CertificateError, ChainOrder, UnrelatedChain
from certagent.testing.certs import (
    CA,
    cert_pem,
    issue,
    issue_cert,
    key_pem,
    make_ca,
    make_ca_path,
    make_key,
)

POLICY = UploadPolicy()


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca("bulk CA")


@pytest.fixture
def no_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("validate_upload was called: the fast path gave up")

    monkeypatch.setattr(bulkcheck, "validate_upload", refuse)


@pytest.mark.usefixtures("no_slow_path")
@pytest.mark.parametrize("key_type", ["ec", "rsa"])
def test_usual_uploads_take_the_fast_path(ca: CA, key_type: str) -> None:
    checker = UploadChecker(POLICY, rsa_key_check="sign")
    for i in range(3):
        chain, key = issue(ca, f"h{i}.bulk.test", key_type="rsa" if key_type == "rsa" else "ec")
        expected = validate_upload(chain, key, now=now(), policy=POLICY, rsa_key_check="sign")
        assert checker.validate(chain + key, None, now=now()) == expected


@pytest.mark.usefixtures("no_slow_path")
def test_a_deep_chain_verifies_each_intermediate_link_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deep = make_ca_path(2)
    calls: list[str] = []
    real = bulkcheck.issued

    def counting(issuer: x509.Certificate, cert: x509.Certificate) -> bool:
        calls.append(cert.subject.rfc4514_string())
        return real(issuer, cert)

    monkeypatch.setattr(bulkcheck, "issued", counting)
    checker = UploadChecker(POLICY)
    for i in range(4):
        chain, key = issue(deep, f"d{i}.bulk.test")
        checker.validate(chain, key, now=now())
    assert len(calls) == len(deep.chain) - 1  # the links between intermediates, once


def test_a_look_alike_intermediate_is_not_taken_for_the_cached_one(ca: CA) -> None:
    """Same subject name, another key: its leaves are refused after the real one was cached."""
    twin_key = make_key()
    real = ca.cert
    twin = (
        x509.CertificateBuilder()
        .subject_name(real.subject)
        .issuer_name(real.issuer)
        .public_key(twin_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(real.not_valid_before_utc)
        .not_valid_after(real.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(twin_key, real.signature_hash_algorithm)  # type: ignore[arg-type]
    )
    twin_ca = dataclasses.replace(ca, cert=twin, key=twin_key, chain=(twin,))
    checker = UploadChecker(POLICY)
    chain, key = issue(ca, "real.bulk.test")
    checker.validate(chain, key, now=now())
    # a leaf signed by the twin, sent with the real intermediate
    leaf_key = make_key()
    forged = issue_cert(twin_ca, "forged.bulk.test", key=leaf_key)
    upload = cert_pem(forged) + ca.chain_pem, key_pem(leaf_key)
    with pytest.raises(UnrelatedChain) as info:
        checker.validate(*upload, now=now())
    with pytest.raises(UnrelatedChain) as slow:
        validate_upload(*upload, now=now(), policy=POLICY)
    assert str(info.value) == str(slow.value)


def test_a_leaf_with_a_damaged_signature_is_refused(ca: CA) -> None:
    chain, key = issue(ca, "damaged.bulk.test")
    leaf = x509.load_pem_x509_certificate(chain)
    der = bytearray(leaf.public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0x01  # inside the signature's INTEGER s
    damaged = x509.load_der_x509_certificate(bytes(der))
    upload = cert_pem(damaged) + ca.chain_pem, key
    checker = UploadChecker(POLICY)
    checker.validate(chain, key, now=now())  # the intermediate is cached
    errors: list[CertificateError] = []
    for validate in (
        lambda: checker.validate(*upload, now=now()),
        lambda: validate_upload(*upload, now=now(), policy=POLICY),
    ):
        with pytest.raises(CertificateError) as info:
            validate()
        errors.append(info.value)
    assert type(errors[0]) is type(errors[1]) and str(errors[0]) == str(errors[1])
    assert isinstance(errors[0], UnrelatedChain | ChainOrder)


def test_tbs_names_are_the_names_der(ca: CA) -> None:
    for cert in (ca.cert, ca.root, x509.load_pem_x509_certificate(issue(ca, "n.bulk.test")[0])):
        issuer, subject = bulkcheck._tbs_names(cert.tbs_certificate_bytes)
        assert issuer == cert.issuer.public_bytes()
        assert subject == cert.subject.public_bytes()


def test_the_caches_are_bounded(ca: CA, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulkcheck, "CACHED", 2)
    checker = UploadChecker(POLICY)
    for i in range(4):
        other = make_ca(f"bulk CA {i}")
        chain, key = issue(other, f"c{i}.bulk.test")
        checker.validate(chain, key, now=now())
        assert len(checker._chain) <= 2
