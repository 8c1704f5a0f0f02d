"""Puts certificates into HAProxy slots, keeping the loaded-hosts map in step.

The loader is the only code that writes to HAProxy.  A load is a handful of
commands that must not interleave with another load (2.6.12 has one global
certificate transaction), so every load runs under one lock; a caller that
cannot get it before its deadline gets :class:`~agent.errors.Busy` at once.

Map discipline: a host is in the map only while its certificate is committed
in a slot.  Recycling a slot removes the old hosts from the map *before* the
new certificate is committed, and adds the new host only *after* the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from agent import pem
from agent.errors import (
    AgentError,
    Busy,
    HAProxyError,
    HAProxyUnavailable,
    WrongTransaction,
)
from agent.hostname import covers
from agent.pool import Slot, SlotPool, SlotState, last_seen_from_table, recency
from agent.runtime import protocol
from agent.runtime.client import Command, Identity, RuntimeClient, probe_identity
from agent.selfsigned import PLACEHOLDER_NAME, placeholder
from agent.store.base import StoredCertificate

log = logging.getLogger(__name__)

# Reconnect backoff after a failed connection to the runtime socket (seconds).
RECONNECT_MIN = 0.05
RECONNECT_MAX = 1.0
# How often a recycling candidate may turn out to be in use before one is taken anyway.
MAX_VICTIM_CHECKS = 8
# Default for how many queued loads go to HAProxy in one pipelined batch.
BATCH = 32


@dataclass
class _Request:
    """One host waiting for its certificates to be loaded and mapped."""

    host: str
    certs: tuple[StoredCertificate, ...]
    future: asyncio.Future[tuple[Slot, ...]]
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def fingerprints(self) -> set[str]:
        return {c.bundle.fingerprint_sha1 for c in self.certs}


@dataclass
class _Load:
    """One certificate going into one slot within a batch."""

    cert: StoredCertificate
    slot: str
    state: SlotState
    victim: Slot | None  # the slot's current occupant, when recycling
    error: AgentError | None = None


def _failed(future: asyncio.Future[tuple[Slot, ...]]) -> bool:
    return not future.cancelled() and future.exception() is not None


def _listed(crt_list: str, slot: str, reply: str) -> bool:
    """Whether ``reply`` to ``add ssl crt-list`` says the line went in."""
    try:
        protocol.check_add_crtlist(crt_list, slot, reply)
    except HAProxyError:
        return False
    return True


def _fail(batch: list[_Request], error: AgentError) -> None:
    for request in batch:
        if not request.future.done():
            request.future.set_exception(error)


@dataclass(frozen=True)
class HAProxyNames:
    """Names the generated haproxy.cfg gives to what the agent edits."""

    crt_list: str
    map_path: str
    usage_table: str
    usage_expire_ms: int


@dataclass
class LoadCounters:
    loads: int = 0
    recycles: int = 0
    map_only: int = 0
    failures: int = 0
    rotations: int = 0
    unloads: int = 0
    adoptions: int = 0
    resets: int = 0


class Loader:
    def __init__(
        self,
        client: RuntimeClient,
        pool: SlotPool,
        names: HAProxyNames,
        *,
        usage_refresh: float = 0.25,
        max_waiting: int = 256,
        batch: int = BATCH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.pool = pool
        self.names = names
        self.usage_refresh = usage_refresh
        self.max_waiting = max_waiting
        self.batch = batch
        self.counters = LoadCounters()
        self._clock = clock
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._queue: deque[_Request] = deque()
        self._drainer: asyncio.Task[None] | None = None
        self._usage: dict[str, float] = {}
        self._usage_at = float("-inf")
        self._retry_at = float("-inf")
        self._backoff = RECONNECT_MIN
        self._placeholder = pem.normalise_pem(placeholder())

    @property
    def identity(self) -> Identity | None:
        return self.client.identity

    # --- session -------------------------------------------------------------------

    async def sync(self) -> Identity:
        """Connect if needed and adopt what HAProxy holds; returns the HAProxy identity."""
        async with self._lock:
            return await self._ensure_session()

    async def reset(self, reason: str) -> None:
        """Forget the connection and the pool; the next load reconnects and adopts."""
        async with self._lock:
            log.info("HAProxy session reset: %s", reason)
            self.counters.resets += 1
            await self.client.close()
            self.pool.clear()
            self._usage, self._usage_at = {}, float("-inf")
            self._retry_at, self._backoff = float("-inf"), RECONNECT_MIN

    async def _ensure_session(self) -> Identity:
        if self.client.connected and self.client.identity is not None:
            return self.client.identity
        self.pool.clear()
        now = self._clock()
        if now < self._retry_at:
            raise HAProxyUnavailable(
                f"HAProxy runtime socket unreachable; next attempt in {self._retry_at - now:.2f}s"
            )
        try:
            identity = await self.client.connect()
            await self._adopt()
        except HAProxyError:
            await self.client.close()
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, RECONNECT_MAX)
            raise
        self._backoff = RECONNECT_MIN
        return identity

    async def _adopt(self) -> None:
        """Rebuild the pool from HAProxy: abort a stray transaction, read slots and map."""
        c = self.client
        certs = protocol.parse_show_ssl_cert(await c.execute("show", "ssl", "cert"))
        if certs.transaction is not None:
            log.warning("aborting stray certificate transaction on %s", certs.transaction)
            protocol.check_abort_cert(
                certs.transaction,
                await c.execute_cert("abort", "ssl", "cert", certs.transaction),
            )
        in_list = set(
            protocol.parse_show_crtlist(
                await c.execute("show", "ssl", "crt-list", self.names.crt_list)
            )
        )
        mapped: dict[str, list[str]] = {}
        for host, slot_name in protocol.parse_show_map(
            await c.execute("show", "map", self.names.map_path)
        ):
            mapped.setdefault(slot_name, []).append(host)
        now = self._clock()
        for name in certs.names:
            if not self.pool.is_slot_name(name):
                continue
            if name not in in_list:
                self.pool.add_spare(name)
                continue
            details = protocol.parse_cert_details(await c.execute("show", "ssl", "cert", name))
            if details.dns_names == (PLACEHOLDER_NAME,):
                self.pool.add_free(name)
                continue
            slot = Slot(name, details.fingerprint_sha1, None, set(mapped.pop(name, [])), now)
            if self.pool.for_fingerprint(slot.fingerprint) is not None:
                # Two slots with one certificate: keep one in the map, let LRU recycle the other.
                await self._unmap(slot)
                slot.fingerprint = f"duplicate:{name}"
            self.pool.place(slot)
        for stale_hosts in mapped.values():  # map entries pointing at no slot
            for host in stale_hosts:
                await self._del_map(host)
        self.counters.adoptions += 1
        log.info(
            "adopted %d slots (%d hosts mapped) from HAProxy pid %s",
            len(self.pool),
            sum(len(s.hosts) for s in self.pool.slots),
            c.identity.pid if c.identity else "?",
        )

    async def close(self) -> None:
        """Stop the batch writer (pending loads fail) and close the runtime connection."""
        if self._drainer is not None and not self._drainer.done():
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer
        _fail(list(self._queue), AgentError("the agent is stopping"))
        self._queue.clear()
        await self.client.close()

    # --- loads ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _writer(self, deadline: float, what: str) -> AsyncIterator[None]:
        """Hold the single-writer lock (Busy if not within ``deadline``), with a session."""
        if self._waiting >= self.max_waiting:
            raise Busy(f"{self._waiting} loads already waiting")
        self._waiting += 1
        try:
            await asyncio.wait_for(self._lock.acquire(), deadline)
        except TimeoutError as exc:
            raise Busy(f"{what} could not start within {deadline:.2f}s") from exc
        finally:
            self._waiting -= 1
        try:
            await self._ensure_session()
            yield
        except WrongTransaction:
            self.counters.failures += 1
            await self.client.close()  # reconnect + adopt aborts the foreign transaction
            raise
        except AgentError:
            self.counters.failures += 1
            raise
        finally:
            self._lock.release()

    async def install(
        self, host: str, certs: Sequence[StoredCertificate], start_deadline: float
    ) -> tuple[Slot, ...]:
        """Make HAProxy serve ``certs`` (e.g. ECDSA + RSA) for ``host``, then map the host.

        Loads queue behind the single writer, which takes them in batches: one
        pipelined write for every load of a batch instead of a round trip per
        command.  Busy if this load's batch cannot start within ``start_deadline``.
        """
        if not certs:
            raise ValueError("install needs at least one certificate")
        if len(self._queue) >= self.max_waiting:
            raise Busy(f"{len(self._queue)} loads already waiting")
        request = _Request(host, tuple(certs), asyncio.get_running_loop().create_future())
        self._queue.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="loader-batches")
        try:
            async with asyncio.timeout(start_deadline):
                await request.started.wait()
        except TimeoutError as exc:
            if not request.started.is_set():
                self._queue.remove(request)
                raise Busy(f"load of {host} could not start within {start_deadline:.2f}s") from exc
        return await request.future

    async def replace(self, slot_name: str, cert: StoredCertificate, deadline: float) -> bool:
        """Swap a rotated certificate into the slot that holds its predecessor.

        The hosts the new certificate no longer covers leave the map first.
        Returns False if the slot no longer exists (recycled meanwhile).
        """
        async with self._writer(deadline, f"rotation into {slot_name}"):
            slot = self.pool.get(slot_name)
            if slot is None:
                return False
            for host in sorted(slot.hosts):
                if not any(covers(p, host) for p in cert.bundle.names):
                    await self._del_map(host)
                    self.pool.unmap_host(host)
            await self._set_and_commit(slot.name, cert.bundle.pem)
            self.pool.recertify(slot, cert.bundle.fingerprint_sha1, cert.id)
            self.counters.rotations += 1
            return True

    async def unload(self, slot_name: str, deadline: float) -> bool:
        """Stop serving a slot's certificate: hosts leave the map, the placeholder goes in."""
        async with self._writer(deadline, f"unload of {slot_name}"):
            slot = self.pool.get(slot_name)
            if slot is None:
                return False
            await self._unmap(slot)
            await self._set_and_commit(slot.name, self._placeholder)
            self.pool.add_free(slot.name)
            self.counters.unloads += 1
            return True

    async def unmap(self, host: str, deadline: float) -> None:
        """Take ``host`` out of the map; its next connection asks the agent again."""
        async with self._writer(deadline, f"unmap of {host}"):
            if self.pool.is_mapped(host):
                await self._del_map(host)
                self.pool.unmap_host(host)

    async def _drain(self) -> None:
        """The single writer's load loop: batches from the queue until it is empty."""
        while self._queue:
            async with self._lock:
                batch = [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]
                for request in batch:
                    request.started.set()
                try:
                    await self._ensure_session()
                    await self._install_batch(batch)
                except WrongTransaction as exc:
                    await self.client.close()  # reconnect + adopt aborts the foreign transaction
                    _fail(batch, exc)
                except AgentError as exc:
                    _fail(batch, exc)
                finally:
                    failed = sum(1 for r in batch if r.future.done() and _failed(r.future))
                    self.counters.failures += failed
                    _fail(batch, AgentError("load abandoned"))  # anything left unanswered

    async def _install_batch(self, batch: list[_Request]) -> None:
        pool = self.pool
        todo: list[_Request] = []
        needed: dict[str, StoredCertificate] = {}  # fingerprint -> certificate to load
        for request in batch:
            current = pool.for_host(request.host)
            if current and {s.fingerprint for s in current} == request.fingerprints:
                request.future.set_result(current)
                continue
            todo.append(request)
            for cert in request.certs:
                fp = cert.bundle.fingerprint_sha1
                if pool.for_fingerprint(fp) is None:
                    needed.setdefault(fp, cert)
        keep = {
            s.name
            for r in todo
            for c in r.certs
            if (s := pool.for_fingerprint(c.bundle.fingerprint_sha1))
        }
        places = pool.growth(len(needed))
        victims = await self._pick_victims(len(needed) - len(places), keep)
        loads = [
            _Load(cert, name, state, None)
            for cert, (name, state) in zip(needed.values(), places, strict=False)
        ]
        loads += [
            _Load(cert, victim.name, SlotState.LISTED, victim)
            for cert, victim in zip(list(needed.values())[len(places) :], victims, strict=False)
        ]
        await self._run_loads(loads)
        # map every host whose certificates are all committed now, in one write
        commands: list[Command] = []
        mapped: list[tuple[_Request, tuple[Slot, ...]]] = []
        for request in todo:
            slots = tuple(pool.for_fingerprint(c.bundle.fingerprint_sha1) for c in request.certs)
            if any(s is None for s in slots):
                error = next(
                    (ld.error for ld in loads if ld.error and ld.cert in request.certs), None
                )
                request.future.set_exception(error or Busy("no slot free in this batch; retry"))
                continue
            ready = tuple(s for s in slots if s is not None)
            if pool.is_mapped(request.host):
                commands.append(Command(("del", "map", self.names.map_path, request.host)))
            commands.append(
                Command(("add", "map", self.names.map_path, request.host, ready[0].name))
            )
            mapped.append((request, ready))
            if not any(ld.cert in request.certs and ld.error is None for ld in loads):
                self.counters.map_only += 1  # e.g. a wildcard already loaded for a sibling
        replies = iter(await self.client.pipeline(commands))
        for request, ready in mapped:
            if pool.is_mapped(request.host):
                protocol.check_del_map("del map", next(replies))
            protocol.check_empty("add map", next(replies))
            pool.map_host(request.host, ready)
            request.future.set_result(ready)

    async def _run_loads(self, loads: list[_Load]) -> None:
        """Commit every load's certificate into its slot, in one pipelined write.

        Each load is ``[new ssl cert] set + commit + abort [+ add ssl crt-list]``,
        after a recycled slot's hosts leave the map and the usage table:
        the trailing abort closes the transaction of a failed commit, so no load
        of the batch can leak into the next one's transaction (the 2.6.12 merge),
        and HAProxy refuses to list a certificate store that is still empty, so a
        slot whose commit failed does not become a crt-list line.
        """
        if not loads:
            return
        commands: list[Command] = []
        for ld in loads:
            if ld.victim is not None:
                for host in sorted(ld.victim.hosts):
                    # out of the map, and its usage entry with it: the table then holds
                    # about one entry per loaded host, not every host of the last hour
                    commands += [
                        Command(("del", "map", self.names.map_path, host)),
                        Command(("clear", "table", self.names.usage_table, "key", host)),
                    ]
            if ld.state is SlotState.NEW:
                commands.append(Command(("new", "ssl", "cert", ld.slot)))
            commands += [
                Command(("set", "ssl", "cert", ld.slot), ld.cert.bundle.pem),
                Command(("commit", "ssl", "cert", ld.slot)),
                Command(("abort", "ssl", "cert", ld.slot)),
            ]
            if ld.state is not SlotState.LISTED:
                commands.append(Command(("add", "ssl", "crt-list", self.names.crt_list, ld.slot)))
        replies = iter(await self.client.pipeline(commands))
        stale: list[str] = []  # listed, but holding what an earlier agent left in the store
        for ld in loads:
            if ld.victim is not None:
                for _ in ld.victim.hosts:
                    protocol.check_del_map("del map", next(replies))
                    protocol.check_empty("clear table", next(replies))
                self.pool.drop_hosts(ld.victim)
            # read all of this load's replies before judging them, to stay aligned
            new_reply = next(replies) if ld.state is SlotState.NEW else None
            set_reply, commit_reply, _abort = next(replies), next(replies), next(replies)
            list_reply = next(replies) if ld.state is not SlotState.LISTED else None
            try:
                if new_reply is not None:
                    protocol.check_new_cert(ld.slot, new_reply)
                    self.pool.add_spare(ld.slot)
                protocol.check_set_cert(ld.slot, set_reply)
                protocol.check_commit_cert(ld.slot, commit_reply)
                if list_reply is not None:
                    protocol.check_add_crtlist(self.names.crt_list, ld.slot, list_reply)
            except WrongTransaction:
                raise
            except HAProxyError as exc:
                ld.error = exc
                log.error(
                    "loading %s into %s failed: %s", " ".join(ld.cert.bundle.names), ld.slot, exc
                )
                if list_reply is not None and _listed(self.names.crt_list, ld.slot, list_reply):
                    stale.append(ld.slot)
        for name in stale:
            # The commit failed but the line went in: the store was not empty (a spare
            # name from an earlier agent).  Serve the placeholder there, not its leftovers.
            await self._set_and_commit(name, self._placeholder)
            self.pool.add_free(name)
        now = self._clock()
        for ld in loads:
            if ld.error is not None:
                continue
            bundle = ld.cert.bundle
            self.pool.place(Slot(ld.slot, bundle.fingerprint_sha1, ld.cert.id, set(), now))
            self.counters.loads += 1
            if ld.victim is not None:
                self.counters.recycles += 1

    async def _pick_victims(self, count: int, keep: set[str]) -> list[Slot]:
        """The ``count`` least recently used slots, their usage re-read before they are taken.

        The table snapshot may be ``usage_refresh`` old; a host used since then
        must not lose its slot, so the candidates' own hosts are looked up afresh
        (``show table <t> key <host>``, pipelined) and, if any was used
        meanwhile, the choice is made again.
        """
        if count <= 0:
            return []
        seen = await self._last_seen()
        victims = self.pool.victims(count, seen, keep)
        for _ in range(MAX_VICTIM_CHECKS):
            hosts = sorted({h for v in victims for h in v.hosts})
            before = {v.name: recency(v, seen) for v in victims}
            replies = await self.client.pipeline(
                [Command(("show", "table", self.names.usage_table, "key", h)) for h in hosts]
            )
            now = self._clock()
            for reply in replies:
                entries = protocol.parse_show_table(reply)
                seen.update(
                    last_seen_from_table(
                        ((e.key, e.expire_ms) for e in entries), self.names.usage_expire_ms, now
                    )
                )
            if all(recency(v, seen) <= before[v.name] for v in victims):
                break
            victims = self.pool.victims(count, seen, keep)
        return victims

    async def _set_and_commit(self, name: str, pem: bytes) -> None:
        c = self.client
        try:
            protocol.check_set_cert(
                name, await c.execute_cert("set", "ssl", "cert", name, payload=pem)
            )
            protocol.check_commit_cert(name, await c.execute_cert("commit", "ssl", "cert", name))
        except WrongTransaction:
            raise
        except HAProxyError:
            await self._abort_quietly(name)
            raise

    async def _abort_quietly(self, name: str) -> None:
        if not self.client.connected:
            return
        try:
            reply = await self.client.execute_cert("abort", "ssl", "cert", name)
        except HAProxyError as exc:
            log.warning("abort ssl cert %s after a failed load: %s", name, exc)
            return
        log.info("aborted transaction on %s after a failed load: %s", name, reply[:120])

    async def _unmap(self, slot: Slot) -> None:
        """Every host ``slot`` serves leaves the map (before its certificate changes)."""
        for host in sorted(slot.hosts):
            await self._del_map(host)
        self.pool.drop_hosts(slot)

    async def _del_map(self, host: str) -> None:
        protocol.check_del_map(
            "del map", await self.client.execute("del", "map", self.names.map_path, host)
        )

    async def _last_seen(self) -> dict[str, float]:
        now = self._clock()
        if now - self._usage_at >= self.usage_refresh:
            reply = await self.client.execute("show", "table", self.names.usage_table)
            entries = protocol.parse_show_table(reply)
            self._usage = last_seen_from_table(
                ((e.key, e.expire_ms) for e in entries), self.names.usage_expire_ms, now
            )
            self._usage_at = now
        return self._usage

    async def still_current(self) -> bool:
        """True if the connection still talks to the HAProxy that serves new connections.

        After a reload the writer's connection keeps talking to the old worker
        until the watcher notices; a host the pool believes mapped but HAProxy
        asks about is the sign of that.
        """
        if self.client.identity is None:
            return False
        try:
            seen = await probe_identity(self.client.path, timeout=self.client.timeout)
        except HAProxyError:
            return False
        return seen == self.client.identity

    async def hits_by_host(self) -> dict[str, int]:
        """Connection counts per tracked host (for ``status``)."""
        async with self._lock:
            if not self.client.connected:
                return {}
            reply = await self.client.execute("show", "table", self.names.usage_table)
        return {e.key: e.conn_cnt or 0 for e in protocol.parse_show_table(reply)}
