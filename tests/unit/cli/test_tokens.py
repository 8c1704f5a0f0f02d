"""``certagent token add | ls | rm``: the tokens file edited in place, never a secret printed."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from certagent import errors
from certagent.api.auth import (
    TokenFile,
    add_token,
    hash_token,
    parse_tokens,
    register_token,
    remove_token,
    token_names,
)
from certagent.cli import main

SECRET = "s3cret-from-a-docker-secret-0123456789"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ls_prints_what_each_token_may_do_never_a_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens"
    tokens = [add_token(path, name) for name in ("deploy", "ci", "ops@example.org")]
    code, out, err = run(
        ["token", "add", "panel", "--file", str(path), "--scope", "domains", "--scope", "read",
         "--names", "*.customer.test", "--names", ".example.com", "--expires", "30d",
         "--rate", "5/s"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    tokens.append(out.strip())
    assert "domains on *.customer.test,.example.com, until " in err and "5/s" in err
    code, out, err = run(
        ["token", "add", "ci-cert", "--file", str(path), "--client-subject", "CN=ci job,O=Ex"],
        capsys,
    )
    assert (code, out) == (0, "")  # no token made, none printed
    code, out, err = run(["token", "ls", "--file", str(path)], capsys)
    lines = out.splitlines()
    assert code == 0 and [line.split("  ")[0] for line in lines] == [
        "deploy", "ci", "ops@example.org", "panel", "ci-cert"
    ]  # fmt: skip
    assert lines[0] == "deploy  admin  *  never  -  -"
    fields = lines[3].split("  ")
    assert fields[:3] == ["panel", "read,domains", "*.customer.test,.example.com"]
    assert fields[3].endswith("Z") and fields[4:] == ["5/s", "-"]
    assert lines[4] == "ci-cert  admin  *  never  -  CN=ci job,O=Ex"
    code, out, err = run(["token", "ls", "--file", str(path), "--json"], capsys)
    listed = [json.loads(line) for line in out.splitlines()]
    assert listed[3]["names"] == ["*.customer.test", ".example.com"]
    assert (listed[3]["token"], listed[4]["token"], listed[4]["expired"]) == (True, False, False)
    for token in tokens:
        assert token not in out + err
        assert hash_token(token) not in out + err
    code, out, err = run(["token", "ls", "--file", str(tmp_path / "absent")], capsys)
    assert (code, out) == (1, "")
    assert "does not exist" in err and "token add" in err


def test_rm_rewrites_atomically_keeping_mode_owner_and_comments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens"
    keep = add_token(path, "keep")
    gone = add_token(path, "gone")
    with path.open("a") as handle:
        handle.write("# a comment the operator wrote\nlast:" + "a" * 64 + "  # trailing\n")
    before = path.stat()
    text = path.read_text()
    code, out, err = run(["token", "rm", "gone", "--file", str(path)], capsys)
    assert code == 0, err
    after = path.stat()
    assert after.st_ino != before.st_ino  # a new file renamed over the old one
    assert stat.S_IMODE(after.st_mode) == 0o600
    assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
    assert path.read_text() == "".join(
        line for line in text.splitlines(True) if not line.startswith("gone:")
    )
    assert token_names(path) == ("keep", "last")
    assert gone not in out + err and hash_token(keep) not in out + err
    assert "next request" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]  # no temporary file left


def test_rm_of_an_unknown_name_exits_1_and_leaves_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tokens"
    add_token(path, "keep")
    text, ino = path.read_text(), path.stat().st_ino
    code, out, err = run(["token", "rm", "nobody", "--file", str(path)], capsys)
    assert (code, out) == (1, "")
    assert "has no token named 'nobody'" in err and "token ls --file" in err
    assert (path.read_text(), path.stat().st_ino) == (text, ino)
    assert run(["token", "rm", "x", "--file", str(tmp_path / "absent")], capsys)[0] == 1
    assert not (tmp_path / "absent").exists()


def test_rm_keeps_another_mode(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    add_token(path, "a")
    add_token(path, "b")
    path.chmod(0o640)
    remove_token(path, "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert token_names(path) == ("b",)


def test_a_removed_token_is_refused_at_once_by_a_running_file(tmp_path: Path) -> None:
    """What the agent checks per request: same size, same second, but a new inode."""
    path = tmp_path / "tokens"
    one = add_token(path, "one")
    two = add_token(path, "two")
    accepted = TokenFile.load(path)
    assert accepted.match(one) == "one"
    remove_token(path, "one")
    register_token(path, "one", SECRET)  # a line of the same length: same size as before
    assert accepted.match(one) is None
    assert accepted.match(SECRET) == "one"
    assert accepted.match(two) == "two"


def test_add_from_file_registers_the_hash_and_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, secret = tmp_path / "tokens", tmp_path / "api_token"
    secret.write_text(SECRET + "\n")
    argv = ["token", "add", "docker", "--file", str(path), "--from-file", str(secret)]
    code, out, err = run(argv, capsys)
    assert (code, out) == (0, "")
    assert "token 'docker' added" in err
    assert parse_tokens(path.read_text())[0].sha256 == hash_token(SECRET)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TokenFile.load(path).match(SECRET) == "docker"
    # again: refused without --replace; with it, nothing changes for the same token
    assert run(argv, capsys)[0] == 1
    code, _, err = run([*argv, "--replace"], capsys)
    assert code == 0 and "unchanged" in err
    secret.write_text("another-secret-of-enough-length\n")
    code, _, err = run([*argv, "--replace"], capsys)
    assert code == 0 and "replaced" in err
    tokens = TokenFile.load(path)
    assert tokens.match(SECRET) is None
    assert tokens.match("another-secret-of-enough-length") == "docker"
    assert SECRET not in path.read_text() + out + err


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"tiny\n", "16-512 printable"),
        (b"has a blank in the middle of it\n", "without spaces"),
        (b"line-one-of-the-secret\nline-two-of-the-secret\n", "holds 2 lines"),
        (b"", "holds 0 lines"),
        (b"\xff" * 20, "not ASCII"),
    ],
)
def test_add_from_file_refuses_a_bad_secret_without_showing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, match: str
) -> None:
    secret = tmp_path / "api_token"
    secret.write_bytes(content)
    code, out, err = run(
        ["token", "add", "x", "--file", str(tmp_path / "tokens"), "--from-file", str(secret)],
        capsys,
    )
    assert (code, out) == (1, "")
    assert match in err
    for part in ("tiny", "blank", "line-one", "middle"):
        assert part not in err
    assert not (tmp_path / "tokens").exists() or token_names(tmp_path / "tokens") == ()


def test_add_from_an_unreadable_file_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["token", "add", "x", "--file", str(tmp_path / "tokens")]
    code, _, err = run([*argv, "--from-file", str(tmp_path / "absent")], capsys)
    assert code == 1 and "cannot read the token file" in err
    code, _, err = run([*argv, "--replace"], capsys)
    assert code == 1 and "--replace goes with --from-file" in err


def test_concurrent_edits_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    for i in range(20):
        add_token(path, f"old{i}")
    errors_seen: list[BaseException] = []

    def adder() -> None:
        try:
            for i in range(20):
                add_token(path, f"new{i}")
        except BaseException as exc:  # reported below
            errors_seen.append(exc)

    thread = threading.Thread(target=adder)
    thread.start()
    for i in range(20):
        remove_token(path, f"old{i}")
    thread.join()
    assert errors_seen == []
    assert token_names(path) == tuple(f"new{i}" for i in range(20))


def test_a_malformed_file_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("broken line\n")
    os.chmod(path, 0o600)
    with pytest.raises(errors.ConfigError, match="line 1"):
        remove_token(path, "broken")
    with pytest.raises(errors.ConfigError, match="line 1"):
        register_token(path, "x", SECRET)
    assert path.read_text() == "broken line\n"
