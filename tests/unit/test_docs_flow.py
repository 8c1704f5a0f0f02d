"""The README's picture is what docs/flow.py draws (edit the script, then run it)."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_committed_picture_is_drawn_from_its_source() -> None:
    spec = importlib.util.spec_from_file_location("flow", DOCS / "flow.py")
    assert spec is not None and spec.loader is not None
    flow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flow)
    drawn = flow.draw()
    assert (DOCS / "flow.svg").read_text() == drawn, "run: python docs/flow.py"
    ET.fromstring(drawn)  # well-formed SVG
    readme = (DOCS.parent / "README.md").read_text()
    assert "](docs/flow.svg)" in readme
