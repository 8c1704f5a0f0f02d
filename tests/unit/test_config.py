from __future__ import annotations

from pathlib import Path

import pytest

from agent import config
from agent.errors import ConfigError


def test_defaults_without_file() -> None:
    s = config.load(None, environ={})
    assert s == config.Settings()


def test_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('capacity = 10\nstore = "redis://127.0.0.1:7000/0"\nnegative_ttl = 5\n')
    s = config.load(f, environ={"CERTAGENT_CAPACITY": "20", "CERTAGENT_LOAD_DEADLINE": "0.5"})
    assert s.capacity == 20
    assert s.store == "redis://127.0.0.1:7000/0"
    assert s.negative_ttl == 5.0
    assert s.load_deadline == 0.5


def test_round_trip_through_toml(tmp_path: Path) -> None:
    s = config.Settings(capacity=7, fallback="reject", agent_socket='/tmp/we"ird.sock')
    f = tmp_path / "c.toml"
    f.write_text(config.to_toml(s))
    assert config.load(f, environ={}) == s


@pytest.mark.parametrize(
    ("text", "env", "match"),
    [
        ("capacity = 0\n", {}, "capacity"),
        ('fallback = "drop"\n', {}, "fallback"),
        ("nope = 1\n", {}, "unknown key 'nope'"),
        ('capacity = "many"\n', {}, "capacity must be a int"),
        ("", {"CERTAGENT_CAPACITY": "lots"}, "CERTAGENT_CAPACITY"),
        ("capacity = [\n", {}, "cannot read"),
        ('slot_prefix = "/x/slot.crt"\n', {}, "slot_prefix"),
        ("haproxy_bufsize = 100\n", {}, "haproxy_bufsize"),
    ],
)
def test_errors_say_what_is_wrong(
    tmp_path: Path, text: str, env: dict[str, str], match: str
) -> None:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        config.load(f, environ=env)


def test_missing_file_points_to_init(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="certagent init"):
        config.load(tmp_path / "absent.toml", environ={})
