"""Releases: the version a node reports has its CHANGELOG section, as every earlier one does."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import certagent

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
SECTION = re.compile(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


def test_the_version_reported_has_a_dated_section_above_the_earlier_ones() -> None:
    sections = SECTION.findall(CHANGELOG.read_text())
    released = [number for number, _ in sections]
    assert certagent.__version__ == version("certagent")
    assert released[0] == certagent.__version__, "the newest section is the version HEAD reports"
    assert "0.2.0" in released
    as_tuples = [tuple(int(part) for part in number.split(".")) for number in released]
    assert as_tuples == sorted(as_tuples, reverse=True), "newest first"
    dates = [day for _, day in sections]
    assert dates == sorted(dates, reverse=True)

