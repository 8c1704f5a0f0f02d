from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from certagent import errors
from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.pem import CertBundle, RsaKeyCheck, normalise_pem, parse_bundle, split_blocks
from certagent.certs.validate import UPLOAD_CODES, UPLOAD_ERRORS, UploadPolicy, validate_upload
from certagent.errors import (
    BundleTooLarge,
    CaLeaf,
    CertificateError,
    ChainOrder,
    ChainTooLong,
    ConfigError,
    DuplicateCertificate,
    EncryptedKey,
    Expired,
    KeyMismatch,
    MissingKey,
    MultipleKeys,
    NoNames,
    NotYetValid,
    PemError,
    UnrelatedChain,
    UnsupportedKey,
    WeakKey,
)
from certagent.testing.certs import (
    CA,
    KeyFormat,
    KeyType,
    OddKeyType,
    any_key_pem,
    cert_pem,
    issue,
    issue_odd,
    key_pem,
    make_ca,
    make_ca_path,
    make_key,
    make_odd_key,
    shared_key,
)

POLICY = UploadPolicy()
Upload = tuple[bytes, bytes | None]


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture(scope="module")
def other_ca() -> CA:
    return make_ca("unrelated CA")


@pytest.fixture(scope="module")
def deep_ca() -> CA:
    """Root -> intermediate 1 -> intermediate 2 -> leaves."""
    return make_ca_path(2)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


#: Checkers kept for the whole module: their caches see every test's chain certificates.
CHECKERS: dict[tuple[UploadPolicy, str], UploadChecker] = {}


def validated(
    chain: bytes,
    key: bytes | None,
    *,
    now: dt.datetime,
    policy: UploadPolicy,
    rsa_key_check: RsaKeyCheck = "openssl",
) -> CertBundle:
    """validate_upload, and the import's UploadChecker, which must answer exactly the same."""
    checker = CHECKERS.setdefault(
        (policy, rsa_key_check), UploadChecker(policy, rsa_key_check=rsa_key_check)
    )
    try:
        expected = validate_upload(
            chain, key, now=now, policy=policy, rsa_key_check=rsa_key_check
        )
    except (CertificateError, ValueError) as exc:
        with pytest.raises(type(exc)) as info:
            checker.validate(chain, key, now=now)
        assert str(info.value) == str(exc)
        raise
    assert checker.validate(chain, key, now=now) == expected
    return expected


def check(upload: Upload, policy: UploadPolicy = POLICY, at: dt.datetime | None = None) -> None:
    validated(upload[0], upload[1], now=at or now(), policy=policy)


def refuse(
    error: type[CertificateError],
    upload: Upload,
    policy: UploadPolicy = POLICY,
    at: dt.datetime | None = None,
) -> CertificateError:
    """Validate, expect exactly ``error``, check the message is safe, return the exception."""
    with pytest.raises(CertificateError) as info:
        check(upload, policy, at)
    exc = info.value
    assert type(exc) is error, f"{type(exc).__name__}: {exc}"
    assert exc.code == error.code
    assert_no_key_material(exc, upload)
    return exc


def assert_no_key_material(exc: BaseException, upload: Upload, *, label_ok: bool = False) -> None:
    """No message in the exception chain quotes a key: no PEM line, no base64 body line.

    ``label_ok``: the message may name a ``PRIVATE KEY`` block (a PEM structure error).
    """
    secret_lines: list[str] = []
    inside_key = False
    for raw in (upload[0] + b"\n" + (upload[1] or b"")).splitlines():
        line = raw.strip().decode("ascii", errors="replace")
        if line.startswith("-----BEGIN") and "PRIVATE KEY" in line:
            inside_key = True
        elif line.startswith("-----END"):
            inside_key = False
        elif inside_key and len(line) > 8:
            secret_lines.append(line)
    cause: BaseException | None = exc
    while cause is not None:
        message = str(cause)
        assert label_ok or "PRIVATE KEY" not in message
        assert "-----" not in message
        assert not any(line in message for line in secret_lines)
        cause = cause.__cause__


def cert_chain(*certs: x509.Certificate) -> bytes:
    return b"".join(cert_pem(c) for c in certs)


# --- accepted uploads ----------------------------------------------------------------------


