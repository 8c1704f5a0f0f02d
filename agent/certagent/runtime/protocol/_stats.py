"""A frontend's statistics (``show stat``): what fe_tls's QUIC listeners saw."""

from __future__ import annotations

import csv
from dataclasses import dataclass

from certagent.errors import CommandFailed
from certagent.runtime.protocol._framing import Command

#: ``show stat`` type 1: the frontend's own line, no listener or server lines.
_FRONTEND = "1"


@dataclass(frozen=True)
class QuicCounters:
    """Counters of one frontend's QUIC listeners, since HAProxy's worker started.

    ``refused``: CONNECTION_CLOSE frames with a TLS alert that clients sent
    (``quic_transp_err_crypto_error``): the client refused the handshake, for
    certagent almost always the default certificate served for a host that is
    not loaded.  A client may repeat its close in each packet number space
    (aioquic sends it in two), so this counts closes, not connections.
    ``failed``: handshakes HAProxy itself failed (``quic_hdshk_fail``).
    ``connections`` / ``requests``: HTTP/3 sessions and requests (``h3sess``,
    ``h3req``).
    """

    refused: int
    failed: int
    connections: int
    requests: int


def show_frontend_stats(frontend: str) -> Command:
    """``show stat <frontend> 1 -1``: one CSV line of the frontend's counters, O(1)."""
    return Command(("show", "stat", frontend, _FRONTEND, "-1"))


def parse_quic_counters(reply: str) -> QuicCounters | None:
    """The QUIC counters of a ``show stat`` reply; None if the frontend has no QUIC columns.

    CommandFailed for a reply that is not a CSV dump (no such frontend).
    """
    lines = [line for line in reply.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise CommandFailed("show stat", reply)
    rows = list(csv.reader([lines[0][2:], *lines[1:]]))
    header, frontend = rows[0], next((r for r in rows[1:] if r[1:2] == ["FRONTEND"]), None)
    if frontend is None:
        raise CommandFailed("show stat", f"no frontend line in {reply.strip()[:120]!r}")
    values = dict(zip(header, frontend, strict=False))
    if "quic_transp_err_crypto_error" not in values:  # a build without QUIC
        return None

    def number(key: str) -> int:
        text = values.get(key, "")
        return int(text) if text.isdigit() else 0

    return QuicCounters(
        refused=number("quic_transp_err_crypto_error"),
        failed=number("quic_hdshk_fail"),
        connections=number("h3sess"),
        requests=number("h3req"),
    )
