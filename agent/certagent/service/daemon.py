"""``certagent run``: startup -> serve until a stop signal -> drain -> shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from certagent import config
from certagent.api import ApiServer, LoadedSlot, loaded_slots, start_api
from certagent.api.metrics_listener import start_metrics
from certagent.config import Settings
from certagent.errors import AgentError, ConfigError, HAProxyError
from certagent.runtime import protocol
from certagent.runtime.build import HAProxyBuild, http3_problem, probe_build
from certagent.runtime.client import Identity, RuntimeClient, probe_identity, query
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.loader import Loader
from certagent.runtime.pool import SlotPool
from certagent.runtime.recycles import RecycleLog
from certagent.runtime.usage import VictimChooser
from certagent.service import ondemand
from certagent.service.control import ControlServer
from certagent.service.datakey import Announcer, check_data_key, key_checked
from certagent.service.ensure import Ensurer, NegativeCache
from certagent.service.expiry import ExpiryWatch
from certagent.service.fleet import Presence, check_store_format
from certagent.service.flood import LookupBudget
from certagent.service.instance import InstanceLock
from certagent.service.live import LiveUpdater
from certagent.service.manage import manage_name
from certagent.service.metrics import render as render_metrics
from certagent.service.namefilter import NameFilter, NotingStore, keep_built, keep_saved
from certagent.service.notify import notify
from certagent.service.ocspfetch import OcspFetcher
from certagent.service.renewer import Renewer, renewer_settings
from certagent.service.rewarm import Rewarmer
from certagent.service.tickets import RingStore, TicketKeeper
from certagent.store import open_configured
from certagent.store.base import Store
from certagent.store.renewals import Managed

log = logging.getLogger(__name__)

DRAIN_SECONDS = 5.0
# How long ``status`` waits for HAProxy and the store to answer (s).
HEALTH_TIMEOUT = 1.0
# The frontend whose QUIC binds serve HTTP/3 (certagent init --http3).
HTTP3_FRONTEND = "fe_tls"


class Agent:
    """Everything ``certagent run`` wires together, with no process-global state.

    Built top to bottom, each piece from the ones above it.  The loader's two
    hooks (a reload it asked for, a new HAProxy session) reach pieces built
    after it, the re-warmer and the ticket keeper, through :meth:`_reloaded`
    and :meth:`_new_session`.
    """

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        # HAProxy: its runtime socket, the slots, and their one writer
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
                usage_table=settings.usage_table,
                usage_expire_ms=settings.usage_expire_ms,
            ),
            master_socket=settings.haproxy_master_socket,
            on_reload=self._reloaded,
            on_session=self._new_session,
            max_waiting=settings.max_waiting_loads,
            batch=settings.load_batch,
            chooser=VictimChooser(samples=settings.victim_samples),
            # HTTP/3 clients keep trying QUIC for http3_max_age after their last response
            recycles=RecycleLog(settings.http3_max_age if settings.http3 else 0.0),
        )
        # OCSP responses for what is loaded, told about each load
        self.ocsp = OcspFetcher(store, self.pool) if settings.ocsp_fetch else None
        on_loaded = self.ocsp.loaded if self.ocsp is not None else None
        # what gets loaded: re-warming after a reload, and the ensure path
        self.rewarmer = Rewarmer(
            store,
            self.loader,
            limit=settings.rewarm_max,
            dual_certs=settings.dual_certs,
            on_loaded=on_loaded,
        )
        negative = NegativeCache(settings.negative_ttl, settings.negative_cache_size)
        self.names = NameFilter()
        lookups = LookupBudget(settings.lookup_rate, 2 * settings.lookup_rate)
        # certificates on demand (acme_directory): for names the store lacks
        self.ondemand = (
            ondemand.build(settings, store, self.loader, lookups)
            if settings.acme_directory
            else None
        )
        self.ensurer = Ensurer(
            store,
            self.loader,
            negative,
            hold=settings.hold,
            dual_certs=settings.dual_certs,
            on_reload=self.rewarmer.start,
            on_loaded=on_loaded,
            names=self.names,
            budget=lookups,
            max_hosts_per_wildcard=settings.wildcard_hosts,
            issuer=self.ondemand.issuer if self.ondemand else None,
            issue_wait=settings.acme_wait,
        )
        self.tickets: TicketKeeper | None = None
        if settings.tls_keys_file:
            keys_path = Path(settings.tls_keys_file)
            rings: RingStore = store.ticket_ring(keys_path.with_name("ring.json"))
            self.tickets = TicketKeeper(rings, keys_path, settings.ticket_key_rotation, self.loader)
        # the store's changes, applied to what HAProxy holds
        self.live = LiveUpdater(
            store,
            self.loader,
            negative,
            dual_certs=settings.dual_certs,
            names=self.names,
            on_tickets=self.tickets.refresh_quietly if self.tickets else None,
            on_loaded=on_loaded,
            on_issuance=self.ondemand.on_change if self.ondemand else None,
        )
        # renewal of what the issuer manages (renew_tick 0: this node leaves it to others)
        self.renewer = (
            Renewer(
                self.ondemand.issuer,
                self.ondemand.issuer.issuance.renewals,
                renewer_settings(settings),
                writer=store,
            )
            if self.ondemand is not None and settings.renew_tick > 0
            else None
        )
        self.expiry = ExpiryWatch(
            store,
            settings.expiry_warning_days,
            renewal=self.renewer.failing_for if self.renewer is not None else None,
            renew_policy=renewer_settings(settings).policy if self.ondemand else None,
        )
        # the data keys this agent holds, told to the fleet's writers
        keys = store.data_keys()
        self.datakeys = Announcer(keys, ondemand.node_name(settings)) if keys is not None else None
        # this node's release on the fleet's board, and the store's format it writes
        self.presence = Presence(
            store.fleet(),
            ondemand.node_name(settings),
            self._haproxy_version,
            self.renewer.pace if self.renewer is not None else lambda: None,
        )
        self._build: tuple[Identity, HAProxyBuild] | None = None  # per worker, see status
        self.fatal: AgentError | None = None  # why the agent stopped itself, if it did
        # the Lua action's and the CLI's socket
        self.control = ControlServer(
            settings.agent_socket,
            self.ensurer,
            self.status,
            {b"tls-keys-rotate": self.rotate_ticket_keys},
        )

    def _haproxy_version(self) -> str:
        identity = self.loader.identity
        return identity.version if identity is not None else ""

    def _reloaded(self, hosts: list[str]) -> None:
        """The loader reloaded HAProxy (a stray transaction): re-warm the new worker."""
        self.rewarmer.start(hosts)

    async def _new_session(self, client: RuntimeClient) -> None:
        """Every new HAProxy session, after adoption: the fleet's ticket keys, challenge slots."""
        if self.tickets is not None:
            await self.tickets.sync(client)
        if self.ondemand is not None:
            await self.ondemand.session(client)

    async def rotate_ticket_keys(self) -> dict[str, Any]:
        """``certagent tls-keys rotate``: a new ring for the fleet now."""
        if self.tickets is None:
            raise ConfigError(
                "no tls_keys_file configured: this haproxy.cfg predates shared ticket keys;"
                " re-run certagent init"
            )
        await self.tickets.rotate_now()
        return self.tickets.status()

    async def _hits(self, what: str) -> dict[str, int]:
        """Connections per host from the usage table; empty (and a warning) if unreadable."""
        try:
            return await self.loader.hits_by_host()
        except HAProxyError as exc:
            log.warning("%s: cannot read the usage table: %s", what, exc)
            return {}

    async def status(self, slots: bool = False) -> dict[str, Any]:
        """Counters and health; with ``slots``, every slot too (O(K): a usage-table dump)."""
        identity = self.loader.identity
        haproxy_up, store_up = await asyncio.gather(self._haproxy_up(), self._store_up())
        marked = sum(len(s.hosts) for s in self.pool.slots)
        loader = dataclasses.asdict(self.loader.counters)
        live = dataclasses.asdict(self.live.counters)
        # Keys renamed from "map" to "mark" (one word for it): the old ones, for one release.
        loader["map_only"] = loader["mark_only"]
        live["unmapped"] = live["unmarked"]
        out: dict[str, Any] = {
            "agent_pid": os.getpid(),
            "haproxy_pid": identity.pid if identity else None,
            "haproxy_version": identity.version if identity else None,
            "haproxy_build": await self._haproxy_build(),
            "haproxy_up": haproxy_up,
            "store_up": store_up,
            "capacity": self.pool.capacity,
            "slots_used": len(self.pool),
            "hosts_marked": marked,
            "hosts_mapped": marked,
            "negative_cache": len(self.ensurer.negative),
            "store": self.store.describe(),
            "ensure": dataclasses.asdict(self.ensurer.counters),
            "loader": loader,
            "live": live,
            "rewarm": dataclasses.asdict(self.rewarmer.counters),
            "waiting_loads": self.loader.waiting(),
            "name_filter": self.names.status(),
            "tickets": None if self.tickets is None else self.tickets.status(),
            "expiry": self.expiry.status(),
            "ocsp_fetch": None if self.ocsp is None else self.ocsp.status(),
            "issuance": await self._issuance_status(),
            "data_keys": None if self.datakeys is None else self.datakeys.status(),
            "fleet": self.presence.status(),
            "load_seconds": self.ensurer.load_seconds.snapshot(),
            "http3": await self._http3_status() if self.settings.http3 else None,
        }
        if slots:
            hits = await self._hits("status")
            out["slots"] = [
                {
                    "slot": s.name,
                    "certificate": s.cert_id,
                    "hosts": sorted(s.hosts),
                    "connections": sum(hits.get(h, 0) for h in s.hosts),
                }
                for s in self.pool.slots
            ]
        return out

    async def _issuance_status(self) -> dict[str, Any] | None:
        """On-demand issuance and renewal (the schedule's counts: two O(log M) store reads)."""
        if self.ondemand is None:
            return None
        out: dict[str, Any] = dict(self.ondemand.status())
        if self.renewer is None:
            out["renewal"] = None
            return out
        try:
            out["renewal"] = await self.renewer.status(fleet=await self.presence.fleet_pace())
        except AgentError as exc:
            out["renewal"] = {"error": str(exc)}
        return out

    async def _haproxy_build(self) -> dict[str, Any] | None:
        """The HAProxy version, TLS library, Lua and what differs on them (``status``).

        Asked once per HAProxy worker (a runtime-API command, on 2.6 also
        ``haproxy -vv``), then kept: status and metrics scrapes cost nothing more.
        """
        identity = self.loader.identity
        if identity is None:
            return None
        if self._build is None or self._build[0] != identity:
            try:
                build = await probe_build(self.settings.haproxy_socket, identity.version)
            except HAProxyError as exc:
                log.warning("cannot tell which HAProxy build runs: %s", exc)
                return None
            log.info("HAProxy build: %s", build.describe())
            self._build = (identity, build)
        return self._build[1].as_dict()

    async def _http3_status(self) -> dict[str, Any]:
        """fe_tls's QUIC counters (one ``show stat`` line, O(1)) and the recycled hosts' returns.

        ``quic`` is None while HAProxy does not answer.
        """
        out: dict[str, Any] = {"max_age": self.settings.http3_max_age}
        out.update(self.loader.recycles.status())
        try:
            reply = await query(
                self.settings.haproxy_socket,
                protocol.show_frontend_stats(HTTP3_FRONTEND),
                timeout=HEALTH_TIMEOUT,
            )
            counters = protocol.parse_quic_counters(reply)
        except HAProxyError as exc:
            log.debug("cannot read %s's QUIC counters: %s", HTTP3_FRONTEND, exc)
            counters = None
        out["quic"] = None if counters is None else dataclasses.asdict(counters)
        return out

    async def check_http3(self, stop: asyncio.Event) -> None:
        """``http3 = true``: stop the agent (:attr:`fatal`) if HAProxy has no QUIC."""
        identity = self.loader.identity
        if identity is None:
            return
        try:
            build = await probe_build(self.settings.haproxy_socket, identity.version)
        except HAProxyError as exc:
            log.warning("cannot tell whether HAProxy serves QUIC (http3 = true): %s", exc)
            return
        self._build = (identity, build)
        problem = http3_problem(build, self.settings.haproxy_socket)
        if problem is not None:
            self.fatal = ConfigError(
                f"http3 = true in the configuration, but {problem}; re-run certagent init"
                " without --http3, or run an HAProxy built with QUIC"
            )
            stop.set()
        else:
            log.info("HTTP/3: %s serves QUIC", build.describe())

    async def _haproxy_up(self) -> bool:
        """Whether HAProxy's runtime socket answers now (a fresh ``show info``)."""
        try:
            await probe_identity(self.settings.haproxy_socket, timeout=HEALTH_TIMEOUT)
        except HAProxyError:
            return False
        return True

    async def _store_up(self) -> bool:
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT):
                await self.store.ping()
        except (AgentError, TimeoutError):
            return False
        return True

    async def metrics(self) -> bytes:
        """``GET /metrics``: the status snapshot in Prometheus' text format."""
        return render_metrics(await self.status())

    async def manage(self, name: str) -> Managed:
        """``PUT /v1/renewals/{name}``: opt the name's stored certificate into renewal,
        under this agent's whole permission policy (its ask endpoint included)."""
        assert self.ondemand is not None  # the route is wired only with issuance on
        permission = self.ondemand.issuer.permission
        return await manage_name(
            self.store, permission, renewer_settings(self.settings).policy, name
        )

    async def loaded(self) -> list[LoadedSlot]:
        """What HAProxy holds now, for ``GET /v1/loaded``."""
        hits = await self._hits("loaded")
        return loaded_slots(
            self.pool.slots, hits, now=datetime.now(UTC), monotonic_now=time.monotonic()
        )

    async def connect_haproxy(self, stop: asyncio.Event) -> None:
        """Connect to HAProxy and adopt what it holds; retry (with backoff) until it answers.

        Runs only until the first success: afterwards every request of the Lua
        action names its HAProxy worker, and the ensure path notices a reload
        or restart from that (no polling).
        """
        delay = 0.1
        while not stop.is_set():
            try:
                identity = await self.loader.sync()
            except AgentError as exc:
                log.warning("HAProxy not reachable yet (%s); retrying in %.1fs", exc, delay)
            else:
                log.info("serving HAProxy pid %d", identity.pid)
                if self.settings.http3:
                    await self.check_http3(stop)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 5.0)


