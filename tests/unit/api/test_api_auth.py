"""Tokens file, bearer parsing, the error -> status map, and the API settings."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from certagent import config, errors
from certagent.api.auth import (
    TOKEN_PREFIX,
    TokenFile,
    add_token,
    bearer_token,
    hash_token,
    parse_tokens,
)
from certagent.api.problems import (
    TITLES,
    AlreadyStored,
    BadRequest,
    BadToken,
    MissingToken,
    problem_for,
)
from certagent.certs.validate import UPLOAD_ERRORS


def test_add_token_prints_once_and_stores_only_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "deploy")
    assert token.startswith(TOKEN_PREFIX) and len(token) > 40
    text = path.read_text()
    assert token not in text
    assert f"deploy:{hash_token(token)}" in text.splitlines()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = add_token(path, "ci")
    assert second != token
    assert [e.name for e in parse_tokens(path.read_text())] == ["deploy", "ci"]
    with pytest.raises(errors.ConfigError, match="already has a token named 'ci'"):
        add_token(path, "ci")
    with pytest.raises(errors.ConfigError, match="token name"):
        add_token(path, "bad name")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("deploy\n", "line 1: expected name:sha256hex"),
        ("# c\n\nx:" + "a" * 63 + "\n", "line 3: the hash of token 'x'"),
        ("x:" + "a" * 64 + "\nx:" + "b" * 64 + "\n", "appears twice"),
        ("cat_secret:abc\n", "64 hex digits"),
    ],
)
def test_malformed_tokens_file(text: str, match: str) -> None:
    with pytest.raises(errors.ConfigError, match=match) as info:
        parse_tokens(text)
    assert "aaaa" not in str(info.value)


def test_token_file_reloads_on_change(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "tokens"
    first = add_token(path, "first")
    tokens = TokenFile.load(path)
    assert tokens.match(first) == "first"
    assert tokens.match(first + "x") is None
    assert tokens.match("") is None

    second = add_token(path, "second")
    assert tokens.match(second) == "second"

    good = path.read_text()
    path.write_text(good + "garbage line\n")  # half-edited: keep what we had
    assert tokens.match(second) == "second"
    assert "keeping the 2 tokens" in caplog.text

    path.write_text("".join(ln for ln in good.splitlines(True) if not ln.startswith("first:")))
    assert tokens.match(first) is None
    assert tokens.match(second) == "second"

    path.unlink()
    assert tokens.match(second) is None


def test_token_file_must_exist_at_start(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="certagent token add"):
        TokenFile.load(tmp_path / "absent")


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic abc", None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (errors.PemError("x"), 400, "bad-pem"),
        (errors.BundleTooLarge("x"), 413, "too-large"),
        (errors.EncryptedKey("x"), 422, "encrypted-key"),
        (errors.MultipleKeys("x"), 422, "multiple-keys"),
        (errors.KeyMismatch("x"), 422, "key-mismatch"),
        (errors.DuplicateCertificate("x"), 422, "duplicate-certificate"),
        (AlreadyStored("x"), 409, "duplicate-certificate"),
        (errors.NotFound("x"), 404, "not-found"),
        (errors.InvalidCursor("x"), 400, "invalid-cursor"),
        (errors.ReadOnlyRecord("x"), 409, "read-only-record"),
        (errors.InvalidHostname("x"), 400, "invalid-hostname"),
        (errors.StoreUnavailable("x"), 503, "store-unavailable"),
        (errors.KeyDecryptError("x"), 500, "store-error"),
        (errors.HAProxyUnavailable("x"), 503, "haproxy-unavailable"),
        (errors.ConfigError("x"), 500, "config-error"),
        (errors.Busy("secret"), 500, "internal-error"),
        (BadRequest("x"), 400, "bad-request"),
        (MissingToken("x"), 401, "missing-token"),
        (BadToken("x"), 403, "bad-token"),
    ],
)
def test_one_map_from_errors_to_problems(exc: errors.AgentError, status: int, code: str) -> None:
    problem = problem_for(exc)
    assert (problem.status, problem.code) == (status, code)
    body = problem.to_json()
    assert body["type"] == f"urn:certagent:problem:{code}"
    assert body["title"] == TITLES[code]
    assert "secret" not in str(body)
    assert ("WWW-Authenticate" in problem.headers) == (code == "missing-token")


@pytest.mark.parametrize("error", UPLOAD_ERRORS)
def test_every_upload_error_is_4xx_with_its_code(error: type[errors.CertificateError]) -> None:
    problem = problem_for(error("what to do"))
    assert 400 <= problem.status < 500
    assert problem.code == error.code
    assert problem.detail == "what to do"
    assert problem.code in TITLES


def test_api_settings_defaults_env_and_validation(tmp_path: Path) -> None:
    s = config.Settings()
    assert (s.api_bind, s.api_tokens_file, s.key_file) == ("127.0.0.1:8089", "", "")
    assert (s.max_upload_bytes, s.max_chain, s.min_rsa_bits) == (262_144, 6, 2048)
    f = tmp_path / "c.toml"
    f.write_text('api_bind = "[::1]:9000"\nnot_before_grace = 300\nmax_chain = 3\n')
    s = config.load(f, environ={"CERTAGENT_API_TOKENS_FILE": "/etc/certagent/tokens"})
    assert config.parse_bind(s.api_bind) == ("::1", 9000)
    assert s.not_before_grace == 300.0
    assert s.api_tokens_file == "/etc/certagent/tokens"
    assert s.max_chain == 3
    for text, match in [
        ('api_bind = "8089"\n', "api_bind"),
        ('api_bind = "localhost:99999"\n', "api_bind"),
        ("max_upload_bytes = 10\n", "max_upload_bytes"),
        ("max_chain = 0\n", "max_chain"),
        ("min_rsa_bits = 512\n", "min_rsa_bits"),
        ("expiry_grace = -1\n", "expiry_grace"),
    ]:
        f.write_text(text)
        with pytest.raises(errors.ConfigError, match=match):
            config.load(f, environ={})
