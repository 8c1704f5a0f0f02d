"""``certagent init --upgrade``: what an upgrade of a generated haproxy.cfg rewrites and keeps."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from certagent.cli import upgrade as upgrade_module
from certagent.cli.upgrade import upgrade
from certagent.errors import ConfigError
from certagent.runtime.cfgmerge import facts, merge, sections

DATA = Path(__file__).resolve().parents[2] / "data" / "upgrade"
OPERATOR_BACKEND = """
backend be_mine
    mode http
    server mine 127.0.0.1:9999
"""


def setup_of_003bece(tmp_path: Path, edits: bool = True) -> Path:
    """The directory 003bece's init wrote, at ``tmp_path`` (paths rewritten), edited by hand."""
    directory = tmp_path / "etc"
    directory.mkdir()
    for name in ("haproxy.cfg", "certagent.toml"):
        text = (DATA / f"003bece-{name}").read_text().replace("/etc/certagent", str(directory))
        (directory / name).write_text(text)
    (directory / "certagent.lua").write_text("-- the Lua action of 003bece\n")
    cfg = directory / "haproxy.cfg"
    if edits:
        text = cfg.read_text()
        text = text.replace(
            "    bind 0.0.0.0:443\n", "    bind 0.0.0.0:443\n    bind [::]:443 v6only\n"
        )
        bufsize = "    tune.bufsize 16384\n"
        text = text.replace(bufsize, bufsize + "    maxconn 5000\n")
        text = text.replace(
            "    default_backend be_app\n",
            "    use_backend be_mine if { ssl_fc_sni -m end .mine.test }\n"
            "    default_backend be_app\n",
        )
        cfg.write_text(text + OPERATOR_BACKEND)
    return directory


@pytest.fixture(autouse=True)
def no_haproxy_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """haproxy -c is the integration tests' (tests/integration/test_rolling_upgrade.py)."""
    monkeypatch.setattr(upgrade_module.shutil, "which", lambda name: None)


def test_an_earlier_setup_gets_this_releases_parts_and_keeps_the_operators(
    tmp_path: Path,
) -> None:
    directory = setup_of_003bece(tmp_path)
    old = (directory / "haproxy.cfg").read_text()
    done = upgrade(directory)
    new = (directory / "haproxy.cfg").read_text()
    assert done.merged is not None
    # this release's global: the Lua per thread on 3.x, the TLS guideline, one connection
    # per thread; the operator's maxconn stays
    assert "lua-load-per-thread" in new and "tune.listener.multi-queue off" in new
    assert "ssl-default-bind-ciphers ECDHE-ECDSA-AES128-GCM-SHA256" in new
    assert "    maxconn 5000\n" in new
    # the operator's addresses, routing and backend
    assert "    bind 0.0.0.0:443\n    bind [::]:443 v6only\n" in new
    assert "use_backend be_mine if { ssl_fc_sni -m end .mine.test }" in new
    assert new.endswith(OPERATOR_BACKEND)
    names = [s.name for s in sections(new)]
    assert names.count("global") == 1 and names.count("frontend fe_tls") == 1
    assert "backend be_mine" in done.merged.kept and "global" in done.merged.rewritten
    assert "global: maxconn 5000" in done.merged.operator_lines
    # the Lua file is certagent's: replaced; both old files kept beside
    assert (directory / "certagent.lua").read_text() == upgrade_module.lua_source()
    assert sorted(p.name.split(".bak-")[0] for p in done.backups) == [
        "certagent.lua",
        "haproxy.cfg",
    ]
    backup = next(p for p in done.backups if p.name.startswith("haproxy.cfg"))
    assert backup.read_text() == old
    assert "+    tune.listener.multi-queue off" in done.diff
    # certagent.toml is the operator's
    assert (directory / "certagent.toml").read_text() == (
        DATA / "003bece-certagent.toml"
    ).read_text().replace("/etc/certagent", str(directory))
    # a second upgrade changes nothing
    again = upgrade(directory)
    assert again.written == [] and again.diff == "" and "up to date" in again.notes[0]


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    directory = setup_of_003bece(tmp_path, edits=False)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    done = upgrade(directory, dry_run=True)
    assert done.diff and done.written == [] and done.backups == []
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_a_directory_init_did_not_write_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"certagent\.toml is missing"):
        upgrade(tmp_path)
    directory = setup_of_003bece(tmp_path, edits=False)
    cfg = directory / "haproxy.cfg"
    cfg.write_text(cfg.read_text().replace("frontend fe_sni", "frontend public"))
    with pytest.raises(ConfigError, match="no `bind` line in `frontend fe_sni`"):
        upgrade(directory)


def test_facts_of_a_file_and_a_merge_of_a_file_with_itself() -> None:
    text = (DATA / "003bece-haproxy.cfg").read_text()
    seen = facts(text)
    assert seen.binds == ("bind 0.0.0.0:443",)
    assert seen.log_target == "stdout format raw" and seen.user is None
    assert seen.default_cert == "/etc/certagent/default.pem" and seen.http_binds == ()
    same = merge(text, text)
    assert same.text == text and same.rewritten == [] and same.operator_lines == []


def test_the_operators_default_backend_wins(tmp_path: Path) -> None:
    directory = setup_of_003bece(tmp_path, edits=False)
    cfg = directory / "haproxy.cfg"
    cfg.write_text(
        cfg.read_text().replace("default_backend be_app", "default_backend be_mine")
        + OPERATOR_BACKEND
    )
    upgrade(directory)
    fe_tls = next(s for s in sections(cfg.read_text()) if s.name == "frontend fe_tls")
    defaults = [line.strip() for line in fe_tls.lines if "default_backend" in line]
    assert defaults == ["default_backend be_mine"]
    shutil.rmtree(directory)


def test_http3_turned_on_in_the_settings_is_rendered_by_an_upgrade(tmp_path: Path) -> None:
    directory = setup_of_003bece(tmp_path)
    toml = directory / "certagent.toml"
    toml.write_text(toml.read_text() + "http3 = true\nhttp3_max_age = 600\n")
    upgrade(directory)
    text = (directory / "haproxy.cfg").read_text()
    assert "    bind quic4@0.0.0.0:443 ssl crt " in text and "alpn h3" in text
    assert "    limited-quic\n" in text and 'ma=600"' in text
    assert "    bind [::]:443 v6only\n" in text  # the operator's second address kept
    again = upgrade(directory)
    assert again.written == [] and again.diff == ""
