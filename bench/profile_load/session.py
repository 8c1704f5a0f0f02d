"""The admin connection (the agent's own runtime-API client) and the worker-CPU meter.

The bench code is blocking; :class:`RuntimeSession` runs the agent's asyncio
:class:`~certagent.runtime.client.RuntimeClient` on a private event loop, so the
bytes on the wire, the ``prompt``-mode framing and the reply splitting are the
agent's.  What is sent, and which reply is right, comes from :mod:`bench._runtime_api`.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from bench._proc import schedstat_ns
from bench._runtime_api import Step
from certagent.errors import HAProxyError
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient

CHUNK_BYTES = 64 * 1024
CHUNK_CMDS = 128

T = TypeVar("T")


def check_replies(steps: Sequence[Step], replies: Sequence[str], what: str) -> None:
    """Every reply must be the one its step expects; else RuntimeError naming ``what``."""
    for i, (step, reply) in enumerate(zip(steps, replies, strict=True)):
        try:
            step.check(reply)
        except HAProxyError as exc:
            raise RuntimeError(f"{what}: unexpected reply #{i}: {reply[:300]!r} ({exc})") from exc


def _chunks(steps: Sequence[Step]) -> Iterator[Sequence[Step]]:
    """Runs of <= CHUNK_CMDS steps and <= CHUNK_BYTES encoded (at least one step each)."""
    start = 0
    while start < len(steps):
        end, size = start, 0
        while end < len(steps) and end - start < CHUNK_CMDS:
            command = steps[end].command
            length = len(protocol.encode(*command.args, payload=command.payload))
            if end > start and size + length > CHUNK_BYTES:
                break
            size += length
            end += 1
        yield steps[start:end]
        start = end


class RuntimeSession:
    """One prompt-mode connection to HAProxy's admin socket, driven from blocking code."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self._runner = asyncio.Runner()
        self.client = RuntimeClient(path, timeout=timeout)
        self._runner.run(self.client.connect())

    def close(self) -> None:
        try:
            self._runner.run(self.client.close())
        finally:
            self._runner.close()

    def send(self, steps: Sequence[Step]) -> list[str]:
        """Pipelined: each chunk (see :func:`_chunks`) in one write, then its replies."""
        replies: list[str] = []
        for chunk in _chunks(steps):
            replies += self._runner.run(self.client.pipeline([s.command for s in chunk]))
        return replies

    def run(self, steps: Sequence[Step], what: str) -> list[str]:
        """:meth:`send`, every reply checked."""
        replies = self.send(steps)
        check_replies(steps, replies, what)
        return replies

    def send_while(self, steps: Sequence[Step], meanwhile: Callable[[], T]) -> tuple[list[str], T]:
        """Write ``steps`` at once, call ``meanwhile()`` while HAProxy runs them, then read.

        The replies are returned unchecked, with what ``meanwhile`` returned.
        """

        async def both() -> tuple[list[str], T]:
            replies = asyncio.ensure_future(self.client.pipeline([s.command for s in steps]))
            await asyncio.sleep(0)  # the pipeline writes, then waits for the replies
            other = meanwhile()
            return await replies, other

        return self._runner.run(both())


class Meter:
    """HAProxy worker CPU for a batch of operations sent over ``session``."""

    def __init__(self, session: RuntimeSession, pid: int) -> None:
        self.session = session
        self.pid = pid

    def timed(self, steps: Sequence[Step], n_ops: int, what: str) -> float:
        """Worker CPU in µs per operation for ``steps`` (``n_ops`` operations), replies checked."""
        time.sleep(0.003)  # let the worker go idle so its counters are up to date
        before = schedstat_ns(self.pid)
        replies = self.session.send(steps)
        time.sleep(0.003)
        after = schedstat_ns(self.pid)
        check_replies(steps, replies, what)
        return (after - before) / 1000.0 / n_ops

    def idle_us_per_s(self, seconds: float = 1.0) -> float:
        before = schedstat_ns(self.pid)
        time.sleep(seconds)
        return (schedstat_ns(self.pid) - before) / 1000.0 / seconds


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every sample, in µs."""
    return {
        "median_us": round(statistics.median(samples), 2),
        "min_us": round(min(samples), 2),
        "max_us": round(max(samples), 2),
        "reps": len(samples),
        "samples_us": [round(s, 2) for s in samples],
    }


def ratio_summary(ratios: Sequence[float]) -> dict[str, float]:
    """Median, min and max of paired ratios (each within one repetition)."""
    return {
        "median": round(statistics.median(ratios), 3),
        "min": round(min(ratios), 3),
        "max": round(max(ratios), 3),
    }
