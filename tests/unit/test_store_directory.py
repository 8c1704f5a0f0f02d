from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from agent.errors import ConfigError, InvalidHostname, StoreUnavailable
from agent.pem import CertBundle, parse_bundle
from agent.store import DirectoryStore, RedisStore, open_store
from agent.store.base import Store, redact_url
from agent.store.directory import MAX_FILE_SIZE
from tests.certs import CA, issue, make_ca, shared_key


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
    opened: list[Path] = []
    original_open = Path.open

    def spy_open(self: Path, *args: object, **kwargs: object) -> object:
        opened.append(self)
        return original_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", spy_open)
    store = DirectoryStore(root)
    with pytest.raises(InvalidHostname):
        await store.lookup(name)
    assert opened == []


async def test_paths_stay_under_root(
    root: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Path] = []
    original_open = Path.open

    def spy_open(self: Path, *args: object, **kwargs: object) -> object:
        opened.append(self)
        return original_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", spy_open)
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


async def test_unreadable_candidate_is_unavailable(store: DirectoryStore, root: Path) -> None:
    (root / "a.example.test.pem").mkdir()  # reading a directory fails with an OSError
    with pytest.raises(StoreUnavailable, match=r"a\.example\.test\.pem"):
        await store.lookup("a.example.test")


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
