"""The CLI's side of the agent's socket: an answer is framed by EOF, any length."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from certagent.cli.agentsocket import ask, read_answer
from certagent.errors import AgentError

Answer = Callable[[bytes], bytes]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Callable[[Answer], Awaitable[str]]]:
    """A stand-in agent on a unix socket: reads one line, writes ``answer(line)``, closes."""
    servers: list[asyncio.Server] = []

    async def serve(answer: Answer) -> str:
        async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = await reader.readline()
            writer.write(answer(line))
            await writer.drain()
            writer.close()

        path = str(tmp_path / f"agent{len(servers)}.sock")
        servers.append(await asyncio.start_unix_server(one, path))
        return path

    yield serve
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_an_answer_far_over_the_readline_limit_is_read_whole(
    agent: Callable[[Answer], Awaitable[str]],
) -> None:
    slots = [{"slot": f"s{i}", "hosts": [f"h{i}.example.test"]} for i in range(100_000)]
    body = json.dumps({"slots": slots}).encode()
    assert len(body) > 60 * 65536  # asyncio's readline limit, sixty times over
    path = await agent(lambda line: body + b"\n" if line == b"status slots\n" else b"invalid\n")
    answer = await ask(path, b"status slots")
    assert answer["slots"] == slots


async def test_an_answer_without_its_final_newline_is_an_error(
    agent: Callable[[Answer], Awaitable[str]],
) -> None:
    path = await agent(lambda line: b'{"slots": [{"slot": "s1"}')
    with pytest.raises(AgentError, match="without its final newline"):
        await ask(path, b"status slots")


async def test_an_answer_that_is_not_json_says_so(
    agent: Callable[[Answer], Awaitable[str]],
) -> None:
    path = await agent(lambda line: b"invalid\n")
    with pytest.raises(AgentError, match="not JSON"):
        await ask(path, b"status")


async def test_no_agent_at_the_path_says_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="is 'certagent run' up"):
        await ask(str(tmp_path / "none.sock"), b"status")


async def test_read_answer_drops_only_the_final_newline() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b'{"a": 1}')
    reader.feed_data(b"\n")
    reader.feed_eof()
    assert await read_answer(reader) == b'{"a": 1}'
