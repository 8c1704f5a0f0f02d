"""Draws docs/flow.svg, the README's picture of a first connection: ``python docs/flow.py``.

Plain SVG from this source (no drawing tool needed); tests/unit/test_docs_flow.py
checks that the committed picture is what this script draws.
"""

from __future__ import annotations

import sys
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_name("flow.svg")

W, H = 900, 430
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"

# (x, y, width, height, title, lines, fill)
BOXES = {
    "client": (20, 170, 120, 70, "TLS client", ["ClientHello", "SNI shop.example"], "#f3f3f3"),
    "fe_sni": (200, 140, 190, 130, "HAProxy fe_sni", ["mode tcp, peeks the SNI", "marked loaded? go on",
                                                      "else: Lua asks the agent", "(held up to 5 s)"], "#e8f1fb"),
    "fe_tls": (470, 40, 190, 100, "HAProxy fe_tls", ["terminates TLS", "crt-list of K slots",
                                                     "session tickets"], "#e8f1fb"),
    "app": (740, 55, 130, 70, "your backend", ["decrypted HTTP"], "#f3f3f3"),
    "agent": (470, 230, 190, 130, "certagent", ["validates the SNI", "Bloom filter, lookup",
                                               "one runtime-API writer", "recycles the LRU slot"],
              "#fdf1e3"),
    "store": (740, 250, 130, 90, "store", ["Redis (Sentinel,", "Cluster) or a", "PEM directory"],
              "#eef7ea"),
}  # fmt: skip

# (from, to, label, (dx, dy) of the label from the line's middle, text-anchor)
ARROWS = [
    ("client", "fe_sni", "1 connect", (0, -4), "middle"),
    ("fe_sni", "agent", "2 ensure shop.example", (10, 40), "end"),
    ("agent", "store", "3 lookup", (0, -4), "middle"),
    ("agent", "fe_tls", "4 set ssl cert, commit,\nadd crt-list, mark", (10, 0), "start"),
    ("fe_sni", "fe_tls", "5 hop (unix socket)", (-12, -12), "end"),
    ("fe_tls", "app", "6 request", (0, -4), "middle"),
]


def _center(name: str) -> tuple[float, float]:
    x, y, w, h, *_ = BOXES[name]
    return x + w / 2, y + h / 2


def _edge(name: str, toward: tuple[float, float]) -> tuple[float, float]:
    """Where the line from the box's centre toward ``toward`` leaves the box."""
    x, y, w, h, *_ = BOXES[name]
    cx, cy = _center(name)
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min(
        (w / 2) / abs(dx) if dx else float("inf"), (h / 2) / abs(dy) if dy else float("inf")
    )
    return cx + dx * scale, cy + dy * scale


def _box(name: str) -> list[str]:
    x, y, w, h, title, lines, fill = BOXES[name]
    out = [
        f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='8' fill='{fill}' stroke='#555'/>",
        f"<text x='{x + w / 2}' y='{y + 20}' text-anchor='middle' {FONT} font-size='14'"
        f" font-weight='bold'>{escape(title)}</text>",
    ]
    for i, line in enumerate(lines):
        out.append(
            f"<text x='{x + w / 2}' y='{y + 40 + 17 * i}' text-anchor='middle' {FONT}"
            f" font-size='12'>{escape(line)}</text>"
        )
    return out


def _arrow(
    start: str, end: str, label: str, offset: tuple[int, int], anchor: str
) -> list[str]:
    a = _edge(start, _center(end))
    b = _edge(end, _center(start))
    out = [
        f"<line x1='{a[0]:.1f}' y1='{a[1]:.1f}' x2='{b[0]:.1f}' y2='{b[1]:.1f}' stroke='#333'"
        " stroke-width='1.6' marker-end='url(#head)'/>"
    ]
    mx, my = (a[0] + b[0]) / 2 + offset[0], (a[1] + b[1]) / 2 + offset[1]
    for i, line in enumerate(label.split("\n")):
        out.append(
            f"<text x='{mx:.1f}' y='{my - 6 + 14 * i:.1f}' text-anchor='{anchor}' {FONT}"
            f" font-size='11' fill='#1a4d8f'>{escape(line)}</text>"
        )
    return out


def draw() -> str:
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}'"
        f" viewBox='0 0 {W} {H}'>",
        "<defs><marker id='head' markerWidth='10' markerHeight='8' refX='9' refY='4'"
        " orient='auto'><path d='M0,0 L10,4 L0,8 z' fill='#333'/></marker></defs>",
        f"<rect width='{W}' height='{H}' fill='white'/>",
    ]
    for name in BOXES:
        parts += _box(name)
    for start, end, label, offset, anchor in ARROWS:
        parts += _arrow(start, end, label, offset, anchor)
    notes = [
        "Later connections to shop.example: marked loaded in fe_sni's stick table, straight to"
        " fe_tls (no agent).",
        "Every agent of a fleet follows the store's change feed: uploads, rotations and deletes"
        " apply live, no reload.",
    ]
    for i, note in enumerate(notes):
        parts.append(
            f"<text x='20' y='{H - 40 + 18 * i}' {FONT} font-size='12' fill='#444'>"
            f"{escape(note)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    OUT.write_text(draw())
    sys.stdout.write(f"wrote {OUT}\n")
