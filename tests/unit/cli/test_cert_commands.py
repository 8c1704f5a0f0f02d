"""``certagent cert | keys | token`` against a DirectoryStore, directly and through the API."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from certagent.api import add_token, start_api
from certagent.certs.keycrypt import KeyRing, key_fingerprint
from certagent.cli import main
from certagent.cli.cert import CERT_COMMANDS, add_cert_commands, run_cert_command
from certagent.config import Settings, to_toml
from certagent.store import DirectoryStore
from certagent.testing.certs import CA, combined, issue, make_ca, shared_key


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="certagent")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cert_commands(sub)
    return parser.parse_args(argv)


def run(argv: list[str]) -> int:
    args = parse(argv)
    assert args.command in CERT_COMMANDS
    return run_cert_command(args)


@pytest.fixture(scope="module")
def ca() -> CA:
    return make_ca()


@dataclass
class Setup:
    root: Path  # the directory store
    config: Path  # certagent.toml naming it
    tmp: Path

    def write_cert(self, ca: CA, name: str) -> tuple[Path, Path]:
        chain, key = issue(ca, name, key=shared_key())
        cert_file, key_file = self.tmp / f"{name}.crt", self.tmp / f"{name}.key"
        cert_file.write_bytes(chain)
        key_file.write_bytes(key)
        return cert_file, key_file


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    root = tmp_path / "store"
    root.mkdir()
    cfg = tmp_path / "certagent.toml"
    cfg.write_text(to_toml(Settings(store=str(root))))
    return Setup(root, cfg, tmp_path)


@pytest.fixture
def api_url(setup: Setup) -> Iterator[tuple[str, str]]:
    """A real API server (own loop, own thread) on the setup's store: (url, token)."""
    import threading

    tokens = setup.tmp / "tokens"
    token = add_token(tokens, "cli")
    settings = Settings(store=str(setup.root), api_bind="127.0.0.1:0", api_tokens_file=str(tokens))
    loop = asyncio.new_event_loop()
    started: list[str] = []
    stop = asyncio.Event()

    async def serve() -> None:
        async def loaded() -> list[object]:
            return []

        server = await start_api(
            settings,
            DirectoryStore(setup.root),
            loaded=loaded,  # type: ignore[arg-type]
            ready=lambda: True,
        )
        assert server is not None
        started.append(server.url)
        await stop.wait()
        await server.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    for _ in range(500):
        if started:
            break
        thread.join(0.01)
    assert started, "API server did not start"
    try:
        yield started[0], token
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def where(setup: Setup, api: tuple[str, str] | None) -> list[str]:
    if api is None:
        return ["--config", str(setup.config)]
    return ["--api", api[0], "--token", api[1]]


