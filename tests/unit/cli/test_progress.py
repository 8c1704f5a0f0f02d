"""``cert import`` progress: a bar on a terminal (pty), sparse plain lines anywhere else."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from certagent.cli.importer import ImportResult
from certagent.cli.progress import LINE_INTERVAL, TTY_INTERVAL, Progress
from certagent.config import Settings, to_toml
from certagent.errors import PemError
from certagent.testing import certagent_argv
from certagent.testing.certs import combined, issue, make_ca, shared_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def simulate(progress: Progress, clock: Clock, total: int, seconds: float) -> ImportResult:
    """``total`` files done evenly over ``seconds``, one update per file."""
    result = ImportResult(total=total)
    progress.begin(result)
    for _ in range(total):
        clock.now += seconds / total
        result.added += 1
        progress.update()
    progress.finish()
    return result


def test_plain_lines_at_most_every_few_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    simulate(Progress(out, tty=False, clock=clock), clock, total=20_000, seconds=22.0)
    lines = out.getvalue().splitlines()
    assert LINE_INTERVAL == 5.0
    assert len(lines) == 4  # at 5, 10, 15 and 20 s; the summary is the caller's
    assert "\r" not in out.getvalue() and "\033" not in out.getvalue()
    assert lines[0].startswith("import: 4546/20000 files (22%), 4546 added, 0 already stored,")
    assert re.fullmatch(r".*, 909/s, ETA 0:17", lines[0]), lines[0]


def test_a_short_import_writes_no_progress_line() -> None:
    out, clock = io.StringIO(), Clock()
    simulate(Progress(out, tty=False, clock=clock), clock, total=300, seconds=1.0)
    assert out.getvalue() == ""


def test_bar_redrawn_at_most_ten_times_a_second() -> None:
    out, clock = io.StringIO(), Clock()
    simulate(Progress(out, tty=True, clock=clock), clock, total=50_000, seconds=3.0)
    text = out.getvalue()
    frames = text.split("\r")[1:]
    assert TTY_INTERVAL == 0.1
    assert 25 <= len(frames) <= 32  # 3 s at 10 a second, and the final one
    assert all(frame.endswith("\033[K") for frame in frames[:-1])
    assert frames[-1] == "[########################] 50000/50000 100%  16667/s  ETA 0:00\033[K\n"
    middle = frames[len(frames) // 2]
    assert re.match(r"\[#{11,13}\.{11,13}\] \d+/50000  \d\d%  1666\d/s  ETA 0:0\d", middle)


def test_a_refused_file_is_reported_under_the_bar() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=True, clock=clock)
    result = ImportResult(total=4)
    progress.begin(result)
    clock.now += 1
    result.added = 1
    progress.update()
    result.failed = 1
    progress.report("bad.pem", PemError("no CERTIFICATE block found"))
    progress.update()  # drawn again at once, with the failure counted
    frames = out.getvalue().split("\r")
    assert frames[2] == "\033[Kskipped bad.pem: bad-pem: no CERTIFICATE block found\n"
    assert frames[3].startswith("[############............] 2/4  50%") and "1 failed" in frames[3]


def test_eta_and_narrow_terminals() -> None:
    progress, clock = Progress(io.StringIO(), tty=True, clock=Clock()), Clock()
    result = ImportResult(total=100_000)
    progress.clock = clock
    progress.begin(result)
    assert progress.bar(clock.now).endswith("0/100000   0%  0/s  ETA --:--")
    clock.now += 10
    result.added = 1000
    assert progress.bar(clock.now).endswith("ETA 16:30")
    result.added = 10
    assert progress.bar(clock.now).endswith("ETA 27:46:30")
    assert len(progress.bar(clock.now, columns=30)) == 29


def test_nothing_without_an_output() -> None:
    progress = Progress(None)
    progress.begin(ImportResult(total=1))
    progress.update()
    progress.report("x", PemError("x"))
    progress.finish()


# --- the real command: stderr on a pseudo-terminal, then on a pipe -----------------------------


@pytest.fixture
def import_setup(tmp_path: Path) -> tuple[Path, Path]:
    """A directory store's certagent.toml and a directory of 40 combined PEM files."""
    ca = make_ca()
    store, source = tmp_path / "store", tmp_path / "import"
    store.mkdir()
    source.mkdir()
    for i in range(40):
        name = f"p{i:02d}.progress.test"
        (source / f"{name}.pem").write_bytes(combined(*issue(ca, name, key=shared_key())))
    cfg = tmp_path / "certagent.toml"
    cfg.write_text(to_toml(Settings(store=str(store))))
    return cfg, source


def test_a_terminal_gets_the_bar(import_setup: tuple[Path, Path]) -> None:
    cfg, source = import_setup
    primary, secondary = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(
        [*certagent_argv(), "cert", "import", "--config", str(cfg), str(source)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=secondary,
    )  # fmt: skip
    os.close(secondary)
    seen = bytearray()
    while True:  # read the terminal until the command closes it
        ready, _, _ = select.select([primary], [], [], 30)
        assert ready, "no output from certagent for 30 s"
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(primary)
    assert proc.stdout is not None
    with proc.stdout:
        summary = proc.stdout.read().decode()
    assert proc.wait(30) == 0
    elapsed = time.monotonic() - start
    terminal = seen.decode().replace("\r\n", "\n")  # the terminal's own newline translation
    frames = terminal.split("\r")[1:]
    assert frames, terminal
    assert len(frames) <= 10 * elapsed + 2
    assert frames[-1].startswith("[########################] 40/40 100%  ")
    assert "ETA 0:00" in frames[-1] and frames[-1].endswith("\033[K\n")
    assert summary.startswith("imported 40 of 40 files in ")


def test_a_pipe_gets_no_bar_only_the_summary(import_setup: tuple[Path, Path]) -> None:
    cfg, source = import_setup
    done = subprocess.run(
        [*certagent_argv(), "cert", "import", "--config", str(cfg), str(source)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\033" not in done.stderr
    assert done.stderr == ""  # well under LINE_INTERVAL: no progress line at all
    assert done.stdout.startswith("imported 40 of 40 files in ")
