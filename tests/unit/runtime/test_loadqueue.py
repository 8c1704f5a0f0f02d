"""The loader's queue items: priorities, outcomes seen or not, failing what is left."""

from __future__ import annotations

import asyncio

from certagent.errors import AgentError
from certagent.runtime.loadqueue import (
    LoadCounters,
    LoadRequest,
    Priority,
    fail_all,
    has_failed,
    retrieve,
)
from certagent.runtime.pool import Slot


def test_clients_come_before_rewarming() -> None:
    assert sorted([Priority.REWARM, Priority.CLIENT]) == [Priority.CLIENT, Priority.REWARM]
    assert list(Priority) == [Priority.CLIENT, Priority.REWARM]  # the loader's queue order


async def test_fail_all_answers_only_what_is_unanswered() -> None:
    loop = asyncio.get_running_loop()
    done = LoadRequest("a.test", (), loop.create_future())
    slot = Slot("/certagent/slot-00001.pem", "F", "id")
    done.future.set_result((slot,))
    waiting = LoadRequest("b.test", (), loop.create_future())
    gone = LoadRequest("c.test", (), loop.create_future())
    gone.future.cancel()
    fail_all([done, waiting, gone], AgentError("the agent is stopping"))
    assert done.future.result() == (slot,)
    assert not has_failed(done.future) and has_failed(waiting.future)
    assert not has_failed(gone.future)  # cancelled: the client gave up, not a failure
    assert waiting.started is False and done.fingerprints == set()


async def test_an_outcome_nobody_awaits_is_retrieved_quietly() -> None:
    future: asyncio.Future[tuple[Slot, ...]] = asyncio.get_running_loop().create_future()
    future.add_done_callback(retrieve)
    future.set_exception(AgentError("load failed after the client's hold"))
    await asyncio.sleep(0)  # the callback ran: no "exception was never retrieved"
    cancelled: asyncio.Future[tuple[Slot, ...]] = asyncio.get_running_loop().create_future()
    cancelled.cancel()
    retrieve(cancelled)


def test_counters_start_at_zero() -> None:
    counters = LoadCounters()
    assert set(vars(counters).values()) == {0}
    assert "mark_only" in vars(counters) and "map_only" not in vars(counters)
