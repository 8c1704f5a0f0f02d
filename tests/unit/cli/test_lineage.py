"""``cert import LINEAGE`` (certbot's deploy hook): add, or rotate the previous version's record."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import pytest

from certagent.api.body import upload_policy
from certagent.cli import main
from certagent.cli.backends import StoreBackend
from certagent.cli.lineage import LineageResult, deploy_lineage, is_lineage
from certagent.config import Settings, to_toml
from certagent.errors import PemError
from certagent.testing.certbot import renew, write_lineage
from certagent.testing.certs import CA, issue, make_ca, shared_key
from tests.memstore import MemoryStore

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def deploy(store: MemoryStore, lineage: Path) -> LineageResult:
    return asyncio.run(deploy_lineage(StoreBackend(store, upload_policy(Settings())), lineage))


def ids(store: MemoryStore) -> list[str]:
    return sorted(store.records)


def test_add_then_rotate_then_unchanged(ca: CA, store: MemoryStore, tmp_path: Path) -> None:
    lineage = write_lineage(tmp_path, "a.test", *issue(ca, "a.test", "www.a.test"))
    first = deploy(store, lineage)
    assert (first.action, first.record["version"]) == ("added", 1)
    assert first.summary().startswith(f"added {first.record['id']} for a.test www.a.test")
    renew(tmp_path, "a.test", *issue(ca, "a.test", "www.a.test"))
    second = deploy(store, lineage)
    assert (second.action, second.record["id"], second.record["version"]) == (
        "rotated", first.record["id"], 2
    )  # fmt: skip
    assert "the agents swap it in live" in second.summary()
    third = deploy(store, lineage)
    assert (third.action, third.record["version"]) == ("unchanged", 2)
    assert ids(store) == [first.record["id"]]
    assert (first.notes(), second.notes(), third.notes()) == ([], [], [])


def test_an_expanded_lineage_rotates_a_shrunk_one_is_added(
    ca: CA, store: MemoryStore, tmp_path: Path
) -> None:
    lineage = write_lineage(tmp_path, "b.test", *issue(ca, "b.test"))
    first = deploy(store, lineage)
    renew(tmp_path, "b.test", *issue(ca, "b.test", "www.b.test"))  # certbot --expand
    grown = deploy(store, lineage)
    assert grown.action == "rotated" and grown.record["names"] == ["b.test", "www.b.test"]
    renew(tmp_path, "b.test", *issue(ca, "b.test"))  # a name dropped: keep serving it
    shrunk = deploy(store, lineage)
    assert shrunk.action == "added" and shrunk.record["id"] != first.record["id"]
    (note,) = shrunk.notes()
    rm = f"certagent cert rm {first.record['id']}"
    assert note.startswith(f"note: {first.record['id']} (ECDSA-P256, valid until ")
    assert note.endswith(f" also serves b.test; if this certificate replaces it: {rm}")
    assert len(ids(store)) == 2


def test_an_rsa_twin_stays_when_the_ecdsa_one_renews(
    ca: CA, store: MemoryStore, tmp_path: Path
) -> None:
    rsa_chain, rsa_key = issue(ca, "c.test", key_type="rsa")
    rsa = deploy(store, write_lineage(tmp_path / "rsa", "c.test", rsa_chain, rsa_key))
    lineage = write_lineage(tmp_path, "c.test", *issue(ca, "c.test", key=shared_key()))
    ecdsa = deploy(store, lineage)
    assert ecdsa.action == "added"  # not a rotation of the RSA record
    renew(tmp_path, "c.test", *issue(ca, "c.test", key=shared_key()))
    again = deploy(store, lineage)
    assert (again.action, again.record["id"]) == ("rotated", ecdsa.record["id"])
    assert [r["id"] for r in again.others] == [rsa.record["id"]]
    assert store.records[rsa.record["id"]][0].version == 1


def test_of_two_candidates_the_latest_is_rotated(
    ca: CA, store: MemoryStore, tmp_path: Path
) -> None:
    backend = StoreBackend(store, upload_policy(Settings()))
    older = asyncio.run(backend.add(*issue(ca, "d.test", not_after=NOW + dt.timedelta(days=20))))
    newer = asyncio.run(backend.add(*issue(ca, "d.test", not_after=NOW + dt.timedelta(days=60))))
    result = deploy(store, write_lineage(tmp_path, "d.test", *issue(ca, "d.test")))
    assert (result.action, result.record["id"]) == ("rotated", newer["id"])
    assert [r["id"] for r in result.others] == [older["id"]]


def test_a_bad_lineage_changes_nothing(ca: CA, store: MemoryStore, tmp_path: Path) -> None:
    chain, _ = issue(ca, "e.test")
    _, other_key = issue(ca, "e.test")
    lineage = write_lineage(tmp_path, "e.test", chain, other_key)
    with pytest.raises(Exception, match="key") as info:
        deploy(store, lineage)
    assert getattr(info.value, "code", "") == "key-mismatch"
    (lineage / "fullchain.pem").unlink()
    (lineage / "fullchain.pem").write_bytes(b"not a certificate\n")
    with pytest.raises(PemError):
        deploy(store, lineage)
    assert ids(store) == []


def test_what_counts_as_one_lineage(ca: CA, tmp_path: Path) -> None:
    lineage = write_lineage(tmp_path, "f.test", *issue(ca, "f.test"))
    assert is_lineage(lineage)
    assert not is_lineage(tmp_path / "live") and not is_lineage(tmp_path)


def test_the_cli_takes_a_lineage(
    ca: CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through ``certagent cert import`` on a directory store: exit 0 each time."""
    store = tmp_path / "store"
    store.mkdir()
    cfg = tmp_path / "certagent.toml"
    cfg.write_text(to_toml(Settings(store=str(store))))
    lineage = write_lineage(tmp_path / "le", "g.test", *issue(ca, "g.test", "www.g.test"))
    argv = ["cert", "import", "--config", str(cfg), str(lineage)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("added ")
    renew(tmp_path / "le", "g.test", *issue(ca, "g.test", "www.g.test"))
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("rotated ")
    assert main(argv) == 0
    assert "unchanged" in capsys.readouterr().out
    renew(tmp_path / "le", "g.test", *issue(ca, "g.test", "www.g.test"))
    (lineage / "privkey.pem").unlink()  # a new certificate without its key: refused
    assert main(argv) == 1
    assert "certagent: error:" in capsys.readouterr().err
