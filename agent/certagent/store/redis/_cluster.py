"""Writes on a Redis Cluster: ordered, idempotent steps instead of one MULTI/EXEC.

On a cluster a record (``cert:{id}``), its name sets (``name:{host}``), its
fingerprint (``fp:{sha256}``) and the shared keys (``{global}:ids``, ``expiry``,
``events``) live in different slots, so a write cannot be one transaction.
Each write is a sequence of steps, each step atomic on one slot (one command,
a one-key Lua script, or MULTI/EXEC on the ``{global}`` slot), ordered so that
a reader never finds a name pointing at a missing or half-written record:

* **add**: the shared chain (``chain:{sha256}``, its own slot) -> the record
  (written whole by one script, only if the id is
  free) -> claim ``fp:`` (compare-and-set; a loser deletes its record and reports
  the duplicate) -> the name sets -> ``ids`` + ``expiry`` + the ``put`` event
  (one MULTI on ``{global}``: the commit point); a **fenced add** (``add_issued``)
  commits with :data:`FENCED_COMMIT` instead, one script on ``{global}`` that
  checks the issuance lease (also on ``{global}``) first;
* **replace**: claim the new ``fp:`` and write the chain -> the record replaced
  whole by :data:`~._rows.SWAP` (in the store's active format, whatever it was),
  only if it is still the one read (optimistic locking, as WATCH does on one
  Redis), which also keeps the names it drops in the record (``D``) -> add the
  new names -> remove the dropped ones -> release the old ``fp:``
  -> ``expiry`` + the ``put`` event -> forget the dropped names;
* **delete**: release ``fp:`` -> remove the names -> ``ids`` + ``expiry`` + the
  ``delete`` event -> drop the renewal entries of the names left without a
  record (:mod:`._renewals`) -> the record last.

Replace, delete and the completion of an unfinished add hold the record's
write lock (``lock:{id}``, SET NX PX 10 s, in the record's slot): the writers of
one record take turns, as WATCH makes them on one Redis.

Every step is idempotent, so a retry after a crash midway converges: an add
retried finds its leaf in ``fp:`` with a record that is not in ``ids`` yet
and completes it (names, commit); a replace or delete retried re-reads the
record, ``names_dropped`` included, and does every step again.  A crash
between an add's first two steps leaves a record nothing points to (invisible:
no name, not in ``ids``).  Readers may meanwhile see a record whose
certificate does not cover a name being removed: it is checked, logged and
not served, as any such record.

Cost: an add is 5 round trips per batch of records (one per step, each a
cluster pipeline); a replace or delete about 7; O(names) commands each.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import redis.asyncio
import redis.exceptions

from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts, check_for_chain
from certagent.certs.pem import CertBundle
from certagent.errors import NotFound, StoreCorrupt, StoreError
from certagent.store.base import CertRecord, IdTaken, PreparedRecord
from certagent.store.records import make_record
from certagent.store.redis._chains import chain_of
from certagent.store.redis._clusterscripts import CLAIM, FENCED_COMMIT, RELEASE, SET_IF, WRITE_NEW
from certagent.store.redis._layout import (
    F_CHAIN,
    F_KEY,
    F_NAMES,
    F_NOT_AFTER,
    F_SHA256,
    Keys,
    to_bytes,
    to_text,
    valid_id,
)
from certagent.store.redis._packed import chain_digest, is_packed
from certagent.store.redis._records import (
    EventKind,
    decode_record,
    decode_record_time,
    encode_as,
    encode_event,
    expiry_score,
    parse_names,
)
from certagent.store.redis._renewals import UNSCHEDULE
from certagent.store.redis._rows import (
    SWAP,
    Row,
    decode,
    fetch,
    hash_state,
    read_one,
    state_of,
)
from certagent.store.redis._writer import ATTEMPTS, AddOutcome, Fence, Stored, duplicate
from certagent.store.renewing import format_time

__all__ = [
    "CLAIM",
    "FENCED_COMMIT",
    "LOCK_SECONDS",
    "RELEASE",
    "SET_IF",
    "WRITE_NEW",
    "ClusterWriter",
]

log = logging.getLogger(__name__)

#: How long a record's write lock lasts if its holder dies, and how long a writer waits for it.
LOCK_SECONDS = 10.0
LOCK_WAIT = 3.0


class ClusterWriter:
    """A :class:`~certagent.store.redis._writer.RecordWriter` for a Redis Cluster.

    redis-py's connection errors escape (the store translates them); a Redis
    error on one record's step becomes that record's StoreError.
    """

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str, maxlen: int) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._maxlen = maxlen

    # --- add --------------------------------------------------------------------------

    async def add(self, prepared: PreparedRecord, fence: Fence | None = None) -> AddOutcome:
        """One new record: :meth:`add_batch` of one, or :meth:`_add_fenced`."""
        if fence is not None:
            return await self._add_fenced(prepared, fence)
        (outcome,) = await self.add_batch([prepared])
        return outcome

    async def _add_fenced(self, prepared: PreparedRecord, fence: Fence) -> AddOutcome:
        """An add whose commit (:data:`FENCED_COMMIT`) checks the lease in the same script.

        The steps of an add, the last one fenced.  If the lease is gone at the
        commit, the name sets, the fingerprint and the record are taken back
        (in that order) and the record was never in ``ids`` nor in the feed.
        The caller made the lease last the write out first
        (:data:`~certagent.store.issuing.HOLD_SECONDS`), so this happens only
        if the lease key itself was lost (a failover to a replica without it);
        until the names are taken back, a lookup may find the record through
        them, as during any add between its third step and its commit.
        """
        keys, record = self._keys, prepared.record
        fp, cert_key = keys.fingerprint(record.fingerprint_sha256), keys.cert(record.id)
        owner = to_text(await self._client.get(fp))
        if owner and await self._sha256_of(owner) == record.fingerprint_sha256:
            return Stored(owner)
        if prepared.shared:
            await self._client.set(keys.chain(chain_digest(prepared.shared)), prepared.shared)
        written = await self._client.eval(
            WRITE_NEW, 1, cert_key, prepared.payload, *prepared.fields
        )
        if written == 0:
            return IdTaken(prepared)
        claimed = await self._client.eval(CLAIM, 1, fp, owner, record.id)
        if claimed != 1:
            await self._client.delete(cert_key)
            return Stored(to_text(claimed))
        names = list(dict.fromkeys(record.names))
        await self._run([("sadd", keys.name(n), record.id) for n in names])
        schedule_keys: list[str] = []
        schedule_args: list[str] = []
        if fence.renew is not None:
            schedule_keys = [keys.renewals(), keys.renewal_entries()]
            schedule_args = [fence.renew.name, fence.renew.score, fence.renew.member]
        reply = await self._client.eval(
            FENCED_COMMIT,
            4 + len(schedule_keys),
            fence.key,
            keys.ids(),
            keys.expiry(),
            keys.events(),
            *schedule_keys,
            fence.value,
            record.id,
            repr(prepared.expiry),
            str(self._maxlen),
            " ".join(names),
            *schedule_args,
        )
        if isinstance(reply, list) and reply and reply[0] == 1:
            return record
        await self._run([("srem", keys.name(n), record.id) for n in names])
        await self._client.eval(RELEASE, 1, fp, record.id)
        await self._client.delete(cert_key)
        holder = reply[1] if isinstance(reply, list) and len(reply) > 1 else None
        return fence.lost(to_bytes(holder))

    async def add_batch(self, records: Sequence[PreparedRecord]) -> list[AddOutcome]:
        """Add new records (fresh ids), in order; a leaf stored already gives Stored."""
        keys = self._keys
        out: list[AddOutcome | None] = [None] * len(records)
        fps = [keys.fingerprint(p.record.fingerprint_sha256) for p in records]
        owners = [
            to_text(o) if to_bytes(o) else "" for o in await self._run([("get", k) for k in fps])
        ]
        held = [i for i, owner in enumerate(owners) if owner]
        rows = await fetch(self._client, keys, [owners[i] for i in held])
        scores = await self._run([("zscore", keys.ids(), owners[i]) for i in held])
        expected = {i: "" for i, owner in enumerate(owners) if not owner}
        unfinished: set[str] = set()
        for i, reply, score in zip(held, rows, scores, strict=True):
            if _sha256(reply) != records[i].record.fingerprint_sha256:
                expected[i] = owners[i]  # a stale claim: take it over
                continue
            out[i] = Stored(owners[i])
            if score is None:  # an add that did not finish (or is still running)
                unfinished.add(owners[i])
        todo = sorted(expected)
        chains = {chain_digest(records[i].shared): records[i].shared for i in todo}
        await self._run(  # before any record naming them
            [("set", keys.chain(digest), chain) for digest, chain in chains.items() if chain]
        )
        written = await self._run(
            [
                (
                    "eval",
                    WRITE_NEW,
                    keys.cert(records[i].record.id),
                    records[i].payload,
                    *records[i].fields,
                )
                for i in todo
            ]
        )
        claim: list[int] = []
        for i, reply in zip(todo, written, strict=True):
            if reply == 1:
                claim.append(i)
            elif reply == 0:
                out[i] = IdTaken(records[i])
            else:
                out[i] = self._failed(records[i].record, reply)
        claimed = await self._run(
            [("eval", CLAIM, fps[i], expected[i], records[i].record.id) for i in claim]
        )
        won: list[int] = []
        lost: list[int] = []
        for i, reply in zip(claim, claimed, strict=True):
            if reply == 1:
                won.append(i)
            elif isinstance(reply, bytes):
                out[i] = Stored(to_text(reply))
                lost.append(i)
            else:
                out[i] = self._failed(records[i].record, reply)
                lost.append(i)
        named = [(records[i].record.id, records[i].record.names) for i in won]
        await self._run(
            [("sadd", keys.name(name), cert_id) for cert_id, ns in named for name in ns]
            + [("delete", keys.cert(records[i].record.id)) for i in lost]
        )
        commits = [(records[i].record.id, records[i].expiry, records[i].record.names) for i in won]
        if commits:
            await self._global(
                [
                    cmd
                    for cert_id, score, ns in commits
                    for cmd in (
                        ("zadd", keys.ids(), {cert_id: 0}),
                        ("zadd", keys.expiry(), {cert_id: score}),
                        self._event("put", cert_id, ns),
                    )
                ]
            )
        for owner in sorted(unfinished):
            await self._finish_add(owner)
        for i in won:
            out[i] = records[i].record
        return [o if o is not None else StoreError(f"{self._url}: add: no result") for o in out]

    async def _finish_add(self, cert_id: str) -> None:
        """Complete an add that stopped after claiming its leaf: names, then the commit."""
        keys = self._keys
        async with self._locked(cert_id):
            (reply,) = await fetch(self._client, keys, [cert_id])
            (score,) = await self._run([("zscore", keys.ids(), cert_id)])
            row = _decoded(reply)
            if score is not None or row is None or row.meta[F_NOT_AFTER] is None:
                return  # finished meanwhile, or deleted
            names, not_after = row.meta[F_NAMES], row.meta[F_NOT_AFTER]
            assert not_after is not None
            found = parse_names(names)
            await self._run([("sadd", keys.name(name), cert_id) for name in found])
            await self._global(
                [
                    ("zadd", keys.ids(), {cert_id: 0}),
                    ("zadd", keys.expiry(), {cert_id: decode_record_time(not_after)}),
                    self._event("put", cert_id, found),
                ]
            )
        log.warning("completed the unfinished add of record %s in %s", cert_id, self._url)

    @asynccontextmanager
    async def _locked(self, cert_id: str) -> AsyncIterator[None]:
        """Hold the record's write lock (``lock:{id}``, SET NX PX): one writer per record.

        Waits up to :data:`LOCK_WAIT` seconds for another agent's write; a lock
        left by a writer that died expires after :data:`LOCK_SECONDS`.
        """
        key, token = self._keys.record_lock(cert_id), secrets.token_hex(8)
        deadline = time.monotonic() + LOCK_WAIT
        while not await self._client.set(key, token, nx=True, px=int(LOCK_SECONDS * 1000)):
            if time.monotonic() > deadline:
                raise StoreError(
                    f"{self._url}: record {cert_id} is being written by another agent;"
                    " try again in a few seconds"
                )
            await asyncio.sleep(0.02)
        try:
            yield
        finally:
            await self._client.eval(RELEASE, 1, key, token)

    # --- replace ----------------------------------------------------------------------

    async def replace(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime, layout: int
    ) -> CertRecord:
        """Replace record ``cert_id`` with ``bundle``, in store format ``layout``; its id
        kept, its version + 1."""
        async with self._locked(cert_id):
            return await self._replace(ring, cert_id, bundle, now, layout)

    async def _replace(
        self, ring: KeyRing, cert_id: str, bundle: CertBundle, now: datetime, layout: int
    ) -> CertRecord:
        keys = self._keys
        cert_key = keys.cert(cert_id)
        new_fp = keys.fingerprint(bundle.fingerprint_sha256)
        for _ in range(ATTEMPTS):
            old, dropped_before, state = await self._read(cert_id)
            owner = to_text(await self._client.get(new_fp))
            if (
                owner
                and owner != cert_id
                and await self._sha256_of(owner) == bundle.fingerprint_sha256
            ):
                raise duplicate(bundle.fingerprint_sha256, owner, "delete that record first")
            claimed = await self._client.eval(CLAIM, 1, new_fp, owner, cert_id)
            if claimed != 1:
                raise duplicate(bundle.fingerprint_sha256, to_text(claimed), "delete it first")
            record = make_record(cert_id, bundle, version=old.version + 1, updated_at=now)
            dropped = [
                n for n in dict.fromkeys([*old.names, *dropped_before]) if n not in bundle.names
            ]
            encoded = encode_as(layout, ring, record, bundle, dropped=dropped)
            if encoded.chain:
                await self._client.set(keys.chain(chain_digest(encoded.chain)), encoded.chain)
            done = await self._client.eval(
                SWAP, 1, cert_key, state, encoded.payload, *encoded.fields
            )
            if done == -1:
                raise NotFound(f"{self._url}: no certificate {cert_id!r}")
            if done != 1:
                continue  # replaced meanwhile: read it again
            await self._run([("sadd", keys.name(n), cert_id) for n in bundle.names])
            await self._run([("srem", keys.name(n), cert_id) for n in dropped])
            if old.fingerprint_sha256 != bundle.fingerprint_sha256:
                old_fp = keys.fingerprint(old.fingerprint_sha256)
                await self._client.eval(RELEASE, 1, old_fp, cert_id)
            await self._global(
                [
                    ("zadd", keys.ids(), {cert_id: 0}),
                    ("zadd", keys.expiry(), {cert_id: expiry_score(bundle.not_after)}),
                    self._event("put", cert_id, [*bundle.names, *old.names, *dropped]),
                ]
            )
            if dropped:
                final = encode_as(layout, ring, record, bundle)
                written = (
                    hash_state(encoded.fields) if encoded.fields else state_of(encoded.payload)
                )
                await self._client.eval(SWAP, 1, cert_key, written, final.payload, *final.fields)
            return record
        raise StoreError(f"{self._url}: replace {cert_id}: the record kept changing; gave up")

    # --- delete -----------------------------------------------------------------------

    async def delete(self, cert_id: str) -> CertRecord:
        async with self._locked(cert_id):
            return await self._delete(cert_id)

    async def _delete(self, cert_id: str) -> CertRecord:
        keys = self._keys
        old, dropped, _ = await self._read(cert_id)
        fp = keys.fingerprint(old.fingerprint_sha256)
        await self._client.eval(RELEASE, 1, fp, cert_id)
        names = list(dict.fromkeys([*old.names, *dropped]))
        left = await self._run(
            [
                cmd
                for n in names
                for cmd in (("srem", keys.name(n), cert_id), ("exists", keys.name(n)))
            ]
        )
        await self._global(
            [
                ("zrem", keys.ids(), cert_id),
                ("zrem", keys.expiry(), cert_id),
                self._event("delete", cert_id, names),
            ]
        )
        await self._unschedule(
            old, [n for n, held in zip(names, left[1::2], strict=True) if held == 0]
        )
        await self._client.delete(keys.cert(cert_id))
        return old

    async def _unschedule(self, old: CertRecord, orphans: Sequence[str]) -> None:
        """Drop the renewal entries of ``orphans`` (names no record holds now), but only
        those about ``old``'s certificate or an older one: a renewal that stored a newer
        certificate for a name meanwhile keeps its entry.  No script unless one is scheduled.
        """
        if not orphans:
            return
        entries = await self._client.hmget(self._keys.renewal_entries(), list(orphans))
        scheduled = [n for n, e in zip(orphans, entries, strict=True) if e is not None]
        if scheduled:
            await self._client.eval(
                UNSCHEDULE,
                2,
                self._keys.renewals(),
                self._keys.renewal_entries(),
                format_time(old.not_after.timestamp()),
                *scheduled,
            )

    # --- single-record updates --------------------------------------------------------

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` against the record's chain, keep it, then the ``put`` event."""
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        cert_key = self._keys.cert(cert_id)
        row = await self._row(cert_key, [F_CHAIN])
        if row is None:
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        chain = await chain_of(self._client, self._keys, self._url, cert_id, row)
        facts = check_for_chain(chain, der, now)
        if row.packed is not None:
            stored = await self._client.eval(
                SWAP, 1, cert_key, row.state, row.packed.with_fields(O=der)
            )
        else:
            sha = row.meta[F_SHA256] or b""
            stored = await self._client.eval(SET_IF, 1, cert_key, F_SHA256, sha, "ocsp", der)
        if stored != 1:
            raise StoreError(
                f"{self._url}: certificate {cert_id} changed while its OCSP response was stored;"
                " check the response against the new certificate and try again"
            )
        names = row.meta[F_NAMES]
        await self._global([self._event("put", cert_id, list(parse_names(names)))])
        return facts

    async def set_key(self, cert_id: str, token: bytes, fresh: bytes) -> bool:
        """Swap a record's encrypted key if it still holds ``token`` (``keys rotate``).

        ``token`` a whole layout-2 record: the record is swapped for ``fresh``.
        """
        cert_key = self._keys.cert(cert_id)
        if is_packed(token):
            done = await self._client.eval(SWAP, 1, cert_key, state_of(token), fresh)
        else:
            done = await self._client.eval(SET_IF, 1, cert_key, F_KEY, token, F_KEY, fresh)
        return bool(done == 1)

    # --- helpers ----------------------------------------------------------------------

    async def _read(self, cert_id: str) -> tuple[CertRecord, tuple[str, ...], bytes]:
        """The record, the names a replace dropped, and its state (for :data:`~._rows.SWAP`)."""
        row = await self._row(self._keys.cert(cert_id))
        if row is None:
            raise NotFound(f"{self._url}: no certificate {cert_id!r}")
        try:
            record = decode_record(cert_id, row.meta)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} has bad metadata: {exc}") from exc
        return record, parse_names(row.dropped), row.state

    async def _row(self, cert_key: str, extra: Sequence[str] = ()) -> Row | None:
        try:
            return await read_one(self._client, cert_key, extra)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: {cert_key} is not a record: {exc}") from exc

    async def _sha256_of(self, cert_id: str) -> str | None:
        """The leaf SHA-256 of record ``cert_id``; None if it is gone or unreadable."""
        (reply,) = await fetch(self._client, self._keys, [cert_id])
        return _sha256(reply)

    def _event(self, kind: EventKind, cert_id: str, names: Sequence[str]) -> tuple[Any, ...]:
        return ("xadd", self._keys.events(), encode_event(kind, cert_id, names))

    async def _run(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Commands in one cluster pipeline (one round trip per node, nodes in parallel)."""
        if not commands:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for name, *args in commands:
                self._queue(pipe, name, args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(
                reply, redis.exceptions.ResponseError
            ):
                raise reply
            if isinstance(reply, (redis.exceptions.AskError, redis.exceptions.TryAgainError)):
                raise reply
        return replies

    async def _global(self, commands: Sequence[tuple[Any, ...]]) -> None:
        """Commands on the ``{global}`` slot, in one MULTI/EXEC."""
        async with self._client.pipeline(transaction=True) as pipe:
            for name, *args in commands:
                self._queue(pipe, name, args)
            await pipe.execute()

    def _queue(self, pipe: Any, name: str, args: list[Any]) -> None:
        if name == "eval":
            script, *rest = args
            pipe.eval(script, 1, *rest)
        elif name == "xadd":
            pipe.xadd(*args, maxlen=self._maxlen, approximate=True)
        elif name == "zadd":
            pipe.zadd(*args)
        else:
            getattr(pipe, name)(*args)

    def _failed(self, record: CertRecord, reply: object) -> StoreError:
        return StoreError(f"{self._url}: add {record.fingerprint_sha256[:16]}: failed: {reply}")


def _decoded(reply: object) -> Row | None:
    """A fetched record, or None if it is gone, unreadable or not a record."""
    if isinstance(reply, Exception):
        return None
    try:
        return decode(reply)
    except ValueError:
        return None


def _sha256(reply: object) -> str | None:
    row = _decoded(reply)
    sha = row.meta[F_SHA256] if row is not None else None
    return sha.decode("ascii", "replace") if sha else None