async def run(
    settings: Settings, stop: asyncio.Event | None = None, config_path: Path | None = None
) -> None:
    """The agent until ``stop`` is set (SIGTERM, SIGINT); SIGHUP re-reads what it safely can.

    Refuses to start (ConfigError) while another agent holds this HAProxy's lock.
    """
    lock = InstanceLock(settings.agent_socket)
    lock.acquire()
    try:
        await _serve(settings, stop or asyncio.Event(), config_path)
    finally:
        lock.release()


def _freeze_startup_objects() -> None:
    """Leave what startup made (modules, classes, settings: ≈65,000 objects) out of
    every later garbage collection (:func:`gc.freeze`), after collecting once.

    A full collection otherwise walks them all: ≈25 ms of the agent's CPU at once,
    in the middle of a storm of new hosts, every few thousand loads.
    """
    gc.collect()
    gc.freeze()


async def _serve(settings: Settings, stop: asyncio.Event, config_path: Path | None) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = open_configured(settings)
    agent = Agent(settings, store)
    try:
        await store.ping()
    except AgentError as exc:
        log.warning("store %s not reachable yet: %s", store.describe(), exc)
    # a store at a format this release does not know: refuse to start, having written nothing
    await check_store_format(store, agent.presence.node)
    await check_data_key(store, settings)  # ConfigError: refuse to start
    await agent.presence.beat()  # on the board before the data-key announcement
    if agent.tickets is not None:
        await agent.tickets.start_quietly()
    api = await start_api(
        settings,
        # an upload passes the name filter at once, and only if every agent can read it
        NotingStore(key_checked(store, settings.key_file), agent.names),
        loaded=agent.loaded,
        ready=lambda: agent.loader.identity is not None,
        metrics=agent.metrics,
        manage=agent.manage if agent.ondemand is not None else None,
    )

    async def all_metrics() -> bytes:  # the agent's, and the REST API's per-token counters
        return await agent.metrics() + (api.metrics() if api is not None else b"")

    metrics = (
        await start_metrics(settings.metrics_bind, all_metrics) if settings.metrics_bind else None
    )
    loop.add_signal_handler(signal.SIGHUP, _on_hup, settings, config_path, api)
    await agent.control.start()
    tasks = [
        asyncio.create_task(agent.connect_haproxy(stop), name="connect-haproxy"),
        asyncio.create_task(agent.live.run(stop), name="live-changes"),
        asyncio.create_task(keep_built(agent.names, store, stop), name="name-filter"),
        asyncio.create_task(agent.expiry.run(stop), name="expiry"),
    ]
    snapshots = store.filter_snapshot()
    if snapshots is not None:
        tasks.append(
            asyncio.create_task(keep_saved(agent.names, snapshots, stop), name="name-filter-save")
        )
    if agent.ocsp is not None:
        tasks.append(asyncio.create_task(agent.ocsp.run(stop), name="ocsp-fetch"))
    tasks.append(asyncio.create_task(agent.presence.run(stop), name="fleet-board"))
    if agent.datakeys is not None:
        tasks.append(asyncio.create_task(agent.datakeys.run(stop), name="data-keys"))
    if agent.tickets is not None:
        tasks.append(asyncio.create_task(agent.tickets.run(stop), name="ticket-keys"))
    if agent.ondemand is not None:
        tasks.append(
            asyncio.create_task(agent.ondemand.responder.run(stop), name="challenge-responder")
        )
    if agent.renewer is not None:
        tasks.append(asyncio.create_task(agent.renewer.run(stop), name="renewal"))

    def supervise(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical(
                "%s crashed; stopping the agent", task.get_name(), exc_info=task.exception()
            )
            stop.set()

    for task in tasks:
        task.add_done_callback(supervise)
    _freeze_startup_objects()
    log.info(
        "certagent running (pid %d): capacity %d, store %s, HAProxy %s",
        os.getpid(),
        settings.capacity,
        store.describe(),
        settings.haproxy_socket,
    )
    notify("READY=1", f"STATUS=serving HAProxy's Lua action on {settings.agent_socket}")
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        notify("STOPPING=1")
        gc.unfreeze()
        loop.remove_signal_handler(signal.SIGHUP)
        await agent.control.close()
        if api is not None:
            await api.close()
        if metrics is not None:
            await metrics.close()
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=DRAIN_SECONDS)
        agent.ensurer.unknown.flush()
        await agent.rewarmer.close()
        if agent.renewer is not None:
            await agent.renewer.close()
        if agent.ondemand is not None:
            await agent.ondemand.close()
        await agent.loader.close()
        if agent.datakeys is not None:
            await agent.datakeys.withdraw()
        await agent.presence.leave()
        await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    if agent.fatal is not None:
        raise agent.fatal


def _on_hup(settings: Settings, config_path: Path | None, api: ApiServer | None) -> None:
    """SIGHUP: the log level from the config file, the API tokens file; nothing else.

    Other settings need a restart; the ones that changed are named in a warning.
    """
    notify("RELOADING=1")
    changed: list[str] = []
    level = settings.log_level
    if config_path is not None:
        try:
            fresh = config.load(config_path)
        except ConfigError as exc:
            log.warning("SIGHUP: %s; keeping the running settings", exc)
            fresh = settings
        level = fresh.log_level
        changed = [
            f.name
            for f in dataclasses.fields(Settings)
            if f.name != "log_level" and getattr(fresh, f.name) != getattr(settings, f.name)
        ]
    logging.getLogger().setLevel(getattr(logging, level.upper(), logging.INFO))
    tokens = api.reload_tokens() if api is not None else None
    log.info(
        "SIGHUP: log level %s%s",
        level,
        "" if tokens is None else f", API tokens file re-read ({tokens} tokens)",
    )
    if changed:
        log.warning(
            "SIGHUP: %s changed in the config file; they apply after a restart", ", ".join(changed)
        )
    notify("READY=1")
