"""The store's roles: what each kind of store offers, views that replace one role, the callers."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from certagent.certs.keycrypt import KeyRing, generate_key_line
from certagent.certs.pem import CertBundle, parse_bundle
from certagent.config import Settings
from certagent.errors import ConfigError, StoreUnavailable
from certagent.service.datakey import check_data_key
from certagent.service.namefilter import NameFilter, NotingStore
from certagent.store import DirectoryStore, RedisStore, StoreView, open_configured
from certagent.store.base import BulkWriter, CertRecord, Store
from certagent.store.directory import LocalRing
from certagent.store.redis._cluster import ClusterWriter
from certagent.store.redis._single import SingleNodeWriter
from certagent.testing.certs import CA, issue, make_ca, shared_key
from tests.memstore import MemoryStore


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


def bundle(ca: CA, *names: str) -> CertBundle:
    chain, key = issue(ca, *names, key=shared_key())
    return parse_bundle(chain, key)


def test_a_directory_store_keeps_a_local_ring_and_has_no_data_keys_nor_bulk(
    tmp_path: Path,
) -> None:
    store: Store = DirectoryStore(tmp_path)
    ring = store.ticket_ring(tmp_path / "tickets" / "ring.json")
    assert isinstance(ring, LocalRing) and ring.path == tmp_path / "tickets" / "ring.json"
    assert store.data_keys() is None
    assert store.bulk() is None


@pytest.mark.parametrize(
    ("url", "writer"),
    [
        ("redis://127.0.0.1:6399/0", SingleNodeWriter),
        ("redis+sentinel://127.0.0.1:26399/mymaster", SingleNodeWriter),
        ("redis+cluster://127.0.0.1:7099,127.0.0.1:7098", ClusterWriter),
    ],
)
async def test_a_redis_store_picks_its_writer_once_and_offers_every_role(
    url: str, writer: type[object]
) -> None:
    ring = KeyRing.from_text(generate_key_line("k1"))
    store = RedisStore(url, keyring=ring)  # no I/O yet
    try:
        assert isinstance(store._writer, writer)
        assert store.ticket_ring(Path("/nonexistent/ring.json")) is store.tickets
        keys = store.data_keys()
        assert keys is store and keys.keyring is ring
        assert store.bulk() is not None
    finally:
        await store.close()


async def test_a_view_replaces_one_role_and_forwards_the_others(ca: CA) -> None:
    store, other = MemoryStore(), MemoryStore()
    view: Store = StoreView(store, writer=other)
    added = await view.add(bundle(ca, "a.view.test"))
    assert list(other.records) == [added.id] and not store.records  # the writer given
    assert await view.lookup("a.view.test") is None  # the store's reader
    store.available = False
    with pytest.raises(StoreUnavailable):
        await view.ping()
    assert view.describe() == "memory://"


async def test_a_view_with_its_own_writer_offers_no_bulk_adds() -> None:
    class WithBulk(MemoryStore):
        marker: BulkWriter | None = None

        def bulk(self) -> BulkWriter | None:  # type: ignore[override]
            return self.marker

    store = WithBulk()
    store.marker = object()  # type: ignore[assignment]
    assert StoreView(store).bulk() is store.marker
    assert StoreView(store, writer=MemoryStore()).bulk() is None


async def test_writes_through_the_api_view_reach_the_name_filter_at_once(ca: CA) -> None:
    async def nothing():  # type: ignore[no-untyped-def]
        return
        yield

    names = NameFilter()
    await names.build(nothing())
    store = MemoryStore()
    noting: Store = NotingStore(store, names)
    assert not names.may_hold("new.noting.test")
    record = await noting.add(bundle(ca, "new.noting.test", "alias.noting.test"))
    assert isinstance(record, CertRecord) and record.id in store.records
    assert names.may_hold("new.noting.test") and names.may_hold("alias.noting.test")
    await noting.replace(record.id, bundle(ca, "new.noting.test", "third.noting.test"))
    assert names.may_hold("third.noting.test")
    assert noting.bulk() is None


def test_a_redis_store_needs_a_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key_file"):
        open_configured(Settings(store="redis://127.0.0.1:6399/0"))
    assert isinstance(open_configured(Settings(store=str(tmp_path))), DirectoryStore)


async def test_the_data_key_check_asks_only_a_store_with_data_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        await check_data_key(DirectoryStore(tmp_path / "nope"), Settings())  # nothing to ask
    assert caplog.records == []

    class Keys:
        keyring = KeyRing.from_text(generate_key_line("k1"))

        async def key_ids_in_use(self, sample: int = 32) -> set[str]:
            return {"k1", "k0"}

        async def rotate_keys(self) -> int:
            return 0

    class Encrypting(MemoryStore):
        def data_keys(self) -> Keys:  # type: ignore[override]
            return Keys()

    with pytest.raises(ConfigError, match="data key k0"):
        await check_data_key(Encrypting(), Settings(key_file="/etc/certagent/data.key"))


# --- layout ---------------------------------------------------------------------------------


def _store_imports() -> dict[str, set[str]]:
    """Each module of certagent.store -> the modules of certagent.store it imports (AST)."""
    package = Path(__file__).resolve().parents[3] / "agent" / "certagent" / "store"
    modules: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = ("certagent", *path.relative_to(package.parent.parent).with_suffix("").parts[1:])
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if sub in modules:
                        graph[name].add(sub)
                    elif node.module in modules:
                        graph[name].add(node.module)
    return graph


def test_no_import_cycle_in_the_store_package() -> None:
    """Type-only imports included: a Protocol importing its implementation is a cycle too."""
    graph = _store_imports()
    assert {"certagent.store.redis._single", "certagent.store.redis._cluster"} <= set(graph)
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise AssertionError(" -> ".join((*path[path.index(name) :], name)))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