def test_valid_upload_returns_the_bundle(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test", "*.a.example.test")
    bundle = validated(chain, key, now=now(), policy=POLICY)
    assert bundle == parse_bundle(chain, key)
    assert bundle.names == ("a.example.test", "*.a.example.test")
    assert bundle.key_type == "ECDSA-P256"


@pytest.mark.parametrize(
    ("key_type", "key_format", "expected"),
    [
        ("rsa", "pkcs8", "RSA-2048"),
        ("rsa3072", "traditional", "RSA-3072"),
        ("ec384", "traditional", "ECDSA-P384"),
        ("ec", "traditional", "ECDSA-P256"),
    ],
)
def test_accepted_key_types(
    ca: CA, key_type: KeyType, key_format: KeyFormat, expected: str
) -> None:
    chain, key = issue(ca, "a.example.test", key=shared_key(key_type), key_format=key_format)
    assert validated(chain, key, now=now(), policy=POLICY).key_type == expected


def test_combined_pem_without_separate_key(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    expected = parse_bundle(chain, key)
    assert validated(chain + key, None, now=now(), policy=POLICY) == expected
    assert validated(key + chain, None, now=now(), policy=POLICY) == expected


def test_crlf_and_blank_lines_are_normalised(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    # Blank lines between blocks and inside the base64 bodies, CRLF everywhere.
    messy_chain = b"\r\n\r\n" + chain.replace(b"\n", b"\r\n\r\n")
    messy_key = key.replace(b"\n", b"\r\n \r\n")
    bundle = validated(messy_chain, messy_key, now=now(), policy=POLICY)
    assert bundle == parse_bundle(chain, key)
    assert b"\r" not in bundle.pem
    assert b"\n\n" not in bundle.pem
    assert bundle.pem == normalise_pem(bundle.pem)


def test_crlf_combined_pem(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    combined = (chain + b"\n" + key).replace(b"\n", b"\r\n")
    assert validated(combined, None, now=now(), policy=POLICY) == parse_bundle(chain, key)


def test_leaf_issued_by_a_root_without_intermediates() -> None:
    root_only = make_ca("root only", intermediate=False)
    chain, key = issue(root_only, "a.example.test")
    assert len(split_blocks(chain)) == 1
    check((chain, key))


def test_chain_may_end_with_the_root(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    check((chain + ca.root_pem, key))


def test_chain_of_max_chain_certificates_is_accepted() -> None:
    five = make_ca_path(5)
    chain, key = issue(five, "a.example.test")
    assert len(split_blocks(chain)) == POLICY.max_chain == 6
    check((chain, key))


def test_other_blocks_are_ignored(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    params = b"-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    check((b"subject=CN = a.example.test\n" + chain + params, key))


def test_policy_can_allow_p521(ca: CA) -> None:
    assert "P-521" not in POLICY.allowed_curves
    leaf_key = make_odd_key("p521")
    cert = issue_odd(ca, "a.example.test", key=leaf_key)
    combined = cert_pem(cert) + ca.chain_pem + any_key_pem(leaf_key)
    bundle = validated(
        combined, None, now=now(), policy=UploadPolicy(allowed_curves=("P-256", "P-384", "P-521"))
    )
    assert bundle.key_type == "ECDSA-P521"


# --- every error code has a real case -------------------------------------------------------


def _too_large(ca: CA) -> Upload:
    chain, key = issue(ca, "a.example.test")
    return chain + b"# padding\n" * (POLICY.max_bytes // 10), key


def _garbage(ca: CA) -> Upload:
    return b"this is not a certificate\n", b"nor a key\n"


def _missing_key(ca: CA) -> Upload:
    return issue(ca, "a.example.test")[0], None


def _key_mismatch(ca: CA) -> Upload:
    chain, _ = issue(ca, "a.example.test")
    return chain, key_pem(make_key())


def _expired(ca: CA) -> Upload:
    return issue(
        ca,
        "a.example.test",
        not_before=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
        not_after=dt.datetime(2020, 4, 1, tzinfo=dt.UTC),
    )


def _not_yet_valid(ca: CA) -> Upload:
    start = now() + dt.timedelta(days=2)
    return issue(ca, "a.example.test", not_before=start, not_after=start + dt.timedelta(days=90))


def _odd_key(key_type: OddKeyType) -> Callable[[CA], Upload]:
    def build(ca: CA) -> Upload:
        key = make_odd_key(key_type)
        return cert_pem(issue_odd(ca, "a.example.test", key=key)) + ca.chain_pem, any_key_pem(key)

    return build


def _chain_order(ca: CA) -> Upload:
    deep = make_ca_path(2)
    chain, key = issue(deep, "a.example.test")
    leaf = split_blocks(chain)[0][1]
    return leaf + cert_chain(*reversed(deep.chain)), key


def _unrelated_chain(ca: CA) -> Upload:
    chain, key = issue(ca, "a.example.test")
    return chain + make_ca("unrelated CA").chain_pem, key


def _chain_too_long(ca: CA) -> Upload:
    return issue(make_ca_path(6), "a.example.test")


def _duplicate(ca: CA) -> Upload:
    chain, key = issue(ca, "a.example.test")
    return chain + ca.chain_pem, key


def _no_names(ca: CA) -> Upload:
    key = make_key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "No Names Ltd")])
    return cert_pem(issue_odd(ca, key=key, subject=subject)) + ca.chain_pem, key_pem(key)


def _ca_leaf(ca: CA) -> Upload:
    """An intermediate CA's certificate and key, with a DNS name, uploaded as a leaf."""
    key = make_key()
    cert = issue_odd(ca, "a.example.test", key=key, ca=True)
    return cert_pem(cert) + ca.chain_pem, key_pem(key)


def _encrypted_key(ca: CA) -> Upload:
    key = make_key()
    chain, _ = issue(ca, "a.example.test", key=key)
    return chain, key_pem(key, password=b"secret")


def _multiple_keys(ca: CA) -> Upload:
    chain, key = issue(ca, "a.example.test")
    return chain + key, key_pem(make_key())


CASES: dict[str, tuple[type[CertificateError], Callable[[CA], Upload]]] = {
    "too-large": (BundleTooLarge, _too_large),
    "bad-pem": (PemError, _garbage),
    "missing-key": (MissingKey, _missing_key),
    "key-mismatch": (KeyMismatch, _key_mismatch),
    "expired": (Expired, _expired),
    "not-yet-valid": (NotYetValid, _not_yet_valid),
    "weak-key": (WeakKey, _odd_key("rsa1024")),
    "unsupported-key": (UnsupportedKey, _odd_key("p521")),
    "chain-order": (ChainOrder, _chain_order),
    "unrelated-chain": (UnrelatedChain, _unrelated_chain),
    "chain-too-long": (ChainTooLong, _chain_too_long),
    "duplicate-certificate": (DuplicateCertificate, _duplicate),
    "no-names": (NoNames, _no_names),
    "ca-certificate": (CaLeaf, _ca_leaf),
    "encrypted-key": (EncryptedKey, _encrypted_key),
    "multiple-keys": (MultipleKeys, _multiple_keys),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_every_code_has_a_real_case(ca: CA, code: str) -> None:
    error, build = CASES[code]
    exc = refuse(error, build(ca))
    assert exc.code == code
    assert len(str(exc)) > 30  # says what is wrong and what to do


def test_cases_cover_every_code() -> None:
    assert set(CASES) == set(UPLOAD_CODES)


def test_codes_are_unique_stable_and_from_the_one_tree() -> None:
    assert len(set(UPLOAD_CODES)) == len(UPLOAD_CODES)
    assert tuple(error.code for error in UPLOAD_ERRORS) == UPLOAD_CODES
    for error in UPLOAD_ERRORS:
        assert issubclass(error, CertificateError)
        assert getattr(errors, error.__name__) is error
    assert {
        "too-large",
        "bad-pem",
        "missing-key",
        "key-mismatch",
        "expired",
        "not-yet-valid",
        "weak-key",
        "unsupported-key",
        "chain-order",
        "unrelated-chain",
        "chain-too-long",
        "no-names",
        "encrypted-key",
    } <= set(UPLOAD_CODES)


def test_specific_pem_errors_are_still_pem_errors() -> None:
    # Callers catching PemError (as parse_bundle raises for these) keep working.
    assert issubclass(EncryptedKey, PemError)
    assert issubclass(MultipleKeys, PemError)


# --- size -------------------------------------------------------------------------------------


def test_size_limit_counts_chain_and_key(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    size = len(chain) + len(key)
    check((chain, key), UploadPolicy(max_bytes=size))
    exc = refuse(BundleTooLarge, (chain, key), UploadPolicy(max_bytes=size - 1))
    assert f"{size} bytes" in str(exc)
    assert str(size - 1) in str(exc)


def test_size_is_checked_before_anything_else() -> None:
    refuse(BundleTooLarge, (b"\x00" * (POLICY.max_bytes + 1), None))
    assert POLICY.max_bytes == 256 * 1024


# --- bad PEM ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chain",
    [
        b"",
        b"\r\n\r\n",
        b"hello world\n",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n",  # never closed
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END X509 CRL-----\n",
        b"-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
    ],
    ids=["empty", "blank", "text", "unclosed", "mismatched-end", "end-only", "not-der"],
)
def test_bad_pem(ca: CA, chain: bytes) -> None:
    _, key = issue(ca, "a.example.test")
    exc = refuse(PemError, (chain, key))
    assert "upload" in str(exc)


def test_key_only_is_bad_pem(ca: CA) -> None:
    _, key = issue(ca, "a.example.test")
    exc = refuse(PemError, (key, None))
    assert "no certificate found" in str(exc)


def test_csr_instead_of_certificate(ca: CA) -> None:
    csr = b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
    _, key = issue(ca, "a.example.test")
    assert "certificate request" in str(refuse(PemError, (csr, key)))


def test_der_instead_of_pem(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    der = x509.load_pem_x509_certificate(chain).public_bytes(serialization.Encoding.DER)
    assert "DER" in str(refuse(PemError, (der, key)))


def test_pkcs7_instead_of_pem(ca: CA) -> None:
    p7 = b"-----BEGIN PKCS7-----\nAAAA\n-----END PKCS7-----\n"
    assert "pkcs7" in str(refuse(PemError, (p7, None)))


def test_corrupt_certificate_in_chain(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    blocks = [text for _, text in split_blocks(chain)]
    broken = blocks[1].replace(b"\n", b"\nAAAA", 1)
    assert "#2" in str(refuse(PemError, (blocks[0] + broken, key)))


def test_unclosed_key_block_names_only_the_label(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    truncated = key.rsplit(b"-----END", 1)[0]
    with pytest.raises(PemError) as info:
        validated(chain + truncated, None, now=now(), policy=POLICY)
    assert "PRIVATE KEY block has no END line" in str(info.value)
    assert_no_key_material(info.value, (chain + truncated, None), label_ok=True)


def test_corrupt_key_is_bad_pem_without_material(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    lines = key.splitlines(keepends=True)
    broken = lines[0] + b"AAAA" + b"".join(lines[1:])
    refuse(PemError, (chain, broken))


# --- keys -------------------------------------------------------------------------------------


def test_missing_key_with_combined_pem(ca: CA) -> None:
    chain, _ = issue(ca, "a.example.test")
    assert "private key" in str(refuse(MissingKey, (chain, None)))


def test_key_mismatch_message_says_what_to_do(ca: CA) -> None:
    exc = refuse(KeyMismatch, _key_mismatch(ca))
    assert "issued for" in str(exc)


@pytest.mark.parametrize("fmt", ["pkcs8", "traditional"])
def test_encrypted_key(ca: CA, fmt: KeyFormat) -> None:
    key = make_key()
    chain, _ = issue(ca, "a.example.test", key=key)
    encrypted = key_pem(key, fmt, password=b"hunter2")
    exc = refuse(EncryptedKey, (chain, encrypted))
    assert "hunter2" not in str(exc)
    refuse(EncryptedKey, (chain + encrypted, None))


def test_two_keys_in_combined_pem(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    exc = refuse(MultipleKeys, (chain + key + key_pem(make_key(), "traditional"), None))
    assert "2 private keys" in str(exc)


def test_rsa_1024_is_weak(ca: CA) -> None:
    exc = refuse(WeakKey, _odd_key("rsa1024")(ca))
    assert "1024 bits" in str(exc)
    assert "2048" in str(exc)


def test_min_rsa_bits_is_configurable(ca: CA) -> None:
    upload = issue(ca, "a.example.test", key=shared_key("rsa"))
    check(upload)
    refuse(WeakKey, upload, UploadPolicy(min_rsa_bits=3072))


@pytest.mark.parametrize(
    ("key_type", "named"),
    [("p521", "P-521"), ("secp256k1", "secp256k1"), ("ed25519", "Ed25519"), ("dsa", "DSA")],
)
def test_unsupported_key_types(ca: CA, key_type: OddKeyType, named: str) -> None:
    exc = refuse(UnsupportedKey, _odd_key(key_type)(ca))
    assert named in str(exc)
    assert "P-256" in str(exc)


def test_p384_can_be_disallowed(ca: CA) -> None:
    upload = issue(ca, "a.example.test", key=shared_key("ec384"))
    refuse(UnsupportedKey, upload, UploadPolicy(allowed_curves=("P-256",)))


def test_traditional_dsa_key_format_is_unsupported(ca: CA) -> None:
    key = make_odd_key("dsa")
    chain = cert_pem(issue_odd(ca, "a.example.test", key=key)) + ca.chain_pem
    traditional = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    assert "DSA" in str(refuse(UnsupportedKey, (chain, traditional)))


def test_openssh_key_format_is_unsupported(ca: CA) -> None:
    key = make_odd_key("ed25519")
    chain = cert_pem(issue_odd(ca, "a.example.test", key=key)) + ca.chain_pem
    openssh = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    assert "OpenSSH" in str(refuse(UnsupportedKey, (chain, openssh)))


# --- names ------------------------------------------------------------------------------------


def test_no_san_and_no_cn(ca: CA) -> None:
    assert "subjectAltName" in str(refuse(NoNames, _no_names(ca)))


def test_cn_only_certificate_is_accepted(ca: CA) -> None:
    bundle = validated(
        *issue(ca, common_name="cn-only.example.test", san=False), now=now(), policy=POLICY
    )
    assert bundle.names == ("cn-only.example.test",)


def test_cn_that_is_not_a_hostname(ca: CA) -> None:
    refuse(NoNames, issue(ca, common_name="My Web Server", san=False))


# --- validity window --------------------------------------------------------------------------


def test_expired_with_past_dates(ca: CA) -> None:
    exc = refuse(Expired, _expired(ca))
    assert "2020-04-01T00:00:00Z" in str(exc)
    assert "renew" in str(exc)


def test_validity_boundaries_and_grace(ca: CA) -> None:
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    end = dt.datetime(2030, 4, 1, tzinfo=dt.UTC)
    upload = issue(ca, "a.example.test", not_before=start, not_after=end)
    second = dt.timedelta(seconds=1)

    check(upload, at=start)
    check(upload, at=end)
    refuse(NotYetValid, upload, at=start - second)
    refuse(Expired, upload, at=end + second)

    hour = dt.timedelta(hours=1)
    lenient = UploadPolicy(not_before_grace=hour, expiry_grace=hour)
    check(upload, lenient, at=start - hour)
    check(upload, lenient, at=end + hour)
    refuse(NotYetValid, upload, lenient, at=start - hour - second)
    refuse(Expired, upload, lenient, at=end + hour + second)


def test_now_in_another_timezone(ca: CA) -> None:
    upload = _expired(ca)
    plus_five = dt.timezone(dt.timedelta(hours=5))
    check(upload, at=dt.datetime(2020, 4, 1, 5, 0, tzinfo=plus_five))
    refuse(Expired, upload, at=dt.datetime(2020, 4, 1, 5, 0, 1, tzinfo=plus_five))


def test_not_yet_valid(ca: CA) -> None:
    exc = refuse(NotYetValid, _not_yet_valid(ca))
    assert "valid only from" in str(exc)


def test_naive_now_is_a_programming_error(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    with pytest.raises(ValueError, match="timezone-aware"):
        validated(chain, key, now=dt.datetime(2030, 1, 1), policy=POLICY)


def test_only_the_leaf_dates_are_checked(ca: CA) -> None:
    # The test CA certificates expire after ten years; a chain may carry an expired
    # (cross-signed) CA certificate for old clients, so only the leaf's dates count.
    years = dt.timedelta(days=365)
    upload = issue(ca, "a.example.test", not_after=now() + 20 * years)
    later = now() + 15 * years
    assert ca.cert.not_valid_after_utc < later
    check((upload[0] + ca.root_pem, upload[1]), at=later)


# --- chain ------------------------------------------------------------------------------------


def test_chain_out_of_order(deep_ca: CA) -> None:
    chain, key = issue(deep_ca, "a.example.test")
    leaf, inter2, inter1 = (text for _, text in split_blocks(chain))
    check((leaf + inter2 + inter1, key))
    exc = refuse(ChainOrder, (leaf + inter1 + inter2, key))
    assert "#3" in str(exc)
    assert "#1, #3, #2" in str(exc)


def test_root_in_the_middle_is_out_of_order(deep_ca: CA) -> None:
    chain, key = issue(deep_ca, "a.example.test")
    leaf, inter2, inter1 = (text for _, text in split_blocks(chain))
    exc = refuse(ChainOrder, (leaf + inter2 + deep_ca.root_pem + inter1, key))
    assert "#1, #2, #4, #3" in str(exc)


def test_leaf_not_first_is_out_of_order(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    leaf, inter = (text for _, text in split_blocks(chain))
    exc = refuse(ChainOrder, (inter + leaf, key))
    assert "leaf" in str(exc)
    assert "#2, #1" in str(exc)
    refuse(ChainOrder, (inter + leaf + key, None))


def test_intermediate_from_another_ca(ca: CA, other_ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    leaf = split_blocks(chain)[0][1]
    exc = refuse(UnrelatedChain, (leaf + other_ca.chain_pem, key))
    assert "#2" in str(exc)
    assert "unrelated CA intermediate" in str(exc)


def test_extra_unrelated_certificate_after_a_good_chain(ca: CA, other_ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    exc = refuse(UnrelatedChain, (chain + ca.root_pem + other_ca.root_pem, key))
    assert "#4" in str(exc)
    assert "#3" not in str(exc)


def test_unrelated_and_misordered_is_unrelated(deep_ca: CA, other_ca: CA) -> None:
    chain, key = issue(deep_ca, "a.example.test")
    leaf, inter2, inter1 = (text for _, text in split_blocks(chain))
    refuse(UnrelatedChain, (leaf + inter1 + inter2 + other_ca.chain_pem, key))


def test_same_names_but_wrong_signature_is_unrelated(ca: CA) -> None:
    # An impostor intermediate: same subject as the real one, different key.
    impostor = make_ca("certagent test CA")
    assert impostor.cert.subject == ca.cert.subject
    chain, key = issue(ca, "a.example.test")
    leaf = split_blocks(chain)[0][1]
    exc = refuse(UnrelatedChain, (leaf + impostor.chain_pem, key))
    assert "#2" in str(exc)


def test_duplicate_certificate(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    exc = refuse(DuplicateCertificate, (chain + ca.chain_pem, key))
    assert "#3" in str(exc)
    assert "#2" in str(exc)


def test_duplicate_self_signed_root_is_refused(ca: CA) -> None:
    chain, key = issue(ca, "a.example.test")
    refuse(DuplicateCertificate, (chain + ca.root_pem + ca.root_pem, key))


def test_seven_certificates_are_too_many() -> None:
    chain, key = issue(make_ca_path(6), "a.example.test")
    assert len(split_blocks(chain)) == 7
    exc = refuse(ChainTooLong, (chain, key))
    assert "7 certificates" in str(exc)
    assert "at most 6" in str(exc)
    check((chain, key), UploadPolicy(max_chain=7))


# --- precedence -------------------------------------------------------------------------------


def test_structure_errors_come_before_parsing(ca: CA) -> None:
    # Too many certificates is reported before the missing key.
    chain, _ = issue(make_ca_path(6), "a.example.test")
    refuse(ChainTooLong, (chain, None))


def test_key_policy_comes_before_dates(ca: CA) -> None:
    key = make_odd_key("rsa1024")
    cert = issue_odd(ca, "a.example.test", key=key)
    refuse(
        WeakKey,
        (cert_pem(cert), any_key_pem(key)),
        at=cert.not_valid_after_utc + dt.timedelta(days=1),
    )


# --- policy -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"max_bytes": 0},
        {"max_chain": 0},
        {"not_before_grace": dt.timedelta(seconds=-1)},
        {"expiry_grace": dt.timedelta(seconds=-1)},
        {"min_rsa_bits": 512},
        {"allowed_curves": ("P-256", "secp256k1")},
    ],
)
def test_bad_policy_is_a_config_error(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        dataclasses.replace(POLICY, **changes)  # type: ignore[arg-type]


def test_policy_defaults_and_frozen() -> None:
    assert POLICY.max_bytes == 262144
    assert POLICY.max_chain == 6
    assert POLICY.not_before_grace == POLICY.expiry_grace == dt.timedelta(0)
    assert POLICY.min_rsa_bits == 2048
    assert POLICY.allowed_curves == ("P-256", "P-384")
    with pytest.raises(dataclasses.FrozenInstanceError):
        POLICY.max_chain = 10  # type: ignore[misc]


def test_self_issued_loop_does_not_explode(ca: CA) -> None:
    # Self-issued certificates of one key and subject all "issue" each other: without a
    # search budget, ten of them plus a stray certificate cost 10! chain orderings.
    loop_key = make_key()
    loop = CA(root=ca.root, cert=ca.cert, key=loop_key, chain=())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loop CA")])
    selfies = []
    for _ in range(10):
        cert = issue_odd(loop, key=loop_key, subject=subject)
        selfies.append(cert.public_bytes(serialization.Encoding.PEM))
        loop = CA(root=cert, cert=cert, key=loop_key, chain=())
    leaf_key = make_key()
    leaf = issue_odd(loop, "a.example.test", key=leaf_key)
    upload = (cert_pem(leaf) + b"".join(selfies) + ca.root_pem, key_pem(leaf_key))
    exc = refuse(UnrelatedChain, upload, UploadPolicy(max_chain=12))
    assert "#12" in str(exc)


# --- the signing RSA key check (bulk import) -----------------------------------------------


@pytest.mark.parametrize("code", sorted(CASES))
def test_signing_rsa_check_refuses_every_case_alike(ca: CA, code: str) -> None:
    error, build = CASES[code]
    upload = build(ca)
    with pytest.raises(CertificateError) as info:
        validated(upload[0], upload[1], now=now(), policy=POLICY, rsa_key_check="sign")
    assert type(info.value) is error
    assert_no_key_material(info.value, upload)


@pytest.mark.parametrize("key_type", ["ec", "ec384", "rsa", "rsa3072"])
def test_signing_rsa_check_gives_the_same_bundle(ca: CA, key_type: KeyType) -> None:
    chain, key = issue(ca, "a.example.test", key=shared_key(key_type))
    full = validated(chain, key, now=now(), policy=POLICY)
    signed = validated(chain, key, now=now(), policy=POLICY, rsa_key_check="sign")
    assert signed == full
    assert signed.pem == full.pem


def _broken_rsa_key() -> bytes:
    """An RSA key whose public part is intact but whose private exponents are wrong."""
    good = shared_key("rsa")
    assert isinstance(good, rsa.RSAPrivateKey)
    numbers = good.private_numbers()
    broken = rsa.RSAPrivateNumbers(
        p=numbers.p,
        q=numbers.q,
        d=numbers.d + 2,
        dmp1=numbers.dmp1 + 2,
        dmq1=numbers.dmq1 + 2,
        iqmp=numbers.iqmp,
        public_numbers=numbers.public_numbers,
    ).private_key(unsafe_skip_rsa_key_validation=True)
    return broken.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.mark.parametrize("check_kind", ["openssl", "sign"])
def test_rsa_key_that_cannot_sign_is_refused(ca: CA, check_kind: str) -> None:
    chain, _ = issue(ca, "a.example.test", key=shared_key("rsa"))
    upload = (chain, _broken_rsa_key())
    with pytest.raises(PemError) as info:
        validated(
            *upload,
            now=now(),
            policy=POLICY,
            rsa_key_check="sign" if check_kind == "sign" else "openssl",
        )
    assert info.value.code == "bad-pem"
    assert "cannot be parsed" in str(info.value)
    if check_kind == "sign":
        assert "does not sign for its certificate" in str(info.value)
    assert_no_key_material(info.value, upload)
