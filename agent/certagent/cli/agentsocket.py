"""Asking the running agent over its unix socket (``status``, ``check``, ``tls-keys``).

The socket's protocol (service/control.py): one request line in; the answer is
one line of JSON, ended by ``\\n``, after which the agent closes the
connection. The end of the connection frames the answer, so nothing bounds its
length: ``status slots`` grows with the slot count K (≈175 bytes a slot, 17.5 MB
at K = 100,000), far past asyncio's 64 KiB ``readline`` limit. The answer is
read to EOF; an answer without its final newline was cut short (the agent
stopped mid-answer) and is an error rather than half a document.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from certagent.errors import AgentError

CONNECT_TIMEOUT = 2.0
# The agent answers ``status`` once HAProxy and the store have answered (bounded by
# the agent's own wait); ``status slots`` also dumps the usage table, O(K).
ANSWER_TIMEOUT = 10.0
SLOTS_ANSWER_TIMEOUT = 120.0
CHUNK = 1 << 16


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """Every byte up to EOF, the final newline checked and dropped; any length."""
    chunks: list[bytes] = []
    while chunk := await reader.read(CHUNK):
        chunks.append(chunk)
    answer = b"".join(chunks)
    if not answer.endswith(b"\n"):
        raise AgentError(
            f"the agent's answer ended after {len(answer):,} bytes without its final newline;"
            " it may have stopped: see its log and ask again"
        )
    return answer[:-1]


async def ask(path: str, request: bytes, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
    """One request line to the agent at ``path``; its JSON answer (whatever its size)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), CONNECT_TIMEOUT)
        try:
            writer.write(request + b"\n")
            answer = await asyncio.wait_for(read_answer(reader), timeout)
        finally:
            writer.close()
    except (OSError, TimeoutError) as exc:
        raise AgentError(
            f"agent not reachable at {path}: {exc or type(exc).__name__}; is 'certagent run' up?"
        ) from exc
    try:
        result: dict[str, Any] = json.loads(answer)
    except ValueError as exc:
        raise AgentError(
            f"the agent at {path} answered {answer[:80]!r}, not JSON: is it a certagent"
            " of the same version as this command?"
        ) from exc
    return result
