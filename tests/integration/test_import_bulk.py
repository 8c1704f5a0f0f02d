"""``cert import`` into Redis in batches: validation in worker processes, one round trip a batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from certagent.api.body import upload_policy
from certagent.certs.keycrypt import KeyRing
from certagent.cli import importer
from certagent.cli.backends import StoreBackend
from certagent.cli.cert import add_cert_commands, run_cert_command
from certagent.cli.importer import ImportResult, import_certificates, iter_import_items
from certagent.cli.progress import Progress
from certagent.config import Settings, to_toml
from certagent.store import RedisStore
from certagent.store.base import BulkWriter
from certagent.store.redis import BulkAdds, Keys
from certagent.store.redis._packed import unpack
from certagent.testing import PKI, RedisFixture
from certagent.testing.certs import combined, issue, key_pem, make_key
from certagent.testing.processes import free_port
from tests.integration.test_store_redis_bulk import snapshot

pytestmark = pytest.mark.integration

KEYS = Keys()


class OneByOne(StoreBackend):
    """The store backend without its bulk path: every file through the single ``add``."""

    def bulk(self) -> BulkWriter | None:
        return None


@pytest.fixture
def ring(redis_store: RedisFixture) -> KeyRing:
    return KeyRing.from_file(redis_store.key_file)


@pytest.fixture
def small_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Use worker processes for a few hundred files too."""
    monkeypatch.setattr(importer, "POOL_FROM", 1)
    yield


def write_files(pki: PKI, directory: Path, count: int, *, start: int = 0) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + count):
        name = f"f{i:04d}.import.test"
        path = directory / f"{name}.pem"
        path.write_bytes(combined(*pki.chain_and_key(name, f"alias{i % 4}.import.test")))
        paths.append(path)
    return paths


def backend(
    url: str, ring: KeyRing, *, prefix: str = "certagent:", now: dt.datetime | None = None,
    kind: type[StoreBackend] = StoreBackend,
) -> StoreBackend:  # fmt: skip
    settings = Settings(store=url)
    store = RedisStore(url, keyring=ring, prefix=prefix)
    if now is None:
        return kind(store, upload_policy(settings))
    return kind(store, upload_policy(settings), now=lambda: now)


def run_import(target: StoreBackend, source: Path, **options: Any) -> tuple[ImportResult, str]:
    out = io.StringIO()
    options.setdefault("progress", out)

    async def main() -> ImportResult:
        try:
            return await import_certificates(target, source, **options)
        finally:
            await target.close()

    return asyncio.run(main()), out.getvalue()


async def _snapshot(url: str, keys: Keys, ring: KeyRing) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    try:
        return await snapshot(client, keys, ring)
    finally:
        await client.aclose()


def check_consistent(url: str, keys: Keys = KEYS) -> int:
    """Every record is whole and indexed, with one put event; nothing points at a missing one."""
    with redis.Redis.from_url(url, decode_responses=True) as client:
        ids = set(client.zrange(keys.ids(), 0, -1))
        assert set(client.zrange(keys.expiry(), 0, -1)) == ids
        events = [fields for _, fields in client.xrange(keys.events())]
        assert sorted(e["id"] for e in events) == sorted(ids)  # one put per record
        assert {e["kind"] for e in events} <= {"put"}
        hashes = set(k.removeprefix(keys.cert("")) for k in client.scan_iter(keys.cert("*")))
        assert hashes == ids
        with redis.Redis.from_url(url) as raw:
            for cert_id in ids:
                meta = unpack(raw.get(keys.cert(cert_id))).meta()
                sha = (meta["fingerprint_sha256"] or b"").decode()
                assert client.get(keys.fingerprint(sha)) == cert_id
                for name in (meta["names"] or b"").decode().split():
                    assert client.sismember(keys.name(name), cert_id)
        for key in client.scan_iter(keys.fingerprint("*")):
            assert client.get(key) in ids
        for key in client.scan_iter(keys.name("*")):
            assert set(client.smembers(key)) <= ids
        return len(ids)


