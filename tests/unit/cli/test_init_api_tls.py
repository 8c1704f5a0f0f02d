"""``certagent init --api-tls-cert --api-tls-key [--api-client-ca]``: checked, then written."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from certagent import config
from certagent.cli.init import InitOptions, init
from certagent.errors import ConfigError


def options(
    tmp_path: Path,
    api_tls_cert: Path | None = None,
    api_tls_key: Path | None = None,
    api_client_ca: Path | None = None,
) -> InitOptions:
    return InitOptions(
        tmp_path / "etc",
        "127.0.0.1:18443",
        f"file://{tmp_path / 'certs'}",
        run_dir=tmp_path / "run",
        api_tls_cert=api_tls_cert,
        api_tls_key=api_tls_key,
        api_client_ca=api_client_ca,
    )


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    cert, key, ca_file = tmp_path / "api.pem", tmp_path / "api.key", tmp_path / "ca.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert, key, ca_file


def test_the_pair_is_written_as_absolute_paths(
    tmp_path: Path, pair: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key, ca_file = pair
    monkeypatch.chdir(tmp_path)
    init(options(tmp_path, api_tls_cert=Path(cert.name), api_tls_key=key, api_client_ca=ca_file))
    settings = config.load(tmp_path / "etc" / "certagent.toml", environ={})
    assert (settings.api_tls_cert, settings.api_tls_key, settings.api_client_ca) == (
        str(cert), str(key), str(ca_file)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"api_tls_cert": "cert"}, "go together"),
        ({"api_client_ca": "ca"}, "needs the API served over TLS"),
        ({"api_tls_cert": "cert", "api_tls_key": "ca"}, "cannot serve the REST API over TLS"),
        ({"api_tls_cert": "cert", "api_tls_key": "key", "api_client_ca": "key"}, "api_client_ca"),
    ],
)
def test_a_refused_option_writes_nothing(
    tmp_path: Path, pair: tuple[Path, Path, Path], given: dict[str, str], match: str
) -> None:
    files = dict(zip(("cert", "key", "ca"), pair, strict=True))
    with pytest.raises(ConfigError, match=match):
        init(options(tmp_path, **{k: files[v] for k, v in given.items()}))
    assert not (tmp_path / "etc").exists()


def test_the_settings_hang_together() -> None:
    with pytest.raises(ConfigError, match="go together"):
        config.Settings(api_tls_key="/k")
    with pytest.raises(ConfigError, match="needs the API served over TLS"):
        config.Settings(api_client_ca="/ca")
