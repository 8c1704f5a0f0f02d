"""The import's worker side: reading, validating and encoding a batch of files."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from certagent.certs.bulkcheck import UploadChecker
from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.cli import _import_work
from certagent.cli._import_work import (
    MAX_FILE,
    BatchJob,
    ImportItem,
    batch_files,
    open_ahead,
    prepare_batch,
    read_file,
)
from certagent.errors import CertificateError, ConfigError, Expired, PemError
from certagent.store.base import PreparedRecord, WireRecord
from certagent.store.redis import AddCall, Keys, RecordEncoder
from certagent.store.redis._addscript import ADD_SHA, script_args, script_keys
from certagent.store.redis._packed import unpack
from certagent.testing.certs import (
    CA,
    KeyFormat,
    KeyType,
    combined,
    issue,
    make_ca,
    shared_key,
)

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.mark.parametrize("size", [0, 1, 2400, MAX_FILE])
def test_read_file_reads_the_whole_file(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f.pem"
    path.write_bytes(b"x" * size)
    assert read_file(path) == b"x" * size


def test_read_file_refuses_more_than_max_file(tmp_path: Path) -> None:
    path = tmp_path / "big.pem"
    path.write_bytes(b"x" * (MAX_FILE + 1))
    with pytest.raises(CertificateError, match="over"):
        read_file(path)


def test_read_file_of_a_file_without_a_size(tmp_path: Path) -> None:
    assert b"Name:" in read_file(Path("/proc/self/status"))
    with pytest.raises(ConfigError, match="cannot read"):
        read_file(tmp_path / "missing.pem")


def test_prepare_batch_gives_a_record_or_the_error_for_each_file(ca: CA, tmp_path: Path) -> None:
    ring = KeyRing.from_text(generate_key_line("k1"))
    good = tmp_path / "good.pem"
    good.write_bytes(combined(*issue(ca, "good.example.test", key=shared_key())))
    bad = tmp_path / "bad.pem"
    bad.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    old = tmp_path / "old.pem"
    past = NOW - dt.timedelta(days=400)
    chain, key = issue(
        ca, "old.example.test", key=shared_key(), not_before=past,
        not_after=past + dt.timedelta(days=90),
    )  # fmt: skip
    old.write_bytes(combined(chain, key))
    lineage = tmp_path / "live" / "l.example.test"
    lineage.mkdir(parents=True)
    chain, key = issue(ca, "l.example.test", key=shared_key())
    (lineage / "fullchain.pem").write_bytes(chain)
    (lineage / "privkey.pem").write_bytes(key)
    keyless = tmp_path / "live" / "k.example.test"  # the key inside fullchain.pem
    keyless.mkdir()
    (keyless / "fullchain.pem").write_bytes(combined(*issue(ca, "k.example.test")))
    (tmp_path / "dir.pem").mkdir()  # opens, but cannot be read
    items = (
        ImportItem("good.pem", good, None),
        ImportItem("bad.pem", bad, None),
        ImportItem("old.pem", old, None),
        ImportItem("missing.pem", tmp_path / "missing.pem", None),
        ImportItem("l", lineage / "fullchain.pem", lineage / "privkey.pem"),
        ImportItem("k", keyless / "fullchain.pem", keyless / "privkey.pem"),
        ImportItem("dir.pem", tmp_path / "dir.pem", None),
    )
    job = BatchJob(batch_files(items), UploadPolicy(), RecordEncoder(ring), NOW, NOW)
    descriptors = len(list(Path("/proc/self/fd").iterdir()))
    out = prepare_batch(job)
    assert len(list(Path("/proc/self/fd").iterdir())) == descriptors  # every file closed
    first, second, third, fourth, fifth, sixth, seventh = out
    assert isinstance(sixth, PreparedRecord)
    assert sixth.record.names == ("k.example.test",)
    assert isinstance(seventh, ConfigError)
    assert "dir.pem" in str(seventh)
    assert isinstance(first, PreparedRecord)
    assert first.record.names == ("good.example.test",)
    assert first.record.updated_at == NOW
    key = unpack(first.payload).key_pem(ring, first.record.id)
    assert key == key_part(good.read_bytes())
    assert b"PRIVATE KEY" not in first.payload
    assert isinstance(second, PemError)
    assert isinstance(third, Expired)
    assert isinstance(fourth, ConfigError)
    assert isinstance(fifth, PreparedRecord)
    assert "payload" not in repr(first)


def test_a_batch_larger_than_the_read_ahead_is_read_whole(
    ca: CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_import_work, "AHEAD", 4)  # two combined files' worth, twice over
    items = []
    for i in range(5):
        path = tmp_path / f"h{i}.pem"
        path.write_bytes(combined(*issue(ca, f"h{i}.example.test", key=shared_key())))
        items.append(ImportItem(path.name, path, None))
    files = batch_files(tuple(items))
    opened = open_ahead(files)
    try:
        assert [fd is not None for fd, _ in opened] == [True, True, False, False, False]
    finally:
        for fd, _ in opened:
            if fd is not None:
                os.close(fd)
    ring = KeyRing.from_text(generate_key_line("k1"))
    job = BatchJob(files, UploadPolicy(), RecordEncoder(ring), NOW, NOW)
    descriptors = len(list(Path("/proc/self/fd").iterdir()))
    out = prepare_batch(job)
    assert len(list(Path("/proc/self/fd").iterdir())) == descriptors
    assert [r.record.names for r in out if isinstance(r, PreparedRecord)] == [
        (f"h{i}.example.test",) for i in range(5)
    ]


def key_part(pem: bytes) -> bytes:
    return pem[pem.index(b"-----BEGIN PRIVATE KEY") :]


def test_packed_records_are_the_calls_redis_py_would_send(tmp_path: Path) -> None:
    ring = KeyRing.from_text(generate_key_line("k1"))
    ca = make_ca("import work CA")
    path = tmp_path / "good.pem"
    path.write_bytes(combined(*issue(ca, "good.example.test", "alias.example.test")))
    items = (ImportItem("good.pem", path, None), ImportItem("gone", tmp_path / "gone.pem", None))
    call = AddCall(Keys("p:"), 1234)
    packed = prepare_batch(
        BatchJob(batch_files(items), UploadPolicy(), RecordEncoder(ring, call), NOW, NOW)
    )
    first, second = packed
    assert isinstance(first, WireRecord)
    assert isinstance(second, ConfigError)
    # the same record prepared (same id, same nonce) gives the same call through redis-py's lists
    plain = RecordEncoder(ring)
    monkey = pytest.MonkeyPatch()
    bundle = UploadChecker(UploadPolicy()).validate(path.read_bytes(), None, now=NOW)
    monkey.setattr("secrets.token_hex", lambda n: first.id)
    monkey.setattr("os.urandom", lambda n: b"\0" * n)
    try:
        again = RecordEncoder(ring, call).encode(bundle, NOW)
        prepared = plain.prepare(bundle, NOW)
    finally:
        monkey.undo()
    assert isinstance(again, WireRecord)
    keys = script_keys(Keys("p:"), prepared)
    args = script_args(prepared, 1234)
    expected = ["EVALSHA", ADD_SHA, str(len(keys)), *keys, *args]
    assert _resp_args(again.command) == [a.encode() if isinstance(a, str) else a for a in expected]
    assert first.fingerprint_sha256 == prepared.record.fingerprint_sha256
    assert "command" not in repr(first)


def _resp_args(raw: bytes) -> list[bytes]:
    """The arguments of one RESP array of bulk strings."""
    assert raw.startswith(b"*")
    head, _, rest = raw.partition(b"\r\n")
    out = []
    for _ in range(int(head[1:])):
        size, _, rest = rest.partition(b"\r\n")
        assert size.startswith(b"$")
        n = int(size[1:])
        out.append(rest[:n])
        rest = rest[n + 2 :]
    assert rest == b""
    return out


@pytest.mark.parametrize(
    ("key_type", "key_format", "intermediate", "serial", "names"),
    [
        ("ec", "pkcs8", True, None, ("a.example.test",)),
        ("ec", "traditional", False, 1, ("a.example.test", "*.b.example.test", "c.example.test")),
        ("ec384", "pkcs8", True, 0x7F, ("a.example.test",)),
        ("rsa", "traditional", True, (1 << 159) - 1, ("a.example.test", "A.example.test")),
    ],
)
def test_one_pass_packing_gives_the_bytes_of_record_then_call(
    key_type: KeyType,
    key_format: KeyFormat,
    intermediate: bool,
    serial: int | None,
    names: tuple[str, ...],
) -> None:
    """``encode`` (WirePacker: one pass) == ``prepare`` then ``AddCall.command``, byte for byte.

    With and without a shared chain, every key label, serials of 1 to 20 bytes,
    names repeated, and bundles from the fast path (DER at hand) or
    ``validate_upload`` (none).
    """
    ring = KeyRing.from_text(generate_key_line("k1"))
    ca = make_ca("one pass CA", intermediate=intermediate)
    chain, key = issue(ca, *names, key_type=key_type, key_format=key_format, serial=serial)
    fast = UploadChecker(UploadPolicy()).validate(chain, key, now=NOW)
    slow = validate_upload(chain, key, now=NOW, policy=UploadPolicy())
    assert fast.ders is not None
    assert slow.ders is None
    call = AddCall(Keys("p:"), 77)
    encoder = RecordEncoder(ring, call)
    for bundle in (fast, slow, fast):  # the packer's caches in use the second time
        monkey = pytest.MonkeyPatch()
        monkey.setattr("secrets.token_hex", lambda n: "0123456789abcdef")
        monkey.setattr("os.urandom", lambda n: b"\7" * n)
        try:
            wire = encoder.encode(bundle, NOW)
            prepared = encoder.prepare(bundle, NOW)
        finally:
            monkey.undo()
        assert isinstance(wire, WireRecord)
        record = prepared.record
        assert wire.command == call.command(
            record, prepared.payload, prepared.expiry, prepared.shared
        )
        assert (wire.id, wire.fingerprint_sha256) == (record.id, record.fingerprint_sha256)
