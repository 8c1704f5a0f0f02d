"""The ensure path: SNI in, "is HAProxy able to serve it now?" out.

validate -> loaded already? -> negative cache -> single flight per name ->
store lookup -> slot load (bounded wait) -> answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from agent import hostname
from agent.errors import AgentError, Busy, InvalidHostname
from agent.loader import Loader
from agent.store.base import Store

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What the Lua action is told; anything but OK means "use the fallback"."""

    OK = "ok"
    UNKNOWN = "unknown"  # not in the store
    BUSY = "busy"  # could not start loading before the deadline
    INVALID = "invalid"  # not a hostname
    ERROR = "error"  # store or HAProxy failed


@dataclass
class EnsureCounters:
    requests: int = 0
    hits: int = 0
    loaded: int = 0
    unknown: int = 0
    negative_hits: int = 0
    busy: int = 0
    invalid: int = 0
    errors: int = 0
    store_lookups: int = 0


class NegativeCache:
    """Names known to be absent from the store, for ``ttl`` seconds; at most ``size`` names."""

    def __init__(self, ttl: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, name: str) -> bool:
        until = self._until.get(name)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[name]
            return False
        return True

    def add(self, name: str) -> None:
        if self.ttl <= 0 or self.size <= 0:
            return
        self._until[name] = self._clock() + self.ttl
        self._until.move_to_end(name)
        while len(self._until) > self.size:
            self._until.popitem(last=False)

    def discard(self, name: str) -> None:
        self._until.pop(name, None)

    def clear(self) -> None:
        self._until.clear()

    def __len__(self) -> int:
        return len(self._until)


class Ensurer:
    def __init__(
        self,
        store: Store,
        loader: Loader,
        negative: NegativeCache,
        *,
        load_deadline: float,
    ) -> None:
        self.store = store
        self.loader = loader
        self.negative = negative
        self.load_deadline = load_deadline
        self.counters = EnsureCounters()
        self._inflight: dict[str, asyncio.Future[Outcome]] = {}

    async def ensure(self, raw: str | bytes) -> Outcome:
        self.counters.requests += 1
        try:
            name = hostname.normalise(raw)
        except InvalidHostname:
            self.counters.invalid += 1
            return Outcome.INVALID
        if self.loader.pool.is_mapped(name):
            # HAProxy asks only for hosts missing from its map: a race with the load
            # that just mapped it, or a reload the watcher has not noticed yet.
            if await self.loader.still_current():
                self.counters.hits += 1
                return Outcome.OK
            await self.loader.reset("HAProxy asked for a mapped host: it was reloaded")
        if name in self.negative:
            self.counters.negative_hits += 1
            return Outcome.UNKNOWN
        pending = self._inflight.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._inflight[name] = future
        try:
            outcome = await self._load(name)
        except BaseException:
            future.set_result(Outcome.ERROR)
            raise
        finally:
            del self._inflight[name]
        future.set_result(outcome)
        return outcome

    async def _load(self, name: str) -> Outcome:
        try:
            self.counters.store_lookups += 1
            found = await self.store.lookup_all(name)
            if not found:
                self.negative.add(name)
                self.counters.unknown += 1
                log.info("no certificate for %s in the store", name)
                return Outcome.UNKNOWN
            slots = await self.loader.install(name, found, self.load_deadline)
        except Busy as exc:
            self.counters.busy += 1
            log.warning("busy: %s", exc)
            return Outcome.BUSY
        except AgentError as exc:
            self.counters.errors += 1
            log.error("loading %s failed: %s", name, exc)
            return Outcome.ERROR
        self.counters.loaded += 1
        log.info(
            "serving %s from %s (certificate %s)",
            name,
            " ".join(s.name for s in slots),
            " ".join(c.id for c in found),
        )
        return Outcome.OK
