from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest.mock import ANY

import pytest

from certagent.certs.pem import CertBundle, parse_bundle
from certagent.config import Settings
from certagent.errors import (
    CertificateError,
    ChangesLost,
    ConfigError,
    DuplicateCertificate,
    InvalidCursor,
    InvalidHostname,
    NotFound,
    ReadOnlyRecord,
    StoreUnavailable,
)
from certagent.service import daemon
from certagent.store import DirectoryStore, RedisStore, open_store
from certagent.store.base import Change, Store
from certagent.store.directory import MAX_FILE_SIZE, _files, _inotify, name_of_stem
from certagent.store.directory import _scan as _dirscan
from certagent.store.directory import _watch as _dirwatch
from certagent.store.directory._index import ChangeLog
from certagent.store.directory._scan import remote_filesystem
from certagent.store.directory._threads import DaemonExecutor
from certagent.store.url import redact_url
from certagent.testing import certbot
from certagent.testing.certs import CA, KeyType, issue, issue_cert, make_ca, shared_key


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "certs"
    path.mkdir()
    return path


@pytest.fixture
def store(root: Path) -> DirectoryStore:
    return DirectoryStore(root)


def pem_for(ca: CA, *names: str) -> bytes:
    """A combined PEM (chain + key) for ``names``."""
    chain, key = issue(ca, *names, key=shared_key())
    return chain + key


def write_combined(root: Path, filename: str, ca: CA, *names: str) -> CertBundle:
    data = pem_for(ca, *names)
    (root / filename).write_bytes(data)
    return parse_bundle(data)


def write_certbot(root: Path, dirname: str, ca: CA, *names: str) -> CertBundle:
    chain, key = issue(ca, *names, key=shared_key())
    live = root / "live" / dirname
    live.mkdir(parents=True)
    (live / "fullchain.pem").write_bytes(chain)
    (live / "privkey.pem").write_bytes(key)
    return parse_bundle(chain, key)


def test_directory_store_is_a_store(store: DirectoryStore) -> None:
    typed: Store = store
    assert typed.describe().startswith("file:///")


# --- lookup order --------------------------------------------------------------------------


