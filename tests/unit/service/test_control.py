"""The agent's unix socket: one line in, one answer out, the answer of any length."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

from certagent.cli.agentsocket import ask
from certagent.service.control import ControlServer
from certagent.service.ensure import Ensurer


async def test_status_slots_answers_in_full_whatever_the_slot_count(tmp_path: Path) -> None:
    slots = [
        {"slot": f"s{i}", "certificate": f"c{i}", "hosts": [f"h{i}.example.test"]}
        for i in range(50_000)
    ]

    async def status(with_slots: bool) -> dict[str, Any]:
        return {"agent_pid": 1, **({"slots": slots} if with_slots else {})}

    server = ControlServer(str(tmp_path / "agent.sock"), cast(Ensurer, None), status)
    await server.start()
    try:
        assert await ask(server.path, b"status") == {"agent_pid": 1}
        answer = await ask(server.path, b"status slots")
        assert answer["slots"] == slots
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(b"status slots\n")
        raw = await reader.read()  # the old framing, unchanged: one line, then EOF
        writer.close()
        assert raw.count(b"\n") == 1 and raw.endswith(b"\n") and len(raw) > 3_000_000
        assert json.loads(raw)["slots"] == slots
    finally:
        await server.close()