@pytest.mark.parametrize("via_api", [False, True])
def test_add_ls_show_rotate_rm(
    setup: Setup,
    ca: CA,
    via_api: bool,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = request.getfixturevalue("api_url") if via_api else None
    opts = where(setup, api)
    cert, key = setup.write_cert(ca, "cli.example.test")
    assert run(["cert", "add", *opts, "--cert", str(cert), "--key", str(key), "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["names"] == ["cli.example.test"]
    assert (setup.root / added["id"]).exists()

    assert run(["cert", "add", *opts, "--cert", str(cert), "--key", str(key)]) == 1
    assert "already stored" in capsys.readouterr().err

    assert run(["cert", "ls", *opts]) == 0
    out = capsys.readouterr()
    assert added["id"] in out.out and "cli.example.test" in out.out
    assert "1 certificate" in out.err
    assert run(["cert", "ls", *opts, "--name", "other.example.test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert run(["cert", "ls", *opts, "--expiring-before", "365d", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert run(["cert", "ls", *opts, "--expiring-before", "2000-01-01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert run(["cert", "ls", *opts, "--expiring", "520w", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert run(["cert", "ls", *opts, "--expiring", "1h", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert run(["cert", "ls", *opts, "--expiring", "30 days"]) == 1
    assert "30d (days), 12h (hours), 2w (weeks)" in capsys.readouterr().err

    assert run(["cert", "show", *opts, added["id"]]) == 0
    shown = capsys.readouterr().out
    assert added["fingerprint_sha256"] in shown and "PRIVATE" not in shown

    both = setup.tmp / "both.pem"
    both.write_bytes(combined(*issue(ca, "cli.example.test", "www.cli.example.test")))
    assert run(["cert", "rotate", *opts, added["id"], "--cert", str(both)]) == 0
    assert "rotated" in capsys.readouterr().out

    assert run(["cert", "rm", *opts, added["id"]]) == 0
    assert capsys.readouterr().out.strip() == f"deleted {added['id']}"
    assert run(["cert", "show", *opts, added["id"]]) == 1
    assert "no certificate" in capsys.readouterr().err


@pytest.mark.parametrize("via_api", [False, True])
def test_add_refuses_bad_input_with_its_reason(
    setup: Setup,
    ca: CA,
    via_api: bool,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = request.getfixturevalue("api_url") if via_api else None
    cert, _ = setup.write_cert(ca, "bad.example.test")
    assert run(["cert", "add", *where(setup, api), "--cert", str(cert)]) == 1
    err = capsys.readouterr().err
    assert "no private key" in err
    assert list(setup.root.iterdir()) == []


def test_cert_needs_exactly_one_target(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["cert", "ls"]) == 1
    assert "--config FILE" in capsys.readouterr().err
    assert run(["cert", "ls", "--api", "http://127.0.0.1:9", "--token", ""]) == 1
    assert run(["cert", "ls", "--api", "http://127.0.0.1:9", "--token", "x"]) == 1
    assert "REST API" in capsys.readouterr().err


def test_token_add_and_keys_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "tokens"
    assert main(["token", "add", "deploy", "--file", str(tokens)]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert token.startswith("cat_")
    assert "shown only once" in out.err
    assert token not in tokens.read_text()
    assert main(["token", "add", "deploy", "--file", str(tokens)]) == 1

    assert run(["keys", "generate", "k2"]) == 0
    line = capsys.readouterr().out.strip()
    assert KeyRing.from_text(line).current == "k2"
    assert run(["keys", "generate"]) == 0
    ring = KeyRing.from_text(capsys.readouterr().out)
    assert ring.current == key_fingerprint(ring.keys[0][1])  # the key names itself


def test_keys_rotate_needs_a_key_file(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keys", "rotate", "--config", str(setup.config)]) == 1
    assert "key_file" in capsys.readouterr().err


# --- import -------------------------------------------------------------------------------------


def make_import_dir(ca: CA, directory: Path, count: int, corrupt: tuple[int, ...] = ()) -> None:
    directory.mkdir()
    for i in range(count):
        path = directory / f"h{i:05d}.example.test.pem"
        if i in corrupt:
            path.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n")
        else:
            path.write_bytes(combined(*issue(ca, f"h{i:05d}.example.test", key=shared_key())))


@pytest.mark.parametrize("via_api", [False, True])
def test_import_skips_a_corrupt_file_and_imports_the_rest(
    setup: Setup,
    ca: CA,
    via_api: bool,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = request.getfixturevalue("api_url") if via_api else None
    source = setup.tmp / "import"
    make_import_dir(ca, source, 300, corrupt=(150,))
    (source / "README").write_text("not a certificate")
    assert run(["cert", "import", *where(setup, api), str(source)]) == 1
    out = capsys.readouterr()
    assert "imported 300 of 300 files" in out.out
    assert "299 added, 0 already stored, 1 failed" in out.out
    assert "/s)" in out.out
    assert "skipped h00150.example.test.pem: bad-pem" in out.err
    stored = sorted(p.name for p in setup.root.glob("*.pem"))
    assert len(stored) == 299
    assert "h00150.example.test.pem" not in stored

    # idempotent: a second run finds everything already there
    (source / "h00150.example.test.pem").unlink()
    assert run(["cert", "import", *where(setup, api), str(source)]) == 0
    assert "0 added, 299 already stored, 0 failed" in capsys.readouterr().out


def test_import_reads_certbot_live_layout(
    setup: Setup, ca: CA, capsys: pytest.CaptureFixture[str]
) -> None:
    live = setup.tmp / "letsencrypt" / "live"
    for name in ("a.example.test", "b.example.test"):
        (live / name).mkdir(parents=True)
        chain, key = issue(ca, name, key=shared_key())
        (live / name / "fullchain.pem").write_bytes(chain)
        (live / name / "privkey.pem").write_bytes(key)
    (live / "README").write_text("certbot readme")
    (live / "c.example.test").mkdir()  # no fullchain.pem: not a lineage
    assert run(["cert", "import", "--config", str(setup.config), str(live.parent)]) == 0
    assert "2 added" in capsys.readouterr().out
    assert sorted(p.name for p in setup.root.glob("*.pem")) == [
        "a.example.test.pem",
        "b.example.test.pem",
    ]
    # PATH may be live/ itself
    assert run(["cert", "import", "--config", str(setup.config), str(live)]) == 0
    assert "2 already stored" in capsys.readouterr().out


def test_import_stops_when_the_store_is_gone(
    setup: Setup, ca: CA, capsys: pytest.CaptureFixture[str]
) -> None:
    source = setup.tmp / "import"
    make_import_dir(ca, source, 5)
    setup.root.rmdir()
    assert run(["cert", "import", "--config", str(setup.config), str(source)]) == 1
    out = capsys.readouterr().out
    assert "stopped:" in out


def test_api_tls_options_go_with_an_https_api(
    setup: Setup, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    http = ["cert", "ls", "--api", "http://127.0.0.1:9", "--token", "x"]
    assert run([*http, "--api-ca", str(ca)]) == 1
    assert "for an https:// --api URL" in capsys.readouterr().err
    https = ["cert", "ls", "--api", "https://127.0.0.1:9"]
    assert run([*https, "--api-client-key", str(ca)]) == 1
    assert "--api-client-key goes with --api-client-cert" in capsys.readouterr().err
    assert run([*https, "--api-client-cert", str(tmp_path / "absent.pem")]) == 1
    assert "cannot use --api-client-cert" in capsys.readouterr().err  # no token needed with one
    assert run([*https, "--token", "x", "--api-ca", str(ca)]) == 1
    assert "cannot use --api-ca" in capsys.readouterr().err  # the CA file is no PEM
    assert run(["cert", "ls", "--config", str(setup.config), "--api-ca", str(ca)]) == 1
    assert "go with --api URL" in capsys.readouterr().err
