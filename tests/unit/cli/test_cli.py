"""The ``certagent`` command line: parser hygiene and a reader that goes away."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from certagent.cli.commands import _parser
from certagent.testing import PKI, certagent_argv


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("certagent",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_parser_refuses_abbreviations_and_every_option_has_help() -> None:
    seen = 0
    for path, parser in _parsers(_parser()):
        seen += 1
        assert parser.allow_abbrev is False, " ".join(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                assert helped == set(action.choices), (path, set(action.choices) - helped)
            else:
                assert action.help, (" ".join(path), action.option_strings or action.dest)
    assert seen >= 15  # init run check status cert(+6) keys(+2) token(+1) ...


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--conf", "x.toml"],
        ["status", "--conf", "x.toml"],
        ["cert", "ls", "--conf", "x.toml"],
        ["init", "d", "--bin", "127.0.0.1:1", "--store", "/tmp/x"],
    ],
)
def test_an_abbreviated_option_is_an_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --" in err or "arguments are required: --" in err, err


def test_cert_ls_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """``certagent cert ls | head``: the reader is gone before the listing is written."""
    certs = tmp_path / "certs"
    certs.mkdir()
    pki = PKI.create(tmp_path / "ca.pem")
    for i in range(3):
        (certs / f"h{i}.example.test.pem").write_bytes(pki.combined_pem(f"h{i}.example.test"))
    init = subprocess.run(
        [*certagent_argv(), "init", str(tmp_path / "ca"), "--bind", "127.0.0.1:18443",
         "--store", str(certs)],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen(
        [*certagent_argv(), "cert", "ls", "--config", str(tmp_path / "ca" / "certagent.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `head` exiting before certagent prints
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_python_dash_m_certagent_is_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "certagent", "--version"], capture_output=True, timeout=30
    )
    assert out.returncode == 0 and out.stdout.decode().startswith("certagent "), out
