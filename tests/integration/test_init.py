"""`certagent init` writes a setup every HAProxy under test (2.6 to 3.4) accepts as it is."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from certagent import config
from certagent.cli import main
from certagent.cli.init import InitOptions, init
from certagent.errors import ConfigError
from certagent.testing import HAPROXY

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("fallback", "backend"), [("default-cert", None), ("reject", "127.0.0.1:8080")]
)
def test_generated_config_is_valid_haproxy(
    tmp_path: Path, fallback: str, backend: str | None
) -> None:
    d = tmp_path / "ca"
    settings = init(
        InitOptions(d, "127.0.0.1:18443", str(tmp_path / "certs"), 50, fallback, backend)
    ).settings
    check = subprocess.run([HAPROXY, "-c", "-f", str(d / "haproxy.cfg")], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    cfg = (d / "haproxy.cfg").read_text()
    assert f"unix@{d}/run/tls.sock mode 600 accept-proxy" in cfg
    assert "send-proxy-v2" in cfg
    assert "abns@" not in cfg
    assert ("tcp-request content reject if { var(txn.certagent)" in cfg) == (fallback == "reject")
    assert (
        (f"server app {backend}" in cfg) if backend else ("http-request return status 200" in cfg)
    )
    assert config.load(d / "certagent.toml", environ={}) == settings
    assert settings.capacity == 50
    assert settings.store == f"file://{tmp_path / 'certs'}"
    assert stat.S_IMODE((d / "run").stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "default.pem").stat().st_mode) == 0o600
    assert (d / "certagent.crtlist").read_text() == ""
    assert not (d / "loaded.map").exists()
    # hold 5 s: the Lua action waits 6 s, the connection's inspect-delay is 7 s
    assert "tcp-request inspect-delay 7000ms" in cfg
    assert f"lua.certagent_ensure {settings.agent_socket} 6000 if" in cfg
    assert "store gpt0,conn_cnt" in cfg


def test_init_again_refuses_to_overwrite_then_force_keeps_the_secrets(tmp_path: Path) -> None:
    opts = InitOptions(tmp_path / "ca", "127.0.0.1:18443", "redis://127.0.0.1:16379/0")
    init(opts)
    toml = tmp_path / "ca" / "certagent.toml"
    toml.write_text(toml.read_text() + 'api_tokens_file = "/etc/certagent/tokens"\n')  # hand edit
    secrets = {n: (tmp_path / "ca" / n).read_bytes() for n in ("default.pem", "data.key")}
    with pytest.raises(ConfigError, match="pass --force"):
        init(opts)
    assert "api_tokens_file" in toml.read_text()  # the edit survived
    result = init(dataclasses.replace(opts, force=True))
    assert {p.name for p in result.kept} >= {"default.pem", "data.key", "certagent.crtlist"}
    for name, data in secrets.items():
        assert (tmp_path / "ca" / name).read_bytes() == data, name


@pytest.mark.parametrize(
    ("bind", "match"),
    [("8443", "ADDR:PORT"), ("127.0.0.1:0", "ADDR:PORT"), ("example.com:443", "IP address")],
)
def test_bad_bind(tmp_path: Path, bind: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        init(InitOptions(tmp_path / "ca", bind, str(tmp_path)))


def test_socket_path_too_long_says_what_to_do(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    with pytest.raises(ConfigError, match="--run-dir"):
        init(InitOptions(deep, "127.0.0.1:18443", str(tmp_path)))


def test_cli_init_and_error_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "ca"
    assert main(["init", str(d), "--bind", "127.0.0.1:18443", "--store", str(tmp_path)]) == 0
    assert "haproxy -W -db -f" in capsys.readouterr().out
    assert main(["init", str(d), "--bind", "nope", "--store", str(tmp_path)]) == 1
    assert "ADDR:PORT" in capsys.readouterr().err


def test_a_password_never_lands_in_certagent_toml(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    result = init(InitOptions(d, "127.0.0.1:18443", "redis://ops:S3cr%40t@127.0.0.1:16379/0"))
    toml = (d / "certagent.toml").read_text()
    assert "S3cr" not in toml
    assert 'store = "redis://ops@127.0.0.1:16379/0"' in toml
    assert f'store_password_file = "{d / "store.password"}"' in toml
    assert (d / "store.password").read_text() == "S3cr@t\n"
    for secret in ("store.password", "data.key", "default.pem"):
        assert stat.S_IMODE((d / secret).stat().st_mode) == 0o600, secret
    assert stat.S_IMODE((d / "certagent.toml").stat().st_mode) == 0o644
    assert any("store.password" in note for note in result.notes)
    # the agent gets the password back from the file (never logged: describe() hides it)
    from certagent.store import open_configured

    store = open_configured(config.load(d / "certagent.toml", environ={}))
    assert "S3cr" not in store.describe()



@pytest.mark.parametrize(
    ("url", "kept"),
    [
        (
            "redis+sentinel://ops:S3cr%40t@127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
            "redis+sentinel://ops@127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
        ),
        (
            "redis+cluster://:S3cr%40t@127.0.0.1:17000,127.0.0.1:17001",
            "redis+cluster://127.0.0.1:17000,127.0.0.1:17001",
        ),
    ],
)
def test_sentinel_and_cluster_passwords_stay_out_of_certagent_toml(
    tmp_path: Path, url: str, kept: str
) -> None:
    d = tmp_path / "ha"
    init(InitOptions(d, "127.0.0.1:18443", url))
    toml = (d / "certagent.toml").read_text()
    assert "S3cr" not in toml and f'store = "{kept}"' in toml
    assert (d / "store.password").read_text() == "S3cr@t\n"
    from certagent.store import open_configured

    store = open_configured(config.load(d / "certagent.toml", environ={}))
    assert "S3cr" not in store.describe() and "***" in store.describe()

def test_existing_directories_keep_their_mode(tmp_path: Path) -> None:
    certbot = tmp_path / "letsencrypt"
    certbot.mkdir(mode=0o755)
    os.chmod(certbot, 0o755)
    d = tmp_path / "ca"
    init(InitOptions(d, "127.0.0.1:18443", str(certbot)))
    assert stat.S_IMODE(certbot.stat().st_mode) == 0o755
    assert stat.S_IMODE((d / "run").stat().st_mode) == 0o700  # made by init


@pytest.mark.parametrize(
    ("store", "match"),
    [
        ("127.0.0.1:6380", "did you mean redis://127.0.0.1:6380/0"),
        ("http://127.0.0.1:8080/certs", "unsupported store URL scheme 'http'"),
        ("file://relative/path", "absolute path"),
    ],
)
def test_a_refused_argument_leaves_nothing_behind(
    tmp_path: Path, store: str, match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "ca"
    assert main(["init", str(d), "--bind", "127.0.0.1:18443", "--store", store]) == 1
    assert match in capsys.readouterr().err
    assert not d.exists()
    assert main(["init", str(d), "--bind", "127.0.0.1:1", "--store", str(tmp_path / "s"),
                 "--capacity", "0"]) == 1  # fmt: skip
    assert not d.exists() and not (tmp_path / "s").exists()


def test_a_node_joins_a_fleet_with_its_data_key(tmp_path: Path) -> None:
    first = init(InitOptions(tmp_path / "a", "127.0.0.1:18443", "redis://127.0.0.1:16379/0"))
    assert first.data_key is not None and re.fullmatch(r"k[0-9a-f]{12}", first.data_key)
    joined = init(
        InitOptions(
            tmp_path / "b",
            "127.0.0.1:18444",
            "redis://127.0.0.1:16379/0",
            data_key=tmp_path / "a" / "data.key",
        )
    )
    assert joined.data_key == first.data_key
    assert (tmp_path / "b" / "data.key").read_bytes() == (tmp_path / "a" / "data.key").read_bytes()
    # a node that already has another key is never overwritten
    other = init(InitOptions(tmp_path / "c", "127.0.0.1:18445", "redis://127.0.0.1:16379/0"))
    assert other.data_key != first.data_key
    with pytest.raises(ConfigError, match="never overwritten"):
        init(
            InitOptions(
                tmp_path / "c",
                "127.0.0.1:18445",
                "redis://127.0.0.1:16379/0",
                data_key=tmp_path / "a" / "data.key",
                force=True,
            )
        )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_units_verify(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    init(
        InitOptions(
            d,
            "127.0.0.1:18443",
            "redis://127.0.0.1:16379/0",
            run_dir=tmp_path / "run",
            systemd=True,
            user="root",
        )
    )
    unit = d / "systemd" / "certagent.service"
    text = unit.read_text()
    for line in ("Type=notify", "User=root", "ExecReload=/bin/kill -HUP $MAINPID",
                 "After=network-online.target haproxy.service", "ProtectSystem=strict",
                 "NoNewPrivileges=yes", "PrivateTmp=yes"):  # fmt: skip
        assert line in text, line
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True
    )
    problems = [line for line in verify.stderr.splitlines() if "certagent.service" in line]
    assert verify.returncode == 0 and problems == [], verify.stderr
    dropin = (d / "systemd" / "haproxy.service.d" / "certagent.conf").read_text()
    assert f"CONFIG={d / 'haproxy.cfg'}" in dropin and "-S /run/haproxy-master.sock" in dropin
    cfg = (d / "haproxy.cfg").read_text()
    assert "    user root\n    group root\n" in cfg
    assert "admin.sock mode 600 user root group root level admin" in cfg
    check = subprocess.run([HAPROXY, "-c", "-f", str(d / "haproxy.cfg")], capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    toml = (d / "certagent.toml").read_text()
    assert 'haproxy_master_socket = "/run/haproxy-master.sock"' in toml
