"""The Redis store: reads here, writes by the strategy its constructor picks once.

One Redis (``redis://``, ``rediss://``, ``unix://``), the master a Sentinel set
names (``redis+sentinel://``) or a Redis Cluster (``redis+cluster://``); the
connections are :mod:`certagent.store.redis._connection`'s.  Key layout:
:mod:`certagent.store.redis._layout` (and docs/store.md, for operators).

Every write (add, replace, delete, an OCSP response) changes the record, its
name sets, the fingerprint index, both sorted sets and appends its event (the
record's names before and after).  How is the writer's
(:mod:`certagent.store.redis._writer`): one MULTI/EXEC on one Redis
(:class:`~certagent.store.redis._single.SingleNodeWriter`), ordered idempotent
steps on a cluster, where those keys live in several slots
(:class:`~certagent.store.redis._cluster.ClusterWriter`).  :meth:`RedisStore.bulk`
adds many records per round trip.  A lookup (:mod:`certagent.store.redis._lookup`)
is one round trip (two on a cluster, or for a user who may not run scripts).
Keys are decrypted with the :class:`~certagent.certs.keycrypt.KeyRing`
(``key_file``).  :meth:`RedisStore.changes` is
:class:`~certagent.store.redis._feed.StreamFeed`.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path

from certagent import __version__
from certagent.certs import hostname, keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.ocsp import OcspFacts
from certagent.certs.pem import CertBundle
from certagent.errors import (
    ConfigError,
    DuplicateCertificate,
    InvalidHostname,
    KeyDecryptError,
    NotFound,
    StoreCorrupt,
    StoreError,
)
from certagent.store.base import CertRecord, Change, IdTaken, Issuance, Page, StoredCertificate
from certagent.store.formats import check_known
from certagent.store.records import decode_cursor, encode_cursor
from certagent.store.redis._bulk import BulkAdds
from certagent.store.redis._cluster import ClusterWriter
from certagent.store.redis._connection import close_client, connect, redis_errors
from certagent.store.redis._feed import MAX_BLOCK, StreamFeed
from certagent.store.redis._fleet import RedisFleetBoard
from certagent.store.redis._fleetkeys import RedisFleetKeys
from certagent.store.redis._issuance import RedisAccounts, redis_issuance
from certagent.store.redis._layout import (
    DEFAULT_PREFIX,
    F_KEY,
    Keys,
    to_text,
    valid_id,
)
from certagent.store.redis._listing import list_ids
from certagent.store.redis._lookup import Lookup
from certagent.store.redis._records import (
    RecordEncoder,
    decode_record,
    expiry_score,
    tickets_event,
)
from certagent.store.redis._rekey import reencrypt_all
from certagent.store.redis._rows import Row, decode, fetch
from certagent.store.redis._single import SingleNodeWriter
from certagent.store.redis._snapshot import RedisSnapshotSlot
from certagent.store.redis._tickets import RedisTicketRing
from certagent.store.redis._writer import ATTEMPTS, Fence, FormatMoved, RecordWriter, Stored
from certagent.store.unreadable import UnreadableRecords
from certagent.store.url import CLUSTER_SCHEME, redact_url

__all__ = ["DEFAULT_EVENTS_MAXLEN", "RedisStore"]

log = logging.getLogger(__name__)

#: About this many events stay in the stream (``XADD MAXLEN ~``).
DEFAULT_EVENTS_MAXLEN = 100_000

_SCAN_BATCH = 500


def _now() -> datetime:
    """The clock, to the second as stored; tests replace this function."""
    return datetime.now(UTC).replace(microsecond=0)


class RedisStore:
    """A :class:`~certagent.store.base.Store` on Redis: one server, Sentinel or Cluster.

    It has every role: its ticket ring is the fleet's (:attr:`tickets`), it is
    its own :class:`~certagent.store.base.DataKeys`, and :meth:`bulk` adds many
    records per round trip.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        keyring: KeyRing | None = None,
        timeout: float = 2.0,
        health_check_interval: float = 15.0,
        events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
    ) -> None:
        if events_maxlen < 1:
            raise ConfigError("events_maxlen must be at least 1")
        self._url = redact_url(url)
        cluster = url.lower().startswith(f"{CLUSTER_SCHEME}://")
        try:
            self._keys = Keys(prefix, cluster=cluster)
        except ValueError as exc:
            raise ConfigError(f"redis_prefix {prefix!r}: {exc}") from exc
        self._ring = keyring
        self._client = connect(url, self._url, timeout, timeout, health_check_interval)
        # the one place the deployment's shape picks how records are written
        single = (
            None
            if cluster
            else SingleNodeWriter(self._client, self._keys, self._url, events_maxlen, __version__)
        )
        self._writer: RecordWriter = single or ClusterWriter(
            self._client, self._keys, self._url, events_maxlen
        )
        # the store's format (what every writer writes) and the fleet's board of nodes
        self._fleet = RedisFleetBoard(
            self._client, self._keys, self._url, __version__, self._ring_for
        )
        # One Redis checks the format in each write's transaction (a write encoded in a
        # format the store left is refused and encoded again), so the format last seen
        # is kept; a cluster's writers cannot check it there and read it for each write.
        self._cluster = cluster
        self._known_layout: int | None = None
        self._bulk = BulkAdds(
            self._writer, self._url, self._ring_for, lambda: _now(), self._layout, wire=single
        )
        self._tickets = RedisTicketRing(
            self._client, self._keys, self._url, self._ring_for, tickets_event
        )
        self._lookup = Lookup(
            self._client, self._keys, self._url, self._ring_for, script=not cluster
        )
        self._fleet_keys = RedisFleetKeys(self._client, self._keys, self._url)
        self._accounts = RedisAccounts(self._client, self._keys, self._url, self._ring_for)
        self._issuance = redis_issuance(
            self._client,
            self._keys,
            self._url,
            accounts=self._accounts,
            add=self._add_fenced,
            maxlen=events_maxlen,
            cluster=cluster,
        )
        # XREAD BLOCK holds its connection for up to MAX_BLOCK: give it its own pool,
        # whose socket timeout outlasts the block.
        self._feed = StreamFeed(
            self._client,
            connect(url, self._url, MAX_BLOCK + timeout, timeout, health_check_interval),
            self._keys,
            self._url,
            cluster=cluster,
        )

    @property
    def keys(self) -> Keys:
        return self._keys

    @property
    def keyring(self) -> KeyRing | None:
        return self._ring

    @property
    def tickets(self) -> RedisTicketRing:
        """The fleet's TLS ticket-key ring: :mod:`certagent.store.redis._tickets`."""
        return self._tickets

    # --- what it offers -----------------------------------------------------------------

    def ticket_ring(self, local_file: Path) -> RedisTicketRing:
        """The fleet's ring, shared by every agent on this Redis (``local_file`` is not used)."""
        return self._tickets

    def data_keys(self) -> RedisStore:
        """This store: private keys (and the ticket ring) are encrypted with ``key_file``."""
        return self

    def bulk(self) -> BulkAdds:
        """Many adds per round trip (``add_many``): :mod:`certagent.store.redis._bulk`."""
        return self._bulk

    def fleet(self) -> RedisFleetBoard:
        """The store's format and the fleet's board: :mod:`certagent.store.redis._fleet`."""
        return self._fleet

    def filter_snapshot(self) -> RedisSnapshotSlot:
        """The agents' name filter snapshot: one key (:mod:`certagent.store.redis._snapshot`)."""
        return RedisSnapshotSlot(self._client, self._keys, self._url)

    def issuance(self) -> Issuance:
        """The fleet's issuance roles, shared by every agent on this Redis.

        :mod:`certagent.store.redis._issuance` (account, registrations, limits),
        ``._leases``, ``._board`` and ``._renewals``; every key on the ``{global}``
        slot of a cluster.
        """
        return self._issuance

    # --- lifecycle ----------------------------------------------------------------------

    def describe(self) -> str:
        return self._url

    async def ping(self) -> None:
        with self._errors("ping"):
            await self._client.ping()

    async def close(self) -> None:
        with self._errors("close"):
            await close_client(self._client)
            await self._feed.close()

    # --- reads --------------------------------------------------------------------------

    async def lookup(self, hostname: str) -> StoredCertificate | None:
        found = await self.lookup_all(hostname)
        return found[0] if found else None

    async def lookup_all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        """:class:`~certagent.store.redis._lookup.Lookup`: one round trip, two on a cluster."""
        return await self._lookup.all(hostname)

    async def names(self) -> AsyncIterator[str]:
        """Every ``name:`` key's name, by SCAN (O(N), in batches; see Reader.names)."""
        with self._errors("names"):
            # on a cluster, scan_iter walks every master in turn
            async for key in self._client.scan_iter(
                match=self._keys.name_pattern(), count=_SCAN_BATCH
            ):
                try:
                    yield hostname.normalise_pattern(self._keys.name_of(to_text(key)))
                except InvalidHostname:
                    continue

    async def get(self, cert_id: str) -> CertRecord | None:
        if not valid_id(cert_id):
            return None
        with self._errors("get"):
            replies = await fetch(self._client, self._keys, [cert_id])
        row = self._row(cert_id, replies[0])
        return None if row is None else self._record(cert_id, row.meta)

    async def list(
        self,
        *,
        name: str | None = None,
        expiring_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
    ) -> Page:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = decode_cursor(cursor) if cursor is not None else None
        pattern = hostname.normalise_pattern(name) if name is not None else None
        before = expiry_score(expiring_before) if expiring_before is not None else None
        with self._errors("list"):
            found = await list_ids(self._client, self._keys, pattern, before, after, limit + 1)
            ids = found.ids
            rows = await fetch(self._client, self._keys, ids[:limit])
        records: builtins.list[CertRecord] = []
        for cert_id, reply in zip(ids, rows, strict=False):
            try:
                row = self._row(cert_id, reply)
                if row is None:
                    continue  # deleted since the index was read
                records.append(self._record(cert_id, row.meta))
            except StoreCorrupt as exc:
                log.warning("listing %s: %s", self._url, exc)
        if len(ids) > limit:
            return Page(tuple(records), encode_cursor(ids[limit - 1]))
        # a page the scan budget ended early (expiring_before): go on after the last id read
        return Page(tuple(records), None if found.read_to is None else encode_cursor(found.read_to))

    # --- writes: the writer's -------------------------------------------------------------

    async def put(self, bundle: CertBundle) -> str:
        added = await self._add(bundle, "put")
        return added if isinstance(added, str) else added.id  # str: already stored

    async def add(self, bundle: CertBundle) -> CertRecord:
        return self._added(bundle, await self._add(bundle, "add"))

    async def _add_fenced(self, bundle: CertBundle, fence: Fence, managed: str) -> CertRecord:
        """``add_issued``'s write (:mod:`._leases`): ``add``, committed while ``fence`` holds."""
        added = await self._add(bundle, "add an issued certificate", fence=fence, managed=managed)
        return self._added(bundle, added)

    def _added(self, bundle: CertBundle, added: CertRecord | str) -> CertRecord:
        if isinstance(added, str):
            raise DuplicateCertificate(
                f"this certificate (sha256 {bundle.fingerprint_sha256}) is already stored"
                f" as {added}; replace or delete that record instead"
            )
        return added

    async def _add(
        self, bundle: CertBundle, action: str, *, fence: Fence | None = None, managed: str = ""
    ) -> CertRecord | str:
        """Add ``bundle`` under a new id; or return the id already holding it.

        Encoded in the store's active format; one Redis checks it again in the write's
        transaction, and a record encoded in a format no longer active is encoded again.
        """
        ring = self._ring_for("store certificates")
        layout = await self._layout()
        with self._errors(action):
            for _ in range(ATTEMPTS):
                encoder = RecordEncoder(ring, layout=layout)
                prepared = encoder.prepare(bundle, _now(), managed=managed)
                got = await self._writer.add(prepared, fence)
                if isinstance(got, IdTaken):
                    continue  # draw another id
                if isinstance(got, FormatMoved):
                    layout = got.active  # finalized meanwhile
                    self._known_layout = None if self._cluster else layout
                    continue
                if isinstance(got, Stored):
                    return got.owner
                if isinstance(got, StoreError):
                    raise got
                log.info(
                    "stored certificate %s for %s (sha256 %s%s) in %s",
                    got.id,
                    " ".join(bundle.names),
                    bundle.fingerprint_sha256,
                    f", {managed}" if managed else "",
                    self._url,
                )
                return got
        raise StoreError(
            f"{self._url}: {action} {bundle.fingerprint_sha256[:16]}: the record kept changing;"
            " gave up"
        )

    async def replace(self, cert_id: str, bundle: CertBundle) -> CertRecord:
        ring = self._ring_for("store certificates")
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        layout = await self._layout()
        with self._errors("replace"):
            record = await self._writer.replace(ring, cert_id, bundle, _now(), layout)
        log.info(
            "replaced certificate %s (version %d) for %s (sha256 %s) in %s",
            cert_id,
            record.version,
            " ".join(bundle.names),
            bundle.fingerprint_sha256,
            self._url,
        )
        return record

    async def delete(self, cert_id: str) -> CertRecord:
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        with self._errors("delete"):
            old = await self._writer.delete(cert_id)
        log.info("deleted certificate %s for %s from %s", cert_id, " ".join(old.names), self._url)
        return old

    async def put_ocsp(self, cert_id: str, der: bytes, now: datetime) -> OcspFacts:
        """Check ``der`` for the record's leaf and keep it with the record (a ``put`` event)."""
        if not valid_id(cert_id):
            raise NotFound(f"{self._url}: no certificate {cert_id[:70]!r}")
        with self._errors("store an OCSP response"):
            return await self._writer.put_ocsp(cert_id, der, now)

    # --- data keys ----------------------------------------------------------------------

    async def rotate_keys(self) -> int:
        """Re-encrypt every key not made with the current data key: :mod:`._rekey`.

        The records' keys, the ticket-key ring and the ACME account keys; the
        count is of records and accounts.
        """
        ring = self._ring_for("rotate keys")
        layout = await self._layout()
        with self._errors("rotate keys"):
            rotated = await reencrypt_all(
                self._client, self._keys, self._url, ring, self._writer, layout
            )
        await self._tickets.reencrypt()
        return rotated + await self._accounts.reencrypt(ring)

    async def announce(self, node: str, key_ids: Sequence[str], ttl: float) -> None:
        """:mod:`._fleetkeys`: ``node`` holds ``key_ids`` for ``ttl`` s more (Redis's clock)."""
        await self._fleet_keys.announce(node, key_ids, ttl)

    async def withdraw(self, node: str) -> None:
        await self._fleet_keys.withdraw(node)

    async def fleet_key_ids(self) -> dict[str, frozenset[str]]:
        """The key ids each running agent announced: one round trip, O(nodes)."""
        return await self._fleet_keys.holders()

    def unreadable(self) -> UnreadableRecords:
        """The records this store's lookups could not decrypt (bounded)."""
        return self._lookup.unreadable

    async def key_ids_in_use(self, sample: int = 32) -> set[str]:
        """Data-key ids of ``sample`` random records and of the ticket ring: O(sample).

        What an agent checks at start against its key file (a node made with
        its own data key cannot decrypt the fleet's records).
        """
        with self._errors("sample the data keys in use"):
            picked = await self._client.zrandmember(self._keys.ids(), sample)
            ids = [to_text(i) for i in picked or ()]
            rows = await fetch(self._client, self._keys, ids)
            ring = await self._client.hmget(self._keys.tls_ring(), ["k0", "k1", "k2"])
        tokens: builtins.list[object] = []
        for reply in rows:
            with contextlib.suppress(ValueError):
                row = decode(reply)
                if row is not None:
                    tokens.append(row.packed.key_token if row.packed else row.fields.get(F_KEY))
        found = set()
        for token in [*tokens, *ring]:
            if isinstance(token, bytes):
                with contextlib.suppress(KeyDecryptError):
                    found.add(keycrypt.token_kid(token))
        return found

    # --- change feed --------------------------------------------------------------------

    async def changes(self, after: str | None, timeout: float) -> tuple[tuple[Change, ...], str]:
        with self._errors("changes"):
            return await self._feed.changes(after, timeout)

    # --- helpers ------------------------------------------------------------------------

    async def _layout(self) -> int:
        """The format a record written now takes: the store's active one (one round trip;
        on one Redis the last one seen, which each write checks in its transaction).

        StoreFormatError, naming the format and who set it, if this release does not know
        it: nothing is written.
        """
        if self._known_layout is not None:
            return self._known_layout
        state = await self._fleet.state()
        check_known(state, self._url, __version__)
        if not self._cluster:
            self._known_layout = state.number
        return state.number

    def _ring_for(self, action: str) -> KeyRing:
        if self._ring is None:
            raise ConfigError(
                f"{self._url}: cannot {action}: the Redis store encrypts private keys;"
                " configure key_file (create one with `certagent keys generate k1`)"
            )
        return self._ring

    def _row(self, cert_id: str, reply: object) -> Row | None:
        """A record's reply (:func:`~._rows.fetch`) decoded; StoreCorrupt if it is not one."""
        if isinstance(reply, Exception):
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} cannot be read: {reply}")
        try:
            return decode(reply)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} is corrupt: {exc}") from exc

    def _record(self, cert_id: str, fields: Mapping[str, bytes | None]) -> CertRecord:
        """A CertRecord from a hash's META_FIELDS; StoreCorrupt (naming the record) if invalid."""
        try:
            return decode_record(cert_id, fields)
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: record {cert_id!r} has bad metadata: {exc}") from exc

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)