async def test_exact_combined_file(store: DirectoryStore, root: Path, ca: CA) -> None:
    bundle = write_combined(root, "a.example.test.pem", ca, "a.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == "a.example.test.pem"
    assert found.bundle == bundle


async def test_missing_name(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_combined(root, "a.example.test.pem", ca, "a.example.test")
    assert await store.lookup("b.example.test") is None


async def test_certbot_layout(store: DirectoryStore, root: Path, ca: CA) -> None:
    bundle = write_certbot(root, "a.example.test", ca, "a.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == "live/a.example.test/fullchain.pem"
    assert found.bundle == bundle
    assert found.bundle.pem.count(b"BEGIN CERTIFICATE") == 2


async def test_certbot_without_privkey_is_ignored(
    store: DirectoryStore, root: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    write_certbot(root, "a.example.test", ca, "a.example.test")
    (root / "live" / "a.example.test" / "privkey.pem").unlink()
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "no private key" in caplog.text


async def test_combined_file_beats_certbot(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_certbot(root, "a.example.test", ca, "a.example.test")
    combined = write_combined(root, "a.example.test.pem", ca, "a.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == combined


async def test_exact_beats_wildcard(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_combined(root, "_wildcard.example.test.pem", ca, "*.example.test")
    exact = write_certbot(root, "a.example.test", ca, "a.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == exact


@pytest.mark.parametrize(
    "spelling",
    ["_wildcard.example.test.pem", "*.example.test.pem"],
)
async def test_wildcard_combined(
    store: DirectoryStore, root: Path, ca: CA, spelling: str
) -> None:
    bundle = write_combined(root, spelling, ca, "*.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == spelling
    assert found.bundle == bundle
    assert await store.lookup("example.test") is None
    assert await store.lookup("x.a.example.test") is None
    assert await store.lookup("a.other.test") is None


@pytest.mark.parametrize("dirname", ["_wildcard.example.test", "*.example.test"])
async def test_wildcard_certbot(store: DirectoryStore, root: Path, ca: CA, dirname: str) -> None:
    bundle = write_certbot(root, dirname, ca, "*.example.test", "example.test")
    found = await store.lookup("b.example.test")
    assert found is not None
    assert found.id == f"live/{dirname}/fullchain.pem"
    assert found.bundle == bundle
    assert await store.lookup("x.b.example.test") is None


async def test_wildcard_spelling_order(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_certbot(root, "*.example.test", ca, "*.example.test")
    write_certbot(root, "_wildcard.example.test", ca, "*.example.test")
    order = ["live/_wildcard.example.test/fullchain.pem", "live/*.example.test/fullchain.pem"]
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == order[0]

    write_combined(root, "*.example.test.pem", ca, "*.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == "*.example.test.pem"

    write_combined(root, "_wildcard.example.test.pem", ca, "*.example.test")
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == "_wildcard.example.test.pem"


async def test_apex_file_is_not_a_wildcard(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_combined(root, "example.test.pem", ca, "example.test", "*.example.test")
    assert await store.lookup("a.example.test") is None
    found = await store.lookup("example.test")
    assert found is not None


async def test_lookup_is_case_insensitive(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_combined(root, "a.example.test.pem", ca, "a.example.test")
    found = await store.lookup("A.Example.TEST")
    assert found is not None
    assert found.id == "a.example.test.pem"


# --- records that must not be served -----------------------------------------------------------


async def test_file_not_covering_the_name_is_ignored(
    store: DirectoryStore, root: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    write_combined(root, "a.example.test.pem", ca, "other.example.test")
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "a.example.test.pem" in caplog.text
    assert "covers only other.example.test" in caplog.text
    assert "PRIVATE KEY" not in caplog.text


async def test_wildcard_file_with_wrong_cert_is_ignored(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    # A file named for the wildcard whose certificate only has the apex name.
    write_combined(root, "_wildcard.example.test.pem", ca, "example.test")
    assert await store.lookup("a.example.test") is None


async def test_first_existing_candidate_decides(store: DirectoryStore, root: Path, ca: CA) -> None:
    # A broken exact file is not silently replaced by the wildcard.
    (root / "a.example.test.pem").write_bytes(b"garbage\n")
    write_combined(root, "_wildcard.example.test.pem", ca, "*.example.test")
    assert await store.lookup("a.example.test") is None
    assert await store.lookup("b.example.test") is not None


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage\n",
        b"-----BEGIN CERTIFICATE-----\nAAAA\n",
    ],
)
async def test_corrupt_file_is_ignored_without_key_material(
    store: DirectoryStore, root: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    (root / "a.example.test.pem").write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "a.example.test.pem" in caplog.text
    assert "not a valid bundle" in caplog.text


async def test_key_mismatch_is_ignored_and_key_not_logged(
    store: DirectoryStore, root: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    chain, _ = issue(ca, "a.example.test", key=shared_key())
    _, other_key = issue(ca, "a.example.test")
    (root / "a.example.test.pem").write_bytes(chain + other_key)
    with caplog.at_level(logging.DEBUG):
        assert await store.lookup("a.example.test") is None
    assert "does not belong" in caplog.text
    assert "PRIVATE KEY" not in caplog.text
    body = other_key.splitlines()[1].decode()
    assert body not in caplog.text


async def test_oversized_file_is_ignored(
    store: DirectoryStore, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "a.example.test.pem").write_bytes(b"x" * (MAX_FILE_SIZE + 1))
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None
    assert "bytes" in caplog.text


# --- hostile names ---------------------------------------------------------------------------


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every path the store reads from now on (all reads go through ``read_regular``)."""
    opened: list[Path] = []
    original = _files.read_regular

    def spy(path: Path, label: str, limit: int = MAX_FILE_SIZE) -> tuple[bytes, float]:
        opened.append(path)
        return original(path, label, limit)

    monkeypatch.setattr(_files, "read_regular", spy)
    return opened


@pytest.mark.parametrize(
    "name",
    [
        "../secret.example.test",
        "..",
        "a.example.test/../../secret.example.test",
        "/etc/passwd",
        "live/../secret.example.test",
        "*.example.test",
        "_wildcard.example.test",
        "secret.example.test\x00",
        "a.example.test\n",
        "",
    ],
)
async def test_hostile_names_never_reach_the_filesystem(
    tmp_path: Path, root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Something worth stealing just outside the root, and a wildcard inside it.
    write_combined(tmp_path, "secret.example.test.pem", ca, "secret.example.test")
    write_combined(root, "_wildcard.example.test.pem", ca, "*.example.test")
    opened = spy_reads(monkeypatch)
    store = DirectoryStore(root)
    with pytest.raises(InvalidHostname):
        await store.lookup(name)
    assert opened == []


async def test_paths_stay_under_root(
    root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = spy_reads(monkeypatch)
    assert await DirectoryStore(root).lookup("x.a.example.test") is None
    assert [path.relative_to(root).as_posix() for path in opened] == [
        "x.a.example.test.pem",
        "live/x.a.example.test/fullchain.pem",
        "_wildcard.a.example.test.pem",
        "*.a.example.test.pem",
        "live/_wildcard.a.example.test/fullchain.pem",
        "live/*.a.example.test/fullchain.pem",
    ]
    for path in opened:
        assert path.resolve().is_relative_to(root.resolve())
        assert ".." not in path.parts


# --- availability ---------------------------------------------------------------------------


async def test_ping(store: DirectoryStore) -> None:
    await store.ping()


async def test_missing_root_is_unavailable(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "nope")
    with pytest.raises(StoreUnavailable):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.lookup("a.example.test")


async def test_root_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    store = DirectoryStore(path)
    with pytest.raises(StoreUnavailable):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.lookup("a.example.test")


async def test_unreadable_candidate_is_unavailable(
    store: DirectoryStore, root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_combined(root, "a.example.test.pem", ca, "a.example.test")

    def denied(path: Path, label: str, limit: int = MAX_FILE_SIZE) -> tuple[bytes, float]:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_files, "read_regular", denied)
    with pytest.raises(StoreUnavailable, match=r"cannot read a\.example\.test\.pem.*denied"):
        await store.lookup("a.example.test")


@pytest.mark.parametrize("kind", ["directory", "fifo", "socket"])
async def test_only_regular_files_are_read(
    store: DirectoryStore,
    root: Path,
    ca: CA,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    path = root / "a.example.test.pem"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    write_combined(root, "b.example.test.pem", ca, "b.example.test")
    opened: list[str] = []
    original = os.open

    def spy_open(name: str, *args: int, **kwargs: int) -> int:
        opened.append(os.fspath(name))
        return original(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_open)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert await store.lookup("a.example.test") is None  # the file decides: no wildcard
    assert time.monotonic() - started < 1
    assert f"a.example.test.pem is a {'FIFO' if kind == 'fifo' else kind}" in caplog.text
    assert "only regular files are read" in caplog.text
    assert str(path) not in opened  # refused after stat, never opened
    found = await store.lookup("b.example.test")
    assert found is not None  # the store still answers other names


# --- put ---------------------------------------------------------------------------------------


async def test_put_writes_first_name_atomically(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    bundle = parse_bundle(pem_for(ca, "a.example.test"))
    record_id = await store.put(bundle)
    assert record_id == "a.example.test.pem"
    path = root / record_id
    assert path.read_bytes() == bundle.pem
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in root.iterdir()) == ["a.example.test.pem"]  # no temp files left
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.id == record_id
    assert found.bundle == bundle


async def test_put_wildcard_and_every_name(store: DirectoryStore, root: Path, ca: CA) -> None:
    bundle = parse_bundle(pem_for(ca, "*.example.test", "example.test"))
    assert await store.put(bundle) == "_wildcard.example.test.pem"
    assert sorted(p.name for p in root.iterdir()) == [
        "_wildcard.example.test.pem",
        "example.test.pem",
    ]
    for name in ("a.example.test", "example.test"):
        found = await store.lookup(name)
        assert found is not None
        assert found.bundle == bundle


async def test_put_replaces(store: DirectoryStore, root: Path, ca: CA) -> None:
    old = write_combined(root, "a.example.test.pem", ca, "a.example.test")
    new = parse_bundle(pem_for(ca, "a.example.test"))
    assert new != old
    await store.put(new)
    found = await store.lookup("a.example.test")
    assert found is not None
    assert found.bundle == new


async def test_put_into_missing_root_is_unavailable(tmp_path: Path, ca: CA) -> None:
    store = DirectoryStore(tmp_path / "nope")
    with pytest.raises(StoreUnavailable):
        await store.put(parse_bundle(pem_for(ca, "a.example.test")))


# --- open_store ----------------------------------------------------------------------------


def test_open_store_directory(tmp_path: Path) -> None:
    for url in (str(tmp_path), tmp_path.as_uri(), f"file://localhost{tmp_path}"):
        store = open_store(url)
        assert isinstance(store, DirectoryStore)
        assert store.root == tmp_path


def test_open_store_file_url_is_unquoted(tmp_path: Path) -> None:
    store = open_store("file:///var/lib/cert%20agent")
    assert isinstance(store, DirectoryStore)
    assert store.root == Path("/var/lib/cert agent")


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6399/0",
        "rediss://user:pw@redis.example.test:6380/1",
        "unix:///run/redis/redis.sock?db=2",
        "REDIS://127.0.0.1:6399",
    ],
)
async def test_open_store_redis(url: str) -> None:
    store = open_store(url, redis_prefix="x:")
    assert isinstance(store, RedisStore)
    assert store.keys.prefix == "x:"
    assert "pw" not in store.describe()
    await store.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("http://example.test/certs", "unsupported store URL scheme 'http'"),
        ("file://relative/path", "absolute path"),
        ("file:///x?y=1", "no '?'"),
        ("localhost:6379", "redis://localhost:6379"),
        ("redis://:secret@host:notaport/0", "invalid Redis URL"),
    ],
)
def test_open_store_rejects(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        open_store(url)
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:secret@host/0", "redis://user:***@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///run/r.sock?db=1", "unix:///run/r.sock?db=1"),
        ("rediss://u@host/0#x", "rediss://u@host/0#x"),
        ("unix:///run/r.sock?db=1&password=secret", "unix:///run/r.sock?db=1&password=***"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


# --- add, replace, delete, get, list -------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


async def test_add_writes_one_file_and_aliases(store: DirectoryStore, root: Path, ca: CA) -> None:
    bundle = parse_bundle(pem_for(ca, "*.example.test", "example.test", "www.other.test"))
    record = await store.add(bundle)
    assert record.id == "_wildcard.example.test.pem"
    assert record.names == bundle.names
    assert record.version == 1
    assert record.fingerprint_sha256 == bundle.fingerprint_sha256
    path = root / record.id
    assert path.read_bytes() == bundle.pem
    assert mode(path) == 0o600
    assert sorted(p.name for p in root.iterdir()) == [
        "_wildcard.example.test.pem",
        "example.test.pem",
        "www.other.test.pem",
    ]  # no temporary files left
    for alias in ("example.test.pem", "www.other.test.pem"):
        assert os.readlink(root / alias) == record.id
    for host in ("a.example.test", "example.test", "www.other.test"):
        found = await store.lookup(host)
        assert found is not None
        assert found.id == record.id  # an alias reports the record it points to
        assert found.bundle == bundle
    assert await store.lookup_all("a.example.test") == (await store.lookup("a.example.test"),)
    assert await store.lookup_all("nothing.other.test") == ()
    assert await store.get(record.id) == record
    assert await store.get("example.test.pem") is None  # an alias is not a record


async def test_add_refuses_an_existing_name(store: DirectoryStore, root: Path, ca: CA) -> None:
    write_certbot(root, "a.example.test", ca, "a.example.test")
    with pytest.raises(DuplicateCertificate, match=r"live/a\.example\.test"):
        await store.add(parse_bundle(pem_for(ca, "a.example.test")))
    record = await store.add(parse_bundle(pem_for(ca, "b.example.test")))
    with pytest.raises(DuplicateCertificate, match=record.id):
        await store.add(parse_bundle(pem_for(ca, "b.example.test")))
    assert sorted(p.name for p in root.iterdir()) == ["b.example.test.pem", "live"]


async def test_add_does_not_alias_over_existing_files(
    store: DirectoryStore, root: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    mine = write_combined(root, "b.example.test.pem", ca, "b.example.test")
    with caplog.at_level(logging.WARNING):
        record = await store.add(parse_bundle(pem_for(ca, "a.example.test", "b.example.test")))
    assert "b.example.test is not linked" in caplog.text
    assert not (root / "b.example.test.pem").is_symlink()
    found = await store.lookup("b.example.test")
    assert found is not None
    assert found.bundle == mine
    assert record.names == ("a.example.test", "b.example.test")


async def test_add_into_missing_root_is_unavailable(tmp_path: Path, ca: CA) -> None:
    store = DirectoryStore(tmp_path / "nope")
    with pytest.raises(StoreUnavailable):
        await store.add(parse_bundle(pem_for(ca, "a.example.test")))


async def test_replace_rewrites_the_file_and_its_aliases(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    record = await store.add(parse_bundle(pem_for(ca, "a.example.test", "b.example.test")))
    new = parse_bundle(pem_for(ca, "a.example.test", "c.example.test"))
    replaced = await store.replace(record.id, new)
    assert replaced.id == record.id
    assert replaced.fingerprint_sha256 == new.fingerprint_sha256
    assert (root / record.id).read_bytes() == new.pem
    assert mode(root / record.id) == 0o600
    assert sorted(p.name for p in root.iterdir()) == ["a.example.test.pem", "c.example.test.pem"]
    assert await store.lookup("b.example.test") is None
    for host in ("a.example.test", "c.example.test"):
        found = await store.lookup(host)
        assert found is not None
        assert found.bundle == new


async def test_replace_refusals(store: DirectoryStore, root: Path, ca: CA) -> None:
    record = await store.add(parse_bundle(pem_for(ca, "a.example.test", "b.example.test")))
    write_certbot(root, "c.example.test", ca, "c.example.test")
    outside = root.parent / "elsewhere.pem"
    outside.write_bytes(pem_for(ca, "d.example.test"))
    (root / "d.example.test.pem").symlink_to(outside)
    bundle = parse_bundle(pem_for(ca, "a.example.test"))

    with pytest.raises(NotFound):
        await store.replace("x.example.test.pem", bundle)
    with pytest.raises(NotFound):
        await store.replace("../elsewhere.pem", bundle)
    with pytest.raises(NotFound, match="alias"):
        await store.replace("b.example.test.pem", bundle)
    with pytest.raises(ReadOnlyRecord, match="certbot"):
        await store.replace("live/c.example.test/fullchain.pem", bundle)
    with pytest.raises(ReadOnlyRecord, match="symlink"):
        await store.replace("d.example.test.pem", bundle)
    with pytest.raises(CertificateError, match=r"does not cover a\.example\.test"):
        await store.replace(record.id, parse_bundle(pem_for(ca, "b.example.test")))
    with pytest.raises(ReadOnlyRecord):
        await store.delete("live/c.example.test/fullchain.pem")
    assert (root / "live" / "c.example.test" / "fullchain.pem").exists()


async def test_delete_removes_the_file_and_its_aliases(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    record = await store.add(parse_bundle(pem_for(ca, "a.example.test", "b.example.test")))
    other = write_combined(root, "c.example.test.pem", ca, "c.example.test")
    assert await store.delete(record.id) == record
    assert sorted(p.name for p in root.iterdir()) == ["c.example.test.pem"]
    assert await store.lookup("b.example.test") is None
    with pytest.raises(NotFound):
        await store.delete(record.id)
    found = await store.lookup("c.example.test")
    assert found is not None
    assert found.bundle == other


async def test_get(store: DirectoryStore, root: Path, ca: CA) -> None:
    bundle = write_certbot(root, "a.example.test", ca, "a.example.test")
    record = await store.get("live/a.example.test/fullchain.pem")
    assert record is not None
    assert record.names == bundle.names
    assert record.fingerprint_sha256 == bundle.fingerprint_sha256
    assert record.serial == format(bundle.serial, "X")
    assert record.key_type == "ECDSA-P256"
    assert record.version == 1
    mtime = (root / "live" / "a.example.test" / "fullchain.pem").stat().st_mtime
    assert record.updated_at.timestamp() == pytest.approx(mtime)
    for missing in ("b.example.test.pem", "../x.pem", "live/../../x/fullchain.pem", "notes.txt"):
        assert await store.get(missing) is None


async def test_list(store: DirectoryStore, root: Path, ca: CA) -> None:
    now = datetime.now(UTC)
    write_combined(root, "c.example.test.pem", ca, "c.example.test")
    write_certbot(root, "*.example.test", ca, "*.example.test")
    (root / "README.pem").write_bytes(b"not a record: lookups never build this name")
    (root / "broken.example.test.pem").write_bytes(b"garbage")
    soon = parse_bundle(
        *issue(ca, "a.example.test", key=shared_key(), not_after=now + timedelta(days=3))
    )
    added = await store.add(soon)
    await store.add(parse_bundle(pem_for(ca, "b.example.test", "c.other.test")))

    ids = []
    cursor = None
    while True:
        page = await store.list(cursor=cursor, limit=2)
        ids += [r.id for r in page.records]
        cursor = page.cursor
        if cursor is None:
            break
    assert ids == [
        "a.example.test.pem",
        "b.example.test.pem",
        "c.example.test.pem",
        "live/*.example.test/fullchain.pem",
    ]  # no alias, no README, the broken file skipped with a warning
    named = await store.list(name="c.other.test")
    assert [r.id for r in named.records] == ["b.example.test.pem"]
    wildcard = await store.list(name="*.example.test")
    assert [r.id for r in wildcard.records] == ["live/*.example.test/fullchain.pem"]
    expiring = await store.list(expiring_before=now + timedelta(days=30))
    assert expiring.records == (added,)
    with pytest.raises(InvalidCursor):
        await store.list(cursor="nope")
    with pytest.raises(InvalidHostname):
        await store.list(name="../x")


def test_name_of_stem() -> None:
    assert name_of_stem("a.example.test") == "a.example.test"
    assert name_of_stem("_wildcard.example.test") == "*.example.test"
    assert name_of_stem("*.example.test") == "*.example.test"
    for bad in ("A.example.test", "README", "..", "_wildcard.test", "*.*.x.test", "a..b"):
        assert name_of_stem(bad) is None


# --- change feed ----------------------------------------------------------------------------------


async def test_changes_sees_writes_by_the_store(store: DirectoryStore, root: Path, ca: CA) -> None:
    assert await store.changes(None, 0) == ((), ANY)
    _, position = await store.changes(None, 0)
    record = await store.add(parse_bundle(pem_for(ca, "a.example.test", "b.example.test")))
    changes, position = await store.changes(position, 2)
    assert changes == (Change("put", record.id, ("a.example.test", "b.example.test")),)

    await store.replace(record.id, parse_bundle(pem_for(ca, "a.example.test", "c.example.test")))
    changes, position = await store.changes(position, 2)
    assert changes == (
        Change("put", record.id, ("a.example.test", "b.example.test", "c.example.test")),
    )
    await store.delete(record.id)
    changes, position = await store.changes(position, 2)
    assert changes == (Change("delete", record.id, ("a.example.test", "c.example.test")),)
    assert await store.changes(position, 0) == ((), position)


async def test_changes_sees_files_written_by_others(
    root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirectoryStore(root, poll_interval=0.05)
    _, position = await store.changes(None, 0)
    started = time.monotonic()
    assert await store.changes(position, 0.3) == ((), position)
    assert 0.25 < time.monotonic() - started < 2

    async def later(action: Callable[[], object]) -> None:
        await asyncio.sleep(0.15)
        await asyncio.to_thread(action)

    async def expect(action: Callable[[], object], *changes: Change) -> None:
        """Run ``action`` soon; the feed reports ``changes`` within a few polls.

        A poll may land in the middle of a write of several steps (truncate, then
        write; fullchain, then privkey): the same change then comes more than once.
        """
        nonlocal position
        task = asyncio.create_task(later(action))
        started = time.monotonic()
        found, position = await store.changes(position, 3)
        assert time.monotonic() - started < 1.5  # a few polls
        await task
        more = found
        while more:
            more, position = await store.changes(position, 0.1)
            found += more
        assert set(found) == set(changes)

    await expect(
        lambda: write_combined(root, "a.example.test.pem", ca, "a.example.test"),
        Change("put", "a.example.test.pem", ("a.example.test",)),
    )
    await expect(
        lambda: write_combined(root, "a.example.test.pem", ca, "a.example.test"),  # in place
        Change("put", "a.example.test.pem", ("a.example.test",)),
    )
    await expect(
        lambda: write_certbot(root, "_wildcard.example.test", ca, "*.example.test"),
        Change("put", "live/_wildcard.example.test/fullchain.pem", ("*.example.test",)),
    )
    await expect(
        lambda: (root / "live/_wildcard.example.test/privkey.pem").write_bytes(b"rotated"),
        Change("put", "live/_wildcard.example.test/fullchain.pem", ("*.example.test",)),
    )
    await expect(
        lambda: (root / "a.example.test.pem").unlink(),
        Change("delete", "a.example.test.pem", ("a.example.test",)),
    )
    await expect(
        lambda: (root / "*.other.test.pem").write_bytes(b"x"),
        Change("put", "*.other.test.pem", ("*.other.test",)),
    )
    # Files no lookup would read are not records: nothing to report.
    (root / "notes.pem").write_bytes(b"x")
    (root / ".a.example.test.pem.tmp").write_bytes(b"x")
    assert await store.changes(position, 0.2) == ((), position)


async def test_changes_refuses_foreign_positions(root: Path) -> None:
    one, two = DirectoryStore(root), DirectoryStore(root)
    _, position = await one.changes(None, 0)
    for bad in (position, "garbage", ""):
        with pytest.raises(ChangesLost):
            await two.changes(bad, 0)
    assert await one.changes(position, 0) == ((), position)


async def test_changes_on_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await DirectoryStore(tmp_path / "nope").changes(None, 0)


# --- certbot lineages serve every name of their certificate (the SAN index) ------------------


def lineage(
    root: Path, ca: CA, dirname: str, *names: str, key_type: KeyType = "ec", days: int = 90
) -> CertBundle:
    """A certbot lineage as certbot writes it: archive files, ``live/`` symlinks."""
    not_after = datetime.now(UTC) + timedelta(days=days)
    chain, key = issue(ca, *names, key=shared_key(key_type), not_after=not_after)
    certbot.write_lineage(root, dirname, chain, key)
    return parse_bundle(chain, key)


async def collect(
    store: DirectoryStore, position: str, first: float = 3.0
) -> tuple[list[Change], str]:
    """The changes after ``position``: the first batch within ``first`` s, then until quiet."""
    found, position = await store.changes(position, first)
    changes = list(found)
    while found:
        found, position = await store.changes(position, 0.3)
        changes += found
    return changes, position


async def test_a_lineage_serves_every_name_of_its_certificate(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    bundle = lineage(
        root, ca, "site.example.test", "site.example.test", "www.site.example.test",
        "*.site.example.test",
    )  # fmt: skip
    # www. first: nothing named after it, and the apex was never looked up
    for host in ("www.site.example.test", "a.site.example.test", "site.example.test"):
        found = await store.lookup(host)
        assert found is not None, host
        assert found.id == "live/site.example.test/fullchain.pem"
        assert found.bundle == bundle
    assert await store.lookup("x.a.site.example.test") is None
    assert await store.lookup("www.other.example.test") is None
    assert store.change_detection.startswith("inotify")


async def test_files_named_after_the_host_come_before_the_san_index(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    lineage(root, ca, "site.example.test", "site.example.test", "www.site.example.test")
    write_combined(root, "_wildcard.site.example.test.pem", ca, "*.site.example.test")
    found = await store.lookup("www.site.example.test")
    assert found is not None
    assert found.id == "live/site.example.test/fullchain.pem"  # a name beats a wildcard file
    write_combined(root, "www.site.example.test.pem", ca, "www.site.example.test")
    found = await store.lookup("www.site.example.test")
    assert found is not None
    assert found.id == "www.site.example.test.pem"  # a file named after the host decides
    found = await store.lookup("api.site.example.test")
    assert found is not None
    assert found.id == "_wildcard.site.example.test.pem"


async def test_lineages_sharing_a_name_ecdsa_and_rsa(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    names = ("site.example.test", "www.site.example.test")
    newer = lineage(root, ca, "site.example.test", *names)
    lineage(root, ca, "site.example.test-0001", *names, days=10)  # an older lineage
    rsa = lineage(root, ca, "site.example.test-rsa", *names, key_type="rsa")
    found = await store.lookup_all("www.site.example.test")
    assert [f.bundle for f in found] == [newer, rsa]  # the best ECDSA one, then RSA
    found = await store.lookup_all("site.example.test")
    assert [f.bundle for f in found] == [newer]  # live/site.example.test/ is named after it


async def test_certbot_renewal_is_noticed_and_may_change_the_names(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    lineage(root, ca, "site.example.test", "site.example.test", "www.site.example.test")
    _, position = await store.changes(None, 0)
    assert await store.lookup("api.site.example.test") is None
    chain, key = issue(ca, "site.example.test", "api.site.example.test", key=shared_key())
    started = time.monotonic()
    assert await asyncio.to_thread(certbot.renew, root, "site.example.test", chain, key) == 2
    changes, position = await collect(store, position)
    assert time.monotonic() - started < 2
    assert changes == [
        Change(
            "put",
            "live/site.example.test/fullchain.pem",
            ("api.site.example.test", "site.example.test", "www.site.example.test"),
        )
    ]
    found = await store.lookup("api.site.example.test")
    assert found is not None
    assert found.bundle == parse_bundle(chain, key)
    assert await store.lookup("www.site.example.test") is None  # no longer one of its names
    assert await store.changes(position, 0.2) == ((), position)


async def test_lineages_added_and_removed_while_watching(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    _, position = await store.changes(None, 0)  # no live/ yet
    bundle = lineage(root, ca, "new.example.test", "new.example.test", "www.new.example.test")
    changes, position = await collect(store, position)
    names = ("new.example.test", "www.new.example.test")
    assert changes == [Change("put", "live/new.example.test/fullchain.pem", names)]
    found = await store.lookup("www.new.example.test")
    assert found is not None
    assert found.bundle == bundle
    shutil.rmtree(root / "live" / "new.example.test")
    changes, position = await collect(store, position)
    assert changes == [Change("delete", "live/new.example.test/fullchain.pem", names)]
    assert await store.lookup("www.new.example.test") is None


async def test_at_rest_the_change_feed_does_no_work(
    store: DirectoryStore, root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    lineage(root, ca, "site.example.test", "site.example.test", "www.site.example.test")
    _, position = await store.changes(None, 0)
    calls: list[object] = []
    original = DaemonExecutor.submit

    def spy(self: DaemonExecutor, fn: Callable[[], object]) -> object:
        calls.append(fn)
        return original(self, fn)

    monkeypatch.setattr(DaemonExecutor, "submit", spy)
    assert await store.changes(position, 0.5) == ((), position)
    assert calls == []  # no rescan, no stat: the event loop slept


async def test_an_inotify_queue_overflow_means_a_rescan(
    store: DirectoryStore, root: Path, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    _, position = await store.changes(None, 0)
    watcher = store._watcher
    assert watcher is not None and watcher.watching
    inotify = watcher._inotify
    assert inotify is not None
    original = inotify.read

    def lossy() -> list[_inotify.Event]:
        original()  # the events are lost ...
        return [_inotify.Event(-1, _inotify.IN_Q_OVERFLOW, "", None)]  # ... and the kernel says so

    inotify.read = lossy  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        write_combined(root, "a.example.test.pem", ca, "a.example.test")
        changes, position = await collect(store, position)
    assert changes == [Change("put", "a.example.test.pem", ("a.example.test",))]
    assert "overflow" in caplog.text


@pytest.mark.parametrize("cause", ["dir_watch", "watch limit", "no inotify", "nfs"])
async def test_polling_when_inotify_cannot_be_used(
    root: Path,
    ca: CA,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cause: str,
) -> None:
    if cause == "watch limit":  # reached at the first lineage, after root and live/

        def limit(self: _inotify.Inotify, path: Path, tag: str, mask: int = 0) -> int:
            if tag.startswith("live/"):
                raise _inotify.WatchLimit(28, "the inotify watch limit is reached")
            return original(self, path, tag)

        original = _inotify.Inotify.add_watch
        monkeypatch.setattr(_inotify.Inotify, "add_watch", limit)
    elif cause == "no inotify":

        def unavailable() -> _inotify.Inotify:
            raise _inotify.InotifyUnavailable(38, "Function not implemented")

        monkeypatch.setattr(_inotify, "open_inotify", unavailable)
    elif cause == "nfs":
        mount = f"36 25 0:44 / {root} rw,relatime - nfs4 server:/certs rw,vers=4.2\n"
        monkeypatch.setattr(_dirscan, "read_mountinfo", lambda: mount)
    mode: _dirwatch.WatchMode = "poll" if cause == "dir_watch" else "auto"
    store = DirectoryStore(root, poll_interval=0.1, watch=mode)
    lineage(root, ca, "a.example.test", "a.example.test", "www.a.example.test")
    try:
        with caplog.at_level(logging.WARNING):
            _, position = await store.changes(None, 0)
            bundle = lineage(root, ca, "b.example.test", "b.example.test", "www.b.example.test")
            changes, position = await collect(store, position)
            await asyncio.sleep(0.3)  # a few more polls
        assert changes == [
            Change(
                "put", "live/b.example.test/fullchain.pem", ("b.example.test", "www.b.example.test")
            )
        ]
        found = await store.lookup("www.b.example.test")
        assert found is not None
        assert found.bundle == bundle
        assert store.change_detection.startswith("polling every 0.1s")
        warnings = caplog.text.count("polling every 0.1s instead")
        assert warnings == (0 if cause == "dir_watch" else 1)  # once, not per poll
    finally:
        await store.close()


def test_remote_filesystems_are_recognised() -> None:
    mountinfo = (
        "22 1 253:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "36 22 0:40 / /mnt/certs rw,relatime - nfs4 server:/certs rw\n"
        "37 22 0:41 / /mnt/with\\040space rw - cifs //server/x rw\n"
        "38 36 0:42 / /mnt/certs/local rw - tmpfs tmpfs rw\n"
    )
    assert remote_filesystem(Path("/mnt/certs/live"), mountinfo) == "nfs4"
    assert remote_filesystem(Path("/mnt/with space/a"), mountinfo) == "cifs"
    assert remote_filesystem(Path("/mnt/certs/local/x"), mountinfo) is None
    assert remote_filesystem(Path("/mnt/certsx"), mountinfo) is None
    assert remote_filesystem(Path("/etc"), mountinfo) is None


# --- bounded reads ------------------------------------------------------------------------------


def hang_reads_of(
    monkeypatch: pytest.MonkeyPatch, prefix: str
) -> tuple[threading.Event, list[Path]]:
    """Reads of files named ``prefix...`` block (a hung filesystem) until the event is set."""
    release = threading.Event()
    stuck: list[Path] = []
    original = _files.read_regular

    def read(path: Path, label: str, limit: int = MAX_FILE_SIZE) -> tuple[bytes, float]:
        if path.name.startswith(prefix):
            stuck.append(path)
            release.wait(60)
        return original(path, label, limit)

    monkeypatch.setattr(_files, "read_regular", read)
    return release, stuck


async def test_a_hung_read_fails_its_lookup_fast_and_never_delays_close(
    root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_combined(root, "ok.example.test.pem", ca, "ok.example.test")
    write_combined(root, "hung.example.test.pem", ca, "hung.example.test")
    release, stuck = hang_reads_of(monkeypatch, "hung.example.test.pem")
    store = DirectoryStore(root, read_timeout=0.3)
    try:
        await store.changes(None, 0)
        started = time.monotonic()
        results = await asyncio.gather(
            *(store.lookup("hung.example.test") for _ in range(8)), return_exceptions=True
        )
        assert time.monotonic() - started < 2
        for result in results:
            assert isinstance(result, StoreUnavailable)
            assert "'hung.example.test.pem'" in str(result)
            assert "did not finish within 0.3s" in str(result)
        assert len(stuck) == 8
        # Every thread is stuck now: another lookup fails fast too, and says why.
        with pytest.raises(StoreUnavailable, match="no free file thread"):
            await store.lookup("ok.example.test")

        started = time.monotonic()
        await store.close()
        assert time.monotonic() - started < 0.5  # did not wait for the 8 stuck reads
        threads = [t for t in threading.enumerate() if t.name.startswith("certagent-dir")]
        assert len(threads) >= 8 and all(t.daemon for t in threads)  # the exit won't wait
        found = await store.lookup("ok.example.test")  # fresh threads after close
        assert found is not None
    finally:
        release.set()
        await store.close()


async def test_the_agent_stops_in_time_with_reads_stuck(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "certs"
    root.mkdir()
    hosts = [f"hung{i}.example.test" for i in range(8)]
    for host in hosts:
        write_combined(root, f"{host}.pem", ca, host)
    release, stuck = hang_reads_of(monkeypatch, "hung")
    threads_before = set(threading.enumerate())
    settings = Settings(
        store=root.as_uri(),
        agent_socket=str(tmp_path / "agent.sock"),
        haproxy_socket=str(tmp_path / "no-haproxy.sock"),  # the agent keeps trying meanwhile
        crt_list=str(tmp_path / "certagent.crtlist"),
    )
    stop = asyncio.Event()
    agent = asyncio.create_task(daemon.run(settings, stop))

    async def ensure(host: str) -> bytes:
        reader, writer = await asyncio.open_unix_connection(settings.agent_socket)
        writer.write(f"ensure {host}\n".encode())
        try:
            return await reader.readline()
        finally:
            writer.close()

    async def until(probe: Callable[[], bool]) -> None:
        for _ in range(250):
            if probe():
                return
            await asyncio.sleep(0.02)
        pytest.fail(f"not within 5 s: {probe}")

    clients: list[asyncio.Task[bytes]] = []
    try:
        await until(lambda: os.path.exists(settings.agent_socket))
        clients = [asyncio.create_task(ensure(host)) for host in hosts]
        # Every lookup fails (its read is stuck, or no thread is free: the
        # expiry sweep and the name filter read the same files at startup).
        answers = await asyncio.wait_for(asyncio.gather(*clients), 15)
        assert answers == [b"error\n"] * len(hosts)
        pool = [
            t
            for t in threading.enumerate()
            if t.name.startswith("certagent-dir") and t not in threads_before
        ]
        assert len(pool) == 8 and stuck  # the pool grew to its 8 threads; reads still stuck
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(agent, 5)
        assert time.monotonic() - started < 5
        assert not release.is_set()  # it did not wait for them
    finally:
        release.set()
        stop.set()
        for client in clients:
            client.cancel()


def test_change_log_positions() -> None:
    log = ChangeLog("file:///x", keep=3)
    start = log.position()
    assert log.since(log.seq_of(start)) == ()
    log.append([Change("put", "a.pem", ("a.x.test",)), Change("put", "b.pem", ("b.x.test",))])
    log.append([Change("delete", "a.pem", ("a.x.test", "c.x.test"))])
    middle = log.position()
    # one change per record: the last kind, every name
    assert log.since(log.seq_of(start)) == (
        Change("delete", "a.pem", ("a.x.test", "c.x.test")),
        Change("put", "b.pem", ("b.x.test",)),
    )
    log.append([Change("put", "d.pem", ("d.x.test",))])
    assert log.since(log.seq_of(middle)) == (Change("put", "d.pem", ("d.x.test",)),)
    with pytest.raises(ChangesLost, match="no longer kept"):
        log.seq_of(start)  # 4 changes since, 3 kept: the caller must reconcile
    for foreign in (ChangeLog("file:///x").position(), f"{middle}0", "x.1", ""):
        with pytest.raises(ChangesLost, match="not a position"):
            log.seq_of(foreign)


async def test_polling_waits_longer_when_a_rescan_is_slow(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[float] = []
    original = _dirwatch.DirWatcher._rescan

    async def slow_rescan(self: _dirwatch.DirWatcher) -> None:
        scans.append(time.monotonic())
        await asyncio.sleep(0.05)  # a slow filesystem
        await original(self)

    monkeypatch.setattr(_dirwatch.DirWatcher, "_rescan", slow_rescan)
    store = DirectoryStore(root, poll_interval=0.05, watch="poll")
    try:
        await store.changes(None, 0)
        await asyncio.sleep(1.5)
    finally:
        await store.close()
    # Every 0.05 s would be ~15 scans.  The first scan (it reads every certificate) does
    # not count; after the second, a rescan, they are at least 20 x 0.05 s apart.
    assert 2 <= len(scans) <= 3, scans
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(scans[1:])), scans


# --- OCSP -----------------------------------------------------------------------------------------


async def test_an_ocsp_response_sits_beside_its_file_and_is_a_change(
    store: DirectoryStore, root: Path, ca: CA
) -> None:
    from cryptography import x509

    from certagent.errors import OcspError
    from certagent.testing.ocsp import ocsp_response

    chain, key = issue(ca, "o.example.test", key=shared_key())
    record = await store.add(parse_bundle(chain, key))
    _, position = await store.changes(None, 0)
    der = ocsp_response(ca, x509.load_pem_x509_certificate(chain))
    facts = await store.put_ocsp(record.id, der, datetime.now(UTC))
    assert facts.status == "good"
    assert (root / f"{record.id}.ocsp").read_bytes() == der
    changes, position = await store.changes(position, 2)
    assert changes == (Change("put", record.id, ("o.example.test",)),)
    found = await store.lookup_all("o.example.test")
    assert [s.ocsp for s in found] == [der]
    other = issue_cert(ca, "p.example.test", key=shared_key())
    with pytest.raises(OcspError, match="another certificate"):
        await store.put_ocsp(record.id, ocsp_response(ca, other), datetime.now(UTC))
    assert (root / f"{record.id}.ocsp").read_bytes() == der  # nothing lost
    # a sidecar that is not a response for it is not stapled (the certificate still is served)
    (root / f"{record.id}.ocsp").write_bytes(b"garbage")
    found = await store.lookup_all("o.example.test")
    assert len(found) == 1 and found[0].ocsp is None
