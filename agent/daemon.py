"""``certagent run``: startup -> serve until a stop signal -> drain -> shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

from agent.api import LoadedSlot, loaded_slots, start_api
from agent.config import Settings
from agent.control import ControlServer
from agent.ensure import Ensurer, NegativeCache
from agent.errors import AgentError, HAProxyError
from agent.live import LiveUpdater
from agent.loader import HAProxyNames, Loader
from agent.pool import SlotPool
from agent.runtime.client import RuntimeClient, probe_identity
from agent.store import open_configured
from agent.store.base import Store

log = logging.getLogger(__name__)

DRAIN_SECONDS = 5.0


class Agent:
    """Everything ``certagent run`` wires together, with no process-global state."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.client = RuntimeClient(
            settings.haproxy_socket,
            timeout=settings.haproxy_timeout,
            bufsize=settings.haproxy_bufsize,
        )
        self.pool = SlotPool(settings.capacity, settings.slot_prefix)
        self.loader = Loader(
            self.client,
            self.pool,
            HAProxyNames(
                crt_list=settings.crt_list,
                map_path=settings.map_file,
                usage_table=settings.usage_table,
                usage_expire_ms=settings.usage_expire_ms,
            ),
            usage_refresh=settings.usage_refresh,
            max_waiting=settings.max_waiting_loads,
            batch=settings.load_batch,
        )
        negative = NegativeCache(settings.negative_ttl, settings.negative_cache_size)
        self.ensurer = Ensurer(store, self.loader, negative, load_deadline=settings.load_deadline)
        self.live = LiveUpdater(store, self.loader, negative)
        self.control = ControlServer(settings.agent_socket, self.ensurer, self.status)

    async def _hits(self, what: str) -> dict[str, int]:
        """Connections per host from the usage table; empty (and a warning) if unreadable."""
        try:
            return await self.loader.hits_by_host()
        except HAProxyError as exc:
            log.warning("%s: cannot read the usage table: %s", what, exc)
            return {}

    async def status(self) -> dict[str, Any]:
        identity = self.loader.identity
        hits = await self._hits("status")
        return {
            "agent_pid": os.getpid(),
            "haproxy_pid": identity.pid if identity else None,
            "haproxy_version": identity.version if identity else None,
            "capacity": self.pool.capacity,
            "slots_used": len(self.pool),
            "hosts_mapped": sum(len(s.hosts) for s in self.pool.slots),
            "negative_cache": len(self.ensurer.negative),
            "store": self.store.describe(),
            "ensure": dataclasses.asdict(self.ensurer.counters),
            "loader": dataclasses.asdict(self.loader.counters),
            "live": dataclasses.asdict(self.live.counters),
            "slots": [
                {
                    "slot": s.name,
                    "certificate": s.cert_id,
                    "hosts": sorted(s.hosts),
                    "connections": sum(hits.get(h, 0) for h in s.hosts),
                }
                for s in self.pool.slots
            ],
        }

    async def loaded(self) -> list[LoadedSlot]:
        """What HAProxy holds now, for ``GET /v1/loaded``."""
        hits = await self._hits("loaded")
        return loaded_slots(
            self.pool.slots, hits, now=datetime.now(UTC), monotonic_now=time.monotonic()
        )

    async def watch_haproxy(self, stop: asyncio.Event) -> None:
        """Notice reloads and restarts (new worker pid or start time) and resynchronise."""
        interval = self.settings.watch_interval
        while not stop.is_set():
            try:
                seen = await probe_identity(self.settings.haproxy_socket, timeout=interval * 4)
            except HAProxyError as exc:
                if self.loader.identity is not None:
                    await self.loader.reset(f"HAProxy unreachable: {exc}")
            else:
                current = self.loader.identity
                if current is not None and current != seen:
                    await self.loader.reset(
                        f"HAProxy pid {current.pid} -> {seen.pid} (reload or restart)"
                    )
                if self.loader.identity is None:
                    try:
                        await self.loader.sync()
                    except AgentError as exc:
                        log.warning("cannot synchronise with HAProxy yet: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


async def run(settings: Settings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = open_configured(settings)
    agent = Agent(settings, store)
    try:
        await store.ping()
    except AgentError as exc:
        log.warning("store %s not reachable yet: %s", store.describe(), exc)
    api = await start_api(
        settings, store, loaded=agent.loaded, ready=lambda: agent.loader.identity is not None
    )
    await agent.control.start()
    tasks = [
        asyncio.create_task(agent.watch_haproxy(stop), name="watch-haproxy"),
        asyncio.create_task(agent.live.run(stop), name="live-changes"),
    ]

    def supervise(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical(
                "%s crashed; stopping the agent", task.get_name(), exc_info=task.exception()
            )
            stop.set()

    for task in tasks:
        task.add_done_callback(supervise)
    log.info(
        "certagent running: capacity %d, store %s, HAProxy %s",
        settings.capacity,
        store.describe(),
        settings.haproxy_socket,
    )
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await agent.control.close()
        if api is not None:
            await api.close()
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=DRAIN_SECONDS)
        await agent.loader.close()
        await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