# --- results -----------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_store_what_single_adds_store(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path, small_pool: None,
    workers: int,
) -> None:  # fmt: skip
    source = tmp_path / "import"
    write_files(pki, source, 230)
    (source / "f0100.import.test.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\ngarbage\n")
    shutil.copy(source / "f0007.import.test.pem", source / "f9999-copy.import.test.pem")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    monkey = pytest.MonkeyPatch()
    monkey.setattr("certagent.store.redis._store._now", lambda: now)
    try:
        single, single_out = run_import(
            backend(redis_store.url, ring, prefix="single:", kind=OneByOne), source
        )
    finally:
        monkey.undo()
    bulk, bulk_out = run_import(
        backend(redis_store.url, ring, prefix="bulk:", now=now), source, workers=workers, batch=40
    )
    for result in (single, bulk):
        assert (result.total, result.added, result.existing, result.failed) == (231, 229, 1, 1)
        assert result.stopped is None
    for out in (single_out, bulk_out):
        assert "skipped f0100.import.test.pem: bad-pem" in out
        assert out.count("skipped") == 1
    assert check_consistent(redis_store.url, Keys("bulk:")) == 229
    bulk_state = asyncio.run(_snapshot(redis_store.url, Keys("bulk:"), ring))
    single_state = asyncio.run(_snapshot(redis_store.url, Keys("single:"), ring))
    # single adds run 8 at a time: their events are in no set order; the batches' follow the
    # files as the directory lists them (the copy of f0007 is f0007's certificate)
    listed: list[str] = []
    for item in iter_import_items(source):
        name = item.label.removesuffix(".pem").replace("f9999-copy", "f0007")
        if name != "f0100.import.test" and name not in listed:
            listed.append(name)
    assert [e[2].split()[0] for e in bulk_state["events"]] == [n.encode() for n in listed]
    bulk_state["events"].sort()
    single_state["events"].sort()
    assert bulk_state == single_state
    assert len(bulk_state["events"]) == 229


def test_summary_line_and_progress(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path, small_pool: None
) -> None:
    source = tmp_path / "import"
    write_files(pki, source, 120)
    result, _ = run_import(backend(redis_store.url, ring), source, batch=25)
    summary = result.summary()
    assert summary.startswith("imported 120 of 120 files in ")
    assert "/s): 120 added, 0 already stored, 0 failed" in summary
    # again: everything is already stored
    again, _ = run_import(backend(redis_store.url, ring), source, batch=25)
    assert (again.added, again.existing, again.failed) == (0, 120, 0)
    assert check_consistent(redis_store.url) == 120


def test_progress_lines_when_not_a_terminal(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path
) -> None:
    source = tmp_path / "import"
    write_files(pki, source, 60)
    out = io.StringIO()
    progress = Progress(out, tty=False, interval=0.0)  # a line at every update
    result, _ = run_import(backend(redis_store.url, ring), source, batch=25, progress=progress)
    assert result.added == 60
    lines = out.getvalue().splitlines()
    assert [line.split(" files")[0] for line in lines] == [
        f"import: {n}/60" for n in range(1, 61)
    ]
    assert lines[-1].startswith("import: 60/60 files (100%), 60 added, 0 already stored, 0 failed,")
    assert lines[-1].endswith("/s, ETA 0:00")


def test_rsa_and_ecdsa_keys_of_their_own(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path, small_pool: None
) -> None:
    source = tmp_path / "import"
    source.mkdir()
    for i, key_type in enumerate(["rsa", "ec", "ec384", "rsa"]):
        key = make_key(key_type)  # type: ignore[arg-type]
        chain, _ = issue(pki.ca, f"k{i}.import.test", key=key)
        (source / f"k{i}.import.test.pem").write_bytes(combined(chain, key_pem(key)))
    result, out = run_import(backend(redis_store.url, ring), source, workers=2, batch=2)
    assert (result.added, result.failed) == (4, 0), out
    with redis.Redis.from_url(redis_store.url) as client:
        ids = client.zrange(KEYS.ids(), 0, -1)
        metas = [unpack(client.get(KEYS.cert(i.decode()))).meta() for i in ids]
        types = sorted((m["key_type"] or b"").decode() for m in metas)
    assert types == ["ECDSA-P256", "ECDSA-P384", "RSA-2048", "RSA-2048"]


