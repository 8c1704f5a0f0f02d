"""`certagent init` writes a setup HAProxy 2.6 accepts as it is."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from agent import config
from agent.cli import main
from agent.errors import ConfigError
from agent.scaffold import InitOptions, init

pytestmark = pytest.mark.integration
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@pytest.mark.parametrize(
    ("fallback", "backend"), [("default-cert", None), ("reject", "127.0.0.1:8080")]
)
def test_generated_config_is_valid_haproxy(
    tmp_path: Path, fallback: str, backend: str | None
) -> None:
    d = tmp_path / "ca"
    settings = init(
        InitOptions(d, "127.0.0.1:18443", str(tmp_path / "certs"), 50, fallback, backend)
    )
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
    assert (d / "loaded.map").read_text() == ""


def test_init_is_rerunnable_and_keeps_default_certificate(tmp_path: Path) -> None:
    opts = InitOptions(tmp_path / "ca", "127.0.0.1:18443", str(tmp_path / "certs"))
    init(opts)
    first = (tmp_path / "ca" / "default.pem").read_bytes()
    init(opts)
    assert (tmp_path / "ca" / "default.pem").read_bytes() == first


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
