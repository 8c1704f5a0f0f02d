"""Puts certificates into HAProxy slots, keeping the usage table's "loaded" marks in step.

The loader is the only code that writes to HAProxy.  A load is a handful of
commands that must not interleave with another load (2.6.12 has one global
certificate transaction), so every write runs under one lock.  Loads wait in
two FIFO queues -- clients first, re-warming after a reload second -- and go
out in batches (:mod:`certagent.runtime.batch`); every command is built by
:mod:`certagent.runtime.protocol`.  A client's load that is not done within
its hold gets :class:`~certagent.errors.Busy`.

Mark discipline: a host is marked loaded (fe_sni's table, ``gpt0`` = its slot
number) only while its certificate is committed in that slot.  Recycling a
slot clears the old hosts' marks *before* the new certificate is committed,
and marks the new host only *after* the commit.  A mark only spares a
connection the trip to the agent; fe_tls picks the certificate by SNI, so a
lost mark costs one ensure, never a wrong certificate.

Costs: a batch of b loads is one or two round trips and O(b) commands, plus
a usage read of O(b + samples) keys when recycling, sent with the previous
batch when that was recycling too (:mod:`certagent.runtime.usage`); nothing
here grows with K except adoption, once per (re)connection, and
:meth:`Loader.hits_by_host`, on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from certagent.certs import pem
from certagent.certs.hostname import covers
from certagent.certs.selfsigned import placeholder
from certagent.certs.stored import StoredCertificate
from certagent.errors import (
    AgentError,
    Busy,
    HAProxyError,
    HAProxyUnavailable,
    StrayTransaction,
    WrongTransaction,
)
from certagent.runtime import protocol, recover, txn
from certagent.runtime.adopt import adopt
from certagent.runtime.batch import Load, judge, load_commands
from certagent.runtime.client import Identity, RuntimeClient, probe_identity
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.loadqueue import (
    LoadCounters,
    LoadRequest,
    Priority,
    fail_all,
    has_failed,
    retrieve,
)
from certagent.runtime.pool import Slot, SlotPool, SlotState
from certagent.runtime.recycles import RecycleLog
from certagent.runtime.usage import VictimChooser, parse_usage, read_usage, usage_commands

T = TypeVar("T")

log = logging.getLogger(__name__)

RECONNECT_MIN, RECONNECT_MAX = 0.05, 1.0  # reconnect backoff after a failed connection (s)
BATCH = 4  # default for how many queued loads go to HAProxy in one pipelined batch
REWARM_BATCH = 32  # re-warm loads per batch when no client's load is queued (after a reload)
RACE = 2.0  # a request for a host marked less than this long ago crossed its mark (s)


class Loader:
    """The single writer of one HAProxy.

    ``master_socket`` is HAProxy's master CLI, for the rare reload the loader
    asks for (:mod:`certagent.runtime.recover`; "" = SIGUSR2 to the worker's
    parent); ``on_reload`` is then called with the hosts to re-warm in the new
    worker.  ``on_session`` runs on every new HAProxy session, after adoption
    and under the writer's lock (ticket keys); its errors are logged.  ``recycles``
    counts hosts that come back after losing their slot (HTTP/3).
    """

    def __init__(
        self,
        client: RuntimeClient,
        pool: SlotPool,
        names: HAProxyNames,
        *,
        master_socket: str = "",
        on_reload: Callable[[list[str]], None] | None = None,
        on_session: Callable[[RuntimeClient], Awaitable[None]] | None = None,
        max_waiting: int = 10_000,
        batch: int = BATCH,
        chooser: VictimChooser | None = None,
        recycles: RecycleLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.pool = pool
        self.names = names
        self.master_socket = master_socket
        self.on_reload = on_reload
        self.on_session = on_session
        self.max_waiting = max_waiting
        self.batch = batch
        self.chooser = chooser or VictimChooser()
        self.recycles = recycles or RecycleLog(0.0)
        self.counters = LoadCounters()
        self._clock = clock
        self._lock = asyncio.Lock()
        self._queues: tuple[deque[LoadRequest], deque[LoadRequest]] = (deque(), deque())
        self._drainer: asyncio.Task[None] | None = None
        self._retry_at = float("-inf")
        self._backoff = RECONNECT_MIN
        self._placeholder = pem.normalise_pem(placeholder())

    @property
    def identity(self) -> Identity | None:
        return self.client.identity

    def waiting(self, priority: Priority | None = None) -> int:
        """Loads queued (of one priority, or all)."""
        if priority is None:
            return sum(len(q) for q in self._queues)
        return len(self._queues[priority])

    # --- session -------------------------------------------------------------------

    async def sync(self) -> Identity:
        """Connect if needed and adopt what HAProxy holds; returns the HAProxy identity."""
        async with self._lock:
            return await self._ensure_session()

    async def reset(self, reason: str) -> None:
        """Forget the connection and the pool; the next write reconnects and adopts."""
        async with self._lock:
            await self._reset(reason)

    async def _reset(self, reason: str) -> None:
        log.info("HAProxy session reset: %s", reason)
        self.counters.resets += 1
        await self.client.close()
        self.pool.clear()
        self.chooser.forget()
        self._retry_at, self._backoff = float("-inf"), RECONNECT_MIN

    async def switch_worker(self, reason: str) -> list[str]:
        """HAProxy was reloaded: move to the new worker; the old one's hosts, hottest first.

        A stopping HAProxy worker empties its stick tables at once, so the order
        comes from the agent's own knowledge: each slot's load time and the
        latest use read while choosing victims (O(K log K), once per reload).
        """
        async with self._lock:
            slots = sorted(
                self.pool.slots, key=lambda s: (max(s.loaded_at, s.seen_at), s.name), reverse=True
            )
            hosts = list(dict.fromkeys(h for s in slots for h in sorted(s.hosts)))
            self._fail_rewarm(AgentError("HAProxy was reloaded"))
            await self._reset(reason)
            await self._ensure_session()
            return hosts

    async def _ensure_session(self) -> Identity:
        if self.client.connected and self.client.identity is not None:
            return self.client.identity
        self.pool.clear()
        self.chooser.forget()
        now = self._clock()
        if now < self._retry_at:
            raise HAProxyUnavailable(
                f"HAProxy runtime socket unreachable; next attempt in {self._retry_at - now:.2f}s"
            )
        try:
            identity = await self.client.connect()
            try:
                await adopt(self.client, self.pool, self.names, self._clock())
            except StrayTransaction as exc:
                identity = await self._recover(exc)
            self.counters.adoptions += 1
            if self.on_session is not None:
                await self._session_hook(self.on_session)
        except HAProxyError:
            await self.client.close()
            self._retry_at = now + self._backoff
            self._backoff = min(self._backoff * 2, RECONNECT_MAX)
            raise
        self._backoff = RECONNECT_MIN
        return identity

    async def _session_hook(self, hook: Callable[[RuntimeClient], Awaitable[None]]) -> None:
        try:
            await hook(self.client)
        except HAProxyUnavailable:
            raise
        except AgentError as exc:
            log.warning("setting up the new HAProxy session: %s", exc)

    async def exclusive(
        self, work: Callable[[RuntimeClient], Awaitable[T]], deadline: float, what: str
    ) -> T:
        """Run ``work`` with the runtime socket to itself (the single writer), in session."""
        async with self._writer(deadline, what):
            return await work(self.client)

    async def _recover(self, stray: StrayTransaction) -> Identity:
        """Reload HAProxy (never touch the transaction), adopt the new worker, re-warm it."""
        identity, hosts = await recover.reload_and_adopt(
            self.client, self.pool, self.names, stray, self._clock, self.master_socket
        )
        self.counters.recoveries += 1
        if self.on_reload is not None:
            self.on_reload(hosts)
        return identity

    async def close(self) -> None:
        """Stop the batch writer (pending loads fail) and close the runtime connection."""
        if self._drainer is not None and not self._drainer.done():
            self._drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer
        for queue in self._queues:
            fail_all(list(queue), AgentError("the agent is stopping"))
            queue.clear()
        await self.client.close()

    def _fail_rewarm(self, error: AgentError) -> None:
        queue = self._queues[Priority.REWARM]
        fail_all(list(queue), error)
        queue.clear()

    # --- loads ---------------------------------------------------------------------

    async def install(
        self,
        host: str,
        certs: Sequence[StoredCertificate],
        hold: float,
        *,
        priority: Priority = Priority.CLIENT,
    ) -> tuple[Slot, ...]:
        """Make HAProxy serve ``certs`` (e.g. ECDSA + RSA) for ``host``, then mark the host.

        The load waits its turn in ``priority``'s queue (clients before
        re-warming, each first come first served); Busy if it is not done
        within ``hold`` seconds, or if :attr:`max_waiting` loads already wait.
        A load that HAProxy has started still completes after a Busy.
        """
        if not certs:
            raise ValueError("install needs at least one certificate")
        if self.waiting() >= self.max_waiting:
            self.counters.busy += 1
            raise Busy(f"{self.waiting()} loads already waiting", "queue")
        request = LoadRequest(host, tuple(certs), asyncio.get_running_loop().create_future())
        request.future.add_done_callback(retrieve)
        queue = self._queues[priority]
        queue.append(request)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name="loader-batches")
        try:
            async with asyncio.timeout(hold):
                return await asyncio.shield(request.future)
        except TimeoutError as exc:
            if not request.started:
                queue.remove(request)
                request.future.cancel()
            self.counters.busy += 1
            raise Busy(f"load of {host} not done within its hold of {hold:.1f}s") from exc

    async def remark(self, host: str, deadline: float) -> bool:
        """HAProxy asked for a host in a slot: mark it loaded again if the mark may be gone.

        A request that left fe_sni's table lookup just before the host was
        marked is a race, not a lost mark: within ``RACE`` seconds of the mark
        nothing is written.  Otherwise the entry expired (idle past the table's
        expire) or was purged (table full), and is written again.  True if the
        host is in a slot (its connection is served).
        """
        marked = self.pool.marked_at(host)
        if marked is None:
            return False
        if self._clock() - marked < RACE:
            return True
        async with self._writer(deadline, f"mark of {host}"):
            slots = self.pool.for_host(host)
            number = self.pool.slot_number(slots[0].name) if slots else None
            if number is None:
                return False
            command = protocol.set_mark(self.names.usage_table, host, number)
            protocol.check_set_mark(await self.client.execute(command))
            self.pool.remarked(host, self._clock())
            self.counters.remarks += 1
            return True

    async def mark_covered(self, host: str, slot: Slot, deadline: float) -> bool:
        """Mark ``host`` loaded in ``slot``, whose (wildcard) certificate already covers it.

        No store lookup, no certificate: one ``set table``.  False if the slot
        was recycled meanwhile.
        """
        async with self._writer(deadline, f"mark of {host}"):
            number = self.pool.slot_number(slot.name)
            if self.pool.get(slot.name) is not slot or number is None:
                return False
            command = protocol.set_mark(self.names.usage_table, host, number)
            protocol.check_set_mark(await self.client.execute(command))
            self.pool.mark_host(host, (slot,), self._clock())
            self.counters.mark_only += 1
            return True

    @contextlib.asynccontextmanager
    async def _writer(self, deadline: float, what: str) -> AsyncIterator[None]:
        """Hold the single-writer lock (Busy if not within ``deadline``), with a session."""
        try:
            await asyncio.wait_for(self._lock.acquire(), deadline)
        except TimeoutError as exc:
            raise Busy(f"{what} could not start within {deadline:.2f}s") from exc
        try:
            await self._ensure_session()
            yield
        except WrongTransaction:
            self.counters.failures += 1
            await self.client.close()  # reconnect + adopt deals with the foreign transaction
            raise
        except AgentError:
            self.counters.failures += 1
            raise
        finally:
            self._lock.release()

    async def replace(self, slot_name: str, cert: StoredCertificate, deadline: float) -> bool:
        """Swap a rotated certificate into the slot that holds its predecessor.

        The hosts the new certificate no longer covers are unmarked first.
        Returns False if the slot no longer exists (recycled meanwhile).
        """
        async with self._writer(deadline, f"rotation into {slot_name}"):
            slot = self.pool.get(slot_name)
            if slot is None:
                return False
            names = cert.bundle.names
            gone = [h for h in sorted(slot.hosts) if not any(covers(p, h) for p in names)]
            await self._unmark(gone)
            await self._commit(slot.name, cert.bundle.pem, cert.ocsp)
            self.pool.recertify(slot, cert.bundle.fingerprint_sha1, cert.id, cert.bundle.names)
            slot.ocsp = cert.ocsp
            self.counters.rotations += 1
            return True

    async def staple(self, slot_name: str, ocsp: bytes, deadline: float) -> bool:
        """Staple ``ocsp`` (already checked) for the slot's certificate; False if gone."""
        async with self._writer(deadline, f"stapling for {slot_name}"):
            slot = self.pool.get(slot_name)
            if slot is None or slot.ocsp == ocsp:
                return False
            if slot.ocsp is not None:
                await txn.replace_ocsp(self.client, ocsp)
            else:  # the first response: HAProxy sets stapling up at a commit
                await self._commit(slot.name, None, ocsp)
            slot.ocsp = ocsp
            self.counters.staples += 1
            return True

    async def unload(self, slot_name: str, deadline: float) -> bool:
        """Stop serving a slot's certificate: hosts unmarked, the placeholder goes in."""
        async with self._writer(deadline, f"unload of {slot_name}"):
            slot = self.pool.get(slot_name)
            if slot is None:
                return False
            await self._unmark(sorted(slot.hosts))
            await self._commit(slot.name, self._placeholder)
            self.pool.add_free(slot.name)
            self.counters.unloads += 1
            return True

    async def unmark(self, host: str, deadline: float) -> None:
        """Unmark ``host``; its next connection asks the agent again."""
        async with self._writer(deadline, f"unmark of {host}"):
            if self.pool.is_marked(host):
                await self._unmark([host])

    def _unmarks(self, hosts: Sequence[str]) -> list[protocol.Command]:
        return [c for h in hosts for c in protocol.unmark(self.names.usage_table, h)]

    async def _unmark(self, hosts: Sequence[str]) -> None:
        if not hosts:
            return
        replies = iter(await self.client.pipeline(self._unmarks(hosts)))
        for host in hosts:
            protocol.check_unmark(replies)
            self.pool.unmark_host(host)

    async def _drain(self) -> None:
        """The single writer's load loop: batches from the queues until both are empty."""
        while any(self._queues):
            async with self._lock:
                batch: list[LoadRequest] = []
                for priority, queue in zip(Priority, self._queues, strict=True):
                    # re-warm loads alone go out in bigger batches: no client waits on them
                    alone = priority == Priority.REWARM and not batch
                    limit = max(REWARM_BATCH, self.batch) if alone else self.batch
                    while queue and len(batch) < limit:
                        request = queue.popleft()
                        if not request.future.done():
                            request.started = True
                            batch.append(request)
                if not batch:
                    continue
                try:
                    await self._ensure_session()
                    await self._install_batch(batch)
                except WrongTransaction as exc:
                    await self.client.close()  # reconnect + adopt handles the foreign one
                    fail_all(batch, exc)
                except AgentError as exc:
                    fail_all(batch, exc)
                finally:
                    failed = sum(1 for r in batch if r.future.done() and has_failed(r.future))
                    self.counters.failures += failed
                    fail_all(batch, AgentError("load abandoned"))  # anything left unanswered

    async def _install_batch(self, batch: list[LoadRequest]) -> None:
        pool = self.pool
        todo: list[LoadRequest] = []
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
        certs = list(needed.values())
        places = pool.growth(len(certs))
        victims = await self._victims(len(certs) - len(places), keep)
        loads = [Load(c, n, state, None) for c, (n, state) in zip(certs, places, strict=False)]
        loads += [
            Load(c, v.name, SlotState.LISTED, v)
            for c, v in zip(certs[len(places) :], victims, strict=False)
        ]
        await self._write(todo, loads)

    async def _victims(self, count: int, keep: set[str]) -> list[Slot]:
        if count <= 0:
            return []
        chosen = self.chooser.choose_ahead(self.pool, count, keep, self._clock())
        if chosen is not None:
            return chosen
        candidates = self.chooser.candidates(self.pool, count, keep)
        read_at = self._clock()
        usage = await read_usage(
            self.client,
            self.names.usage_table,
            self.names.usage_expire_ms,
            (h for s in candidates for h in s.hosts),
            read_at,
        )
        return self.chooser.choose(candidates, count, usage, read_at)

    async def _write(self, todo: list[LoadRequest], loads: list[Load]) -> None:
        """Commit every load, then mark every host of ``todo``: one pipelined write.

        HAProxy runs the marks after the commits, so a host is marked only once its
        certificates are in place; a host whose load failed is unmarked again at
        once (one more round trip, only then).
        """
        pool = self.pool
        target = {ld.cert.bundle.fingerprint_sha1: ld.slot for ld in loads}
        marks: list[tuple[LoadRequest, list[str]]] = []
        commands = load_commands(self.names, loads)
        sent_loads = len(commands)
        for request in todo:
            where: list[str] = []
            for cert in request.certs:
                fp = cert.bundle.fingerprint_sha1
                held = pool.for_fingerprint(fp)
                name = held.name if held is not None else target.get(fp)
                if name is not None:
                    where.append(name)
            number = pool.slot_number(where[0]) if where else None
            if number is None or len(where) != len(request.certs):
                request.future.set_exception(Busy("no slot free in this batch; retry", "slots"))
                continue
            marks.append((request, where))
            commands.append(protocol.set_mark(self.names.usage_table, request.host, number))
        # Recycling: read the next choice's candidates in the same write (usage.py).
        recycled = sum(1 for ld in loads if ld.victim is not None)
        ahead = self.chooser.draw_ahead(pool, recycled, (ld.slot for ld in loads))
        read = len(commands)
        commands += usage_commands(self.names.usage_table, ahead)
        replies = await self.client.pipeline(commands)
        if recycled:
            now = self._clock()
            usage = parse_usage(replies[read:], self.names.usage_expire_ms, now)
            self.chooser.read_ahead(usage, now)
        await self._placed(loads, replies[:sent_loads])
        failed: list[str] = []
        for (request, where), reply in zip(marks, replies[sent_loads:read], strict=True):
            protocol.check_set_mark(reply)
            ready = tuple(s for n in where if (s := pool.get(n)) is not None)
            expected = [c.bundle.fingerprint_sha1 for c in request.certs]
            if [s.fingerprint for s in ready] != expected:
                failed.append(request.host)
                error = next(
                    (ld.error for ld in loads if ld.error and ld.cert in request.certs), None
                )
                request.future.set_exception(error or Busy("the load failed; retry", "load"))
                continue
            if not any(ld.cert in request.certs for ld in loads):
                self.counters.mark_only += 1  # e.g. a wildcard already loaded for a sibling
            pool.mark_host(request.host, ready, self._clock())
            self.recycles.loaded(request.host, self._clock())
            request.future.set_result(ready)
        if failed:
            await self._unmark_quietly(failed)

    async def _placed(self, loads: list[Load], replies: Sequence[str]) -> None:
        """Judge the loads' replies and record in the pool what HAProxy now holds."""
        if not loads:
            return
        now = self._clock()
        for victim in (ld.victim for ld in loads if ld.victim is not None):
            self.recycles.recycled(victim.hosts, now - max(victim.loaded_at, victim.seen_at), now)
            self.pool.drop_hosts(victim)
        verdict = judge(self.names, loads, replies)
        for name in verdict.created:
            self.pool.add_spare(name)
        for name in verdict.stale:
            # The commit failed but the line went in: the store was not empty (a spare
            # name from an earlier agent).  Serve the placeholder there, not its leftovers.
            await self._commit(name, self._placeholder)
            self.pool.add_free(name)
        for ld in loads:
            if ld.error is not None:
                continue
            bundle = ld.cert.bundle
            self.pool.place(
                Slot(
                    ld.slot,
                    bundle.fingerprint_sha1,
                    ld.cert.id,
                    set(),
                    now,
                    names=bundle.names,
                    ocsp=ld.cert.ocsp,
                )
            )
            self.chooser.loaded(self.pool, ld.slot, now)
            self.counters.loads += 1
            if ld.victim is not None:
                self.counters.recycles += 1

    async def _unmark_quietly(self, hosts: Sequence[str]) -> None:
        """Unmark hosts whose load failed after their mark went out in the same write."""
        try:
            replies = iter(await self.client.pipeline(self._unmarks(hosts)))
            for _ in hosts:
                protocol.check_unmark(replies)
        except HAProxyError as exc:
            log.warning("unmarking %s after a failed load: %s", " ".join(hosts), exc)

    async def _commit(self, name: str, pem: bytes | None, ocsp: bytes | None = None) -> None:
        """One certificate transaction on slot ``name`` (the batch's, sent on its own)."""
        await txn.commit(self.client, protocol.Transaction(name, pem, ocsp))

    # --- questions -------------------------------------------------------------------

    async def still_current(self) -> bool:
        """True if the connection still talks to the HAProxy that serves new connections.

        After a reload the writer's connection keeps talking to the old worker;
        only a fresh connection reaches the new one.
        """
        if self.client.identity is None:
            return False
        try:
            seen = await probe_identity(self.client.path, timeout=self.client.timeout)
        except HAProxyError:
            return False
        return seen == self.client.identity

    async def hits_by_host(self) -> dict[str, int]:
        """Connection counts per loaded host (for ``status``; O(K), on demand)."""
        async with self._lock:
            if not self.client.connected:
                return {}
            reply = await self.client.execute(protocol.show_marked(self.names.usage_table))
        return {e.key: e.conn_cnt or 0 for e in protocol.parse_show_table(reply)}
