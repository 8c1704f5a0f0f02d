from __future__ import annotations

from pathlib import Path

import pytest

from certagent import config
from certagent.errors import ConfigError


def test_defaults_without_file() -> None:
    s = config.load(None, environ={})
    assert s == config.Settings()


def test_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('capacity = 10\nstore = "redis://127.0.0.1:7000/0"\nnegative_ttl = 5\n')
    s = config.load(f, environ={"CERTAGENT_CAPACITY": "20", "CERTAGENT_HOLD": "0.5"})
    assert s.capacity == 20
    assert s.store == "redis://127.0.0.1:7000/0"
    assert s.negative_ttl == 5.0
    assert s.hold == 0.5


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
        ("hold = 0\n", {}, "hold must be between"),
        ("hold = 61\n", {}, "hold must be between"),
        ("victim_samples = 0\n", {}, "victim_samples"),
        ('map_file = "/etc/certagent/loaded.map"\n', {}, "map_file is no longer a setting.*init"),
        ("load_deadline = 1.0\n", {}, "load_deadline is no longer a setting: renamed hold"),
        ('dir_watch = "inotify"\n', {}, "dir_watch must be one of auto, poll"),
        ("dir_poll_interval = 0\n", {}, "dir_poll_interval must be between"),
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


def test_directory_store_settings_reach_the_store(tmp_path: Path) -> None:
    from certagent.store import DirectoryStore, open_configured

    s = config.load(
        None,
        environ={
            "CERTAGENT_STORE": str(tmp_path),
            "CERTAGENT_DIR_WATCH": "poll",
            "CERTAGENT_DIR_POLL_INTERVAL": "2.5",
        },
    )
    assert (s.dir_watch, s.dir_poll_interval) == ("poll", 2.5)
    store = open_configured(s)
    assert isinstance(store, DirectoryStore)
    assert (store.watch_mode, store.poll_interval) == ("poll", 2.5)
