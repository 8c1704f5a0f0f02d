"""Every relative link in the README, CHANGELOG and docs/ resolves: the file, and its #anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors (lowercase, punctuation dropped, spaces as hyphens) and
    explicit ``<a id="...">`` ones."""
    text = CODE.sub("", path.read_text())
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            found.add(title.replace(" ", "-"))
    return found


def _links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(CODE.sub("", path.read_text()))
        if not re.match(r"[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        ):
            broken.append(target)
    assert broken == []


def test_the_docs_have_links_to_check() -> None:
    assert len(DOCS) >= 6
    assert sum(len(_links(d)) for d in DOCS) > 20
