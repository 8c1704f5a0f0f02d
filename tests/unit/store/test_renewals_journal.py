"""The directory store's renewal journal (store/directory/_journal.py), on files in tmp_path.

Two Journal objects on one folder stand for two processes (the agent and a CLI
command): a writer that finds the journal changed replays it, a compaction keeps
everyone's entries, and a line cut short is skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from certagent.store.directory._journal import Journal, line_of
from certagent.store.renewals import DueRenewal


def entry(name: str, at: float) -> DueRenewal:
    return DueRenewal(name, at, at + 100)


def test_a_writer_replays_what_another_process_wrote(tmp_path: Path) -> None:
    agent, cli = Journal(tmp_path / "state"), Journal(tmp_path / "state")
    replayed, seen = agent.append(line_of("a.test", entry("a.test", 1)), (0, 0))
    assert replayed is None and seen == agent.signature()
    other, _ = cli.append(line_of("b.test", entry("b.test", 2)), (0, 0))  # stale: replays
    assert other is not None and [e.name for e in other.schedule.entries()] == ["a.test", "b.test"]
    again, seen = agent.append(line_of("a.test", None), seen)
    assert again is not None and again.schedule.entries() == [entry("b.test", 2)]
    assert again.lines == 3 and seen == agent.signature()
    assert agent.read_if_changed(seen) is None
    assert agent.read_if_changed((0, 0)) is not None


def test_compaction_keeps_one_line_per_entry(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    seen = (0, 0)
    for at in range(10):
        _, seen = journal.append(line_of("a.test", entry("a.test", at)), seen)
    _, seen = journal.append(line_of("b.test", entry("b.test", 5)), seen)
    compacted = journal.compact()
    assert compacted.lines == 2 and compacted.signature == journal.signature()
    assert journal.path.read_bytes() == line_of("b.test", entry("b.test", 5)) + line_of(
        "a.test", entry("a.test", 9)
    )
    assert (journal.path.stat().st_mode & 0o777) == 0o600
    _, after = journal.append(line_of("c.test", None), compacted.signature)  # the new file
    assert after == journal.signature() and journal.read().lines == 3


def test_torn_or_foreign_lines_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = Journal(tmp_path)
    journal.path.write_bytes(
        b"S a.test 1 2\nS bad name 1 2\nX b.test\nS c.test 1 x\nD not_a_name!\nS d.test 3"
    )
    with caplog.at_level(logging.WARNING):
        replayed = journal.read()
    assert replayed.schedule.entries() == [DueRenewal("a.test", 1.0, 2.0)]
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 5
    assert Journal(tmp_path / "none").read().lines == 0
