"""Re-warming: after an HAProxy reload, load the old worker's hosts into the new one.

A reload gives HAProxy an empty crt-list and usage table.  The first request
from the new worker tells the agent (:class:`~certagent.service.ensure.Ensurer`),
which reads the old worker's loaded hosts, most recently used first, and hands
them here.  They are looked up again (a rotation meanwhile is picked up) and
loaded with the loader's low priority: a client's own load always goes first,
so a hot host that a client asks for before its turn is simply loaded then.

Cost: one store lookup and one load per host, at most ``rewarm_max`` hosts,
``WORKERS`` at a time; nothing when there was no reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from certagent.config import DualCerts
from certagent.errors import AgentError
from certagent.runtime.loader import Loader
from certagent.runtime.loadqueue import Priority
from certagent.service.ensure import choose_kinds
from certagent.store.base import Store, StoredCertificate

log = logging.getLogger(__name__)

# Hosts being looked up or waiting in the loader's re-warm queue at once: enough to fill the
# loader's re-warm batches (REWARM_BATCH) while the previous batch is in HAProxy.
WORKERS = 64
# A re-warm load waits behind every client's load; it gives up after this long.
REWARM_HOLD = 600.0


@dataclass
class RewarmCounters:
    rewarms: int = 0  # reloads followed by a re-warm
    loaded: int = 0
    skipped: int = 0  # already loaded by a client, or gone from the store
    failed: int = 0


class Rewarmer:
    def __init__(
        self,
        store: Store,
        loader: Loader,
        *,
        limit: int,
        dual_certs: DualCerts = DualCerts.BOTH,
        on_loaded: Callable[[str, tuple[StoredCertificate, ...]], None] | None = None,
    ) -> None:
        self.store = store
        self.dual_certs = dual_certs
        self.loader = loader
        self.limit = limit
        #: told about every host loaded (OCSP fetching): host, its certificates
        self.on_loaded = on_loaded
        self.counters = RewarmCounters()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, hosts: list[str]) -> None:
        """Re-warm ``hosts`` (most recently used first), replacing any re-warm in progress."""
        if self._task is not None:
            self._task.cancel()
        chosen = hosts[: self.limit]
        if not chosen:
            return
        self.counters.rewarms += 1
        log.info("HAProxy was reloaded: re-loading its %d most recently used hosts", len(chosen))
        self._task = asyncio.create_task(self._run(chosen), name="rewarm")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, hosts: list[str]) -> None:
        todo = iter(hosts)
        before = self.counters.loaded
        await asyncio.gather(*(self._worker(todo) for _ in range(WORKERS)))
        log.info(
            "re-warm done: %d hosts loaded again, %d skipped, %d failed",
            self.counters.loaded - before,
            self.counters.skipped,
            self.counters.failed,
        )

    async def _worker(self, todo: Iterator[str]) -> None:
        for host in todo:
            if self.loader.pool.is_marked(host):
                self.counters.skipped += 1
                continue
            try:
                found = choose_kinds(await self.store.lookup_all(host), self.dual_certs)
                if not found:
                    self.counters.skipped += 1
                    continue
                await self.loader.install(host, found, REWARM_HOLD, priority=Priority.REWARM)
                if self.on_loaded is not None:
                    self.on_loaded(host, found)
            except AgentError as exc:
                self.counters.failed += 1
                log.debug("re-warm of %s failed: %s", host, exc)
                continue
            self.counters.loaded += 1
