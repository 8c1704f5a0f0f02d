"""``python -m bench.api_tls`` at one repeat: every figure measured, the report made."""

from __future__ import annotations

from pathlib import Path

from bench.api_tls import markdown, measure
from certagent.runtime.tlspolicy import CURVES, PQ_CURVES


def test_one_repeat_measures_every_figure(tmp_path: Path) -> None:
    figures = measure(1, tmp_path)
    assert figures["groups"] in (CURVES, PQ_CURVES)  # the hybrid first on OpenSSL 3.5+
    for name in ("check_us", "handshake_server_ms", "audit_line_us"):
        assert 0 < figures[name]["min"] <= figures[name]["median"] <= figures[name]["max"]
    assert 0 < figures["check_share_of_handshake"] < 1
    lines = (tmp_path / "audit.log").read_text().splitlines()
    assert len(lines) == 5_000 and lines[0].startswith('{"audit": true')
    meta = {
        "date": "2026-01-01T00:00:00Z",
        "revision": "abc",
        "machine": {"nproc": 2, "cpu_model": "x"},
    }
    report = markdown({"meta": meta, "repeats": 1, "figures": figures})
    assert "| check_us |" in report and "X25519" in report