def test_an_id_already_taken_is_added_again_on_its_own(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    source = tmp_path / "import"
    write_files(pki, source, 5)
    draws = iter(["00000000000000a1", "00000000000000a1"])
    real = secrets.token_hex
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(draws, None) or real(n))
    result, out = run_import(backend(redis_store.url, ring), source, workers=0)
    assert (result.added, result.existing, result.failed) == (5, 0, 0), out
    assert check_consistent(redis_store.url) == 5


def test_a_user_who_may_not_run_scripts_still_imports_everything(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path, small_pool: None
) -> None:
    source = tmp_path / "import"
    write_files(pki, source, 50)
    admin = redis.Redis.from_url(redis_store.url)
    admin.acl_setuser(
        "noscript", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    port = redis_store.url.rsplit(":", 1)[1].split("/")[0]
    try:
        url = f"redis://noscript:pw@127.0.0.1:{port}/0"
        result, out = run_import(backend(url, ring), source, workers=2, batch=20)
    finally:
        admin.acl_deluser("noscript")
        admin.close()
    assert (result.added, result.existing, result.failed, result.stopped) == (50, 0, 0, None), out
    assert check_consistent(redis_store.url) == 50


# --- the store goes away ----------------------------------------------------------------------


def test_store_gone_mid_import_stops_and_leaves_whole_records(
    redis_store: RedisFixture, ring: KeyRing, pki: PKI, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, small_pool: None,
) -> None:  # fmt: skip
    source = tmp_path / "import"
    write_files(pki, source, 600)
    admin = redis.Redis.from_url(redis_store.url)
    admin.acl_setuser(
        "importer", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all"],
    )  # fmt: skip
    port = redis_store.url.rsplit(":", 1)[1].split("/")[0]
    url = f"redis://importer:pw@127.0.0.1:{port}/0"
    original = BulkAdds.add_wire  # the import sends packed writes (one Redis)
    calls = 0

    async def cut_off(self: BulkAdds, records: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 3:  # while this batch is on the wire: disable the user, drop its connections

            def kill() -> None:
                admin.acl_setuser("importer", enabled=False)
                admin.client_kill_filter(user="importer")

            asyncio.get_running_loop().call_later(0.001, kill)
        return await original(self, records)

    monkeypatch.setattr(BulkAdds, "add_wire", cut_off)
    try:
        result, _ = run_import(backend(url, ring), source, workers=2, batch=100)
        assert result.stopped is not None
        assert "import again to finish" in result.stopped
        assert "pw@" not in result.stopped
        assert result.added >= 200
        assert result.done < 600
        stored = check_consistent(redis_store.url)
        assert result.added <= stored <= result.added + 100  # the batch cut off: whole or not

        admin.acl_setuser("importer", enabled=True)
        monkeypatch.setattr(BulkAdds, "add_wire", original)
        again, _ = run_import(backend(url, ring), source, workers=2, batch=100)
        assert again.stopped is None
        assert (again.added, again.existing, again.failed) == (600 - stored, stored, 0)
        assert check_consistent(redis_store.url) == 600
    finally:
        admin.acl_deluser("importer")
        admin.close()


def test_cli_exit_status_and_message_when_redis_is_down(
    tmp_path: Path, pki: PKI, redis_store: RedisFixture
) -> None:
    source = tmp_path / "import"
    write_files(pki, source, 3)
    cfg = tmp_path / "certagent.toml"
    keys = tmp_path / "keys"
    keys.write_text(redis_store.key_file.read_text())
    cfg.write_text(
        to_toml(Settings(store=f"redis://127.0.0.1:{free_port()}/0", key_file=str(keys)))
    )
    parser = argparse.ArgumentParser(prog="certagent")
    add_cert_commands(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run_cert_command(
            parser.parse_args(["cert", "import", "--config", str(cfg), str(source)])
        )
    assert status == 1
    assert "imported 0 of 3 files" in out.getvalue()
    assert "stopped:" in out.getvalue()
    assert "import again to finish" in out.getvalue()
