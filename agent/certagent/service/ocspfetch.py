"""Fetching OCSP responses from the certificates' own responders (AIA), when due.

A certificate loaded into HAProxy whose leaf names an OCSP responder (AIA,
http) is scheduled: at once if the store has no response for it, else halfway
to the stored response's nextUpdate (:func:`~certagent.certs.ocsp.refresh_at`),
plus up to 10 % of that wait at random so the agents of a fleet do not all ask
at once.  When it is due the agent reads the record again (another agent may
have fetched meanwhile: then it only reschedules), asks the responder (POST,
``application/ocsp-request``, 5 s, 16 KiB at most), checks the answer like an
upload and stores it; the store's change feed then makes every agent staple it.

Cost: a heap entry per loaded certificate with a responder (O(log K) per
schedule), nothing at rest but one timer, and at most :data:`RATE` fetches a
second.  Certificates that left HAProxy are dropped when their turn comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from cryptography import x509

from certagent.certs.ocsp import (
    MAX_BYTES,
    OcspFacts,
    build_request,
    check_response,
    issuer_of,
    refresh_at,
    responder_url,
)
from certagent.errors import AgentError, OcspError
from certagent.runtime.pool import SlotPool
from certagent.store.base import Store, StoredCertificate

__all__ = ["OcspFetcher"]

log = logging.getLogger(__name__)

#: Fetches a second at most, and at once.
RATE = 10.0
CONCURRENCY = 4
TIMEOUT = 5.0
RETRY = 600.0  # a responder that failed is asked again this much later (s)


@dataclass
class FetchCounters:
    scheduled: int = 0
    fetched: int = 0
    failed: int = 0
    skipped: int = 0  # another agent had fetched meanwhile, or the certificate left


def _utcnow() -> datetime:
    return datetime.now(UTC)


class OcspFetcher:
    def __init__(
        self,
        store: Store,
        pool: SlotPool,
        *,
        now: Callable[[], datetime] = _utcnow,
        post: Callable[[str, bytes], Awaitable[bytes]] | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.counters = FetchCounters()
        self._now = now
        self._post = post
        self._heap: list[tuple[float, int, str, str, str | None]] = []  # due, seq, id, host, sha
        self._due: dict[str, float] = {}  # cert id -> when it is scheduled
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    def status(self) -> dict[str, object]:
        return {"queued": len(self._due), **vars(self.counters)}

    # --- scheduling -----------------------------------------------------------------

    def loaded(self, host: str, certs: Sequence[StoredCertificate]) -> None:
        """``certs`` now serve ``host`` in HAProxy: schedule those with a responder."""
        for cert in certs:
            if cert.id in self._due or cert.bundle.ocsp_url is None:
                continue
            self._schedule(cert.id, host, cert.ocsp, self._when(cert.ocsp, cert))

    def _when(self, ocsp: bytes | None, cert: StoredCertificate) -> float:
        """Unix time to fetch for ``cert`` holding ``ocsp`` (None: now)."""
        if ocsp is None:
            return time.time()
        chain = x509.load_pem_x509_certificates(cert.bundle.pem)
        try:
            facts = check_response(ocsp, chain, self._now())
        except OcspError:
            return time.time()  # stale or unusable: fetch a good one
        return self._after(facts)

    def _schedule(self, cert_id: str, host: str, ocsp: bytes | None, due: float) -> None:
        sha = hashlib.sha256(ocsp).hexdigest() if ocsp is not None else None
        heapq.heappush(self._heap, (due, next(self._seq), cert_id, host, sha))
        self._due[cert_id] = due
        self.counters.scheduled += 1
        self._wake.set()

    # --- the worker -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch what is due, at most :data:`RATE` a second, until ``stop`` is set."""
        running: set[asyncio.Task[None]] = set()
        gate = asyncio.Semaphore(CONCURRENCY)
        try:
            while not stop.is_set():
                wait = self._heap[0][0] - time.time() if self._heap else 3600.0
                if wait > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(_first(stop, self._wake), wait)
                    continue
                _, _, cert_id, host, sha = heapq.heappop(self._heap)
                self._due.pop(cert_id, None)
                await gate.acquire()
                task = asyncio.create_task(self._turn(cert_id, host, sha))
                running.add(task)
                task.add_done_callback(running.discard)
                task.add_done_callback(lambda _: gate.release())
                await asyncio.sleep(1.0 / RATE)
        finally:
            for task in running:
                task.cancel()
            if self._session is not None:
                await self._session.close()

    async def _turn(self, cert_id: str, host: str, sha: str | None) -> None:
        if not self.pool.for_certificate(cert_id):
            self.counters.skipped += 1
            return  # no longer loaded here
        try:
            found = [c for c in await self.store.lookup_all(host) if c.id == cert_id]
            if not found:
                self.counters.skipped += 1
                return
            cert = found[0]
            current = hashlib.sha256(cert.ocsp).hexdigest() if cert.ocsp is not None else None
            if current != sha:  # another agent (or an upload) brought a new one
                self.counters.skipped += 1
                self._schedule(cert_id, host, cert.ocsp, self._when(cert.ocsp, cert))
                return
            der, facts = await self._fetch(cert)
            self.counters.fetched += 1
            self._schedule(cert_id, host, der, self._after(facts))
            log.info(
                "fetched an OCSP response for %s (%s, next update %s)",
                cert_id,
                facts.status,
                facts.next_update.isoformat() if facts.next_update else "none",
            )
        except (AgentError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.counters.failed += 1
            log.warning(
                "OCSP fetch for %s (%s) failed: %s; retrying in %.0f s", cert_id, host, exc, RETRY
            )
            self._retry(cert_id, host, sha)

    def _retry(self, cert_id: str, host: str, sha: str | None) -> None:
        heapq.heappush(self._heap, (time.time() + RETRY, next(self._seq), cert_id, host, sha))
        self._due[cert_id] = time.time() + RETRY

    def _after(self, facts: OcspFacts) -> float:
        """Unix time of the next fetch after ``facts``: halfway to nextUpdate, spread."""
        now = self._now()
        at = refresh_at(facts, now).timestamp()
        wait = max(0.0, at - now.timestamp())
        return at + random.uniform(0.0, wait / 10)  # noqa: S311 - spreading, not secrecy

    async def _fetch(self, cert: StoredCertificate) -> tuple[bytes, OcspFacts]:
        chain = x509.load_pem_x509_certificates(cert.bundle.pem)
        url = responder_url(chain[0])
        if url is None:  # pragma: no cover - scheduled only with a responder
            raise OcspError("the certificate names no OCSP responder")
        request = build_request(chain[0], issuer_of(chain))
        post = self._post or self._http_post
        der = await post(url, request)
        return der, await self.store.put_ocsp(cert.id, der, self._now())

    async def _http_post(self, url: str, body: bytes) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT), trust_env=False
            )
        async with self._session.post(
            url, data=body, headers={"Content-Type": "application/ocsp-request"}
        ) as reply:
            if reply.status != 200:
                raise OcspError(f"the OCSP responder {url} answered HTTP {reply.status}")
            data = await reply.content.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise OcspError(f"the OCSP responder {url} sent over {MAX_BYTES} bytes")
        return data


async def _first(*events: asyncio.Event) -> None:
    """Return when any of ``events`` is set."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
