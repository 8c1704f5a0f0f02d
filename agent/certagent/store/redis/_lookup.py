"""The Redis store's lookup: which records serve a hostname, in one or two round trips.

One round trip on a single Redis (plain or Sentinel): :data:`LOOKUP_SCRIPT` reads
the exact name's set, else its wildcard's, and each valid id's record (a
layout-2 string, or a layout-1 hash's ``chain``, ``key`` and ``ocsp``).  Two
pipelined round trips on a Redis Cluster, where the name sets and the records
live in different slots (the sets, then the records of the first set holding
an id; a third for layout-1 hashes among them), and for a user who may not run
scripts (``NOPERM``, logged once).  A layout-2 record's shared chain comes from
:class:`~._chains.Chains` (read once per chain and process: one more round trip
the first time).  Every id and record is re-validated and every key decrypted
here.  Cost per lookup: O(records of one name), whatever N.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence

import redis.asyncio
import redis.exceptions
from redis.commands.core import AsyncScript

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.errors import KeyDecryptError, StoreError
from certagent.store.base import StoredCertificate
from certagent.store.records import best_first, candidate_names, check_der_record, check_record
from certagent.store.redis._chains import Chains
from certagent.store.redis._connection import MAX_CONNECTIONS, redis_errors
from certagent.store.redis._layout import F_CHAIN, F_KEY, F_OCSP, Keys, to_bytes, to_text, valid_id
from certagent.store.redis._packed import Packed, unpack
from certagent.store.redis._rows import fetch, wrong_type
from certagent.store.unreadable import UnreadableRecords

__all__ = ["LOOKUP_SCRIPT", "Lookup", "wrong_type"]

log = logging.getLogger(__name__)

#: The lazy path's lookup in one round trip (EVALSHA).  KEYS: the name sets to try, in
#: order (the host, then its wildcard); ARGV: the record key prefix, then the fields.
#: Reply: ``{k, members_1 .. members_k [, ids, rows]}``: the members of each set examined
#: (or its error text, e.g. WRONGTYPE), stopping at the first set holding an id that
#: :func:`valid_id` accepts; then that set's valid ids and, for each, ``{record}`` (a
#: layout-2 string, in a list of one) or ``HMGET`` of the fields (a layout-1 hash, or no
#: record: a list of nils) or its error text.  The caller re-validates everything.
LOOKUP_SCRIPT = """
local prefix, examined = ARGV[1], {}
for i, key in ipairs(KEYS) do
  local members = redis.pcall('SMEMBERS', key)
  if members.err then
    examined[i] = members.err
  else
    examined[i] = members
    local ids, rows = {}, {}
    for _, id in ipairs(members) do
      if #id <= 64 and string.find(id, '^[A-Za-z0-9][A-Za-z0-9_.%-]*$') then
        ids[#ids + 1] = id
      end
    end
    if #ids > 0 then
      for j, id in ipairs(ids) do
        local record = redis.pcall('GET', prefix .. id)
        if type(record) == 'string' then
          rows[j] = {record}
        else
          local row = redis.pcall('HMGET', prefix .. id, unpack(ARGV, 2))
          if row.err then rows[j] = row.err else rows[j] = row end
        end
      end
      local out = {#examined}
      for _, m in ipairs(examined) do out[#out + 1] = m end
      out[#out + 1] = ids
      out[#out + 1] = rows
      return out
    end
  end
end
local out = {#examined}
for _, m in ipairs(examined) do out[#out + 1] = m end
return out
"""


class Lookup:
    """:meth:`RedisStore.lookup_all <certagent.store.redis.RedisStore.lookup_all>`."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        ring_for: Callable[[str], KeyRing],
        *,
        script: bool,
        unreadable: UnreadableRecords | None = None,
    ) -> None:
        self._client = client
        #: records that did not decrypt, by name and key id (``certagent status``)
        self.unreadable = unreadable if unreadable is not None else UnreadableRecords()
        self._keys = keys
        self._url = shown
        self._ring_for = ring_for
        self._chains = Chains(client, keys, shown)
        # one round trip; None on a cluster or once the server refused scripts
        self._script: AsyncScript | None = client.register_script(LOOKUP_SCRIPT) if script else None
        # a cluster client fails (MaxConnectionsError) rather than wait for a connection:
        # a storm of new hosts waits here instead, as it does in the plain client's pool
        self._gate = asyncio.Semaphore(MAX_CONNECTIONS) if not script else None

    async def all(self, hostname: str) -> tuple[StoredCertificate, ...]:
        names = candidate_names(hostname)
        with redis_errors(self._url, "lookup"):
            if self._script is not None:
                try:
                    chosen = await self._lookup_in_one_trip(self._script, names)
                except redis.exceptions.NoPermissionError as exc:
                    log.warning(
                        "%s: scripts are not allowed for this user (%s); lookups now take"
                        " two round trips: grant +evalsha +script|load for one",
                        self._url,
                        exc,
                    )
                    self._script = None
                    chosen = await self._lookup_in_two_trips(names)
            elif self._gate is not None:
                async with self._gate:
                    chosen = await self._lookup_in_two_trips(names)
            else:
                chosen = await self._lookup_in_two_trips(names)
            if chosen is None:
                return ()
            indexed_as, rows = chosen
            # a layout-2 record is unpacked once, here: its chain, then its opening need it
            packed = {cert_id: _unpacked(row) for cert_id, row in rows}
            await self._load_chains(packed.values())
        found = (
            self._open(names[0], indexed_as, cert_id, packed[cert_id] or row)
            for cert_id, row in rows
        )
        return best_first(stored for stored in found if stored is not None)

    async def _lookup_in_one_trip(
        self, script: AsyncScript, names: Sequence[str]
    ) -> tuple[str, list[tuple[str, object]]] | None:
        """:data:`LOOKUP_SCRIPT`: the first name set with a valid id, and its records."""
        reply = await script(
            keys=[self._keys.name(name) for name in names],
            args=[self._keys.cert(""), F_CHAIN, F_KEY, F_OCSP],
        )
        if not isinstance(reply, list) or not reply or not isinstance(reply[0], int):
            raise StoreError(f"{self._url}: lookup script gave an unexpected reply")
        examined, rest = reply[1 : 1 + reply[0]], reply[1 + reply[0] :]
        for name, members in zip(names, examined, strict=False):
            if isinstance(members, bytes):  # the error text of SMEMBERS
                members = redis.exceptions.ResponseError(to_text(members))
            ids = self._index_ids(name, set(members) if isinstance(members, list) else members)
            if not ids:
                continue
            script_rows = dict(zip(map(to_text, rest[0]), rest[1], strict=True)) if rest else {}
            rows: list[tuple[str, object]] = []
            for cert_id in ids:
                row = script_rows.get(cert_id)
                if isinstance(row, bytes):  # the error text of HMGET
                    row = redis.exceptions.ResponseError(to_text(row))
                rows.append((cert_id, row))
            return name, rows
        return None

    async def _lookup_in_two_trips(
        self, names: Sequence[str]
    ) -> tuple[str, list[tuple[str, object]]] | None:
        """Without scripts: the name sets in one pipeline, then the records in another."""
        async with self._client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.smembers(self._keys.name(name))
            sets = await pipe.execute(raise_on_error=False)
        for name, members in zip(names, sets, strict=True):
            ids = self._index_ids(name, members)
            if ids:
                rows = await fetch(
                    self._client, self._keys, ids, hash_fields=[F_CHAIN, F_KEY, F_OCSP]
                )
                return name, [
                    (i, [row] if isinstance(row, bytes) else row)
                    for i, row in zip(ids, rows, strict=True)
                ]
        return None

    async def _load_chains(self, records: Iterable[Packed | ValueError | None]) -> None:
        """Read the shared chains the layout-2 ``records`` name, if not cached."""
        digests: list[bytes] = []
        for packed in records:
            if isinstance(packed, Packed) and packed.chain_digest is not None:
                digests.append(packed.chain_digest)
        for problem in await self._chains.load(digests):
            log.warning("%s: %s", self._url, problem)

    def _index_ids(self, name: str, members: object) -> list[str]:
        """The valid ids of one ``name:`` set reply, sorted; warns about anything else."""
        if isinstance(members, redis.exceptions.ResponseError):
            if not wrong_type(members):
                raise members
            log.warning(
                "ignoring %s in %s: it is not a set (written by an older certagent?)",
                self._keys.name(name),
                self._url,
            )
            return []
        ids: list[str] = []
        for raw in members if isinstance(members, set) else ():
            cert_id = to_text(raw)
            if valid_id(cert_id):
                ids.append(cert_id)
            else:
                log.warning(
                    "ignoring %r in %s of %s: not a record id",
                    cert_id[:70],
                    self._keys.name(name),
                    self._url,
                )
        return sorted(ids)

    def _open(
        self, name: str, indexed_as: str, cert_id: str, row: object
    ) -> StoredCertificate | None:
        """Decrypt and check one record found for ``name``; None (and a warning) if unusable.

        ``row``: the script's (or a pipeline's) reply for the record, or the layout-2
        record already unpacked (:func:`_unpacked`).
        """
        if isinstance(row, Packed | ValueError):
            return self._open_packed(name, indexed_as, cert_id, row)
        if isinstance(row, redis.exceptions.ResponseError):
            if not wrong_type(row):
                raise StoreError(f"{self._url}: lookup failed: {row}") from row
            row = [None, None, None]
        if isinstance(row, list) and len(row) == 1:
            return self._open_packed(name, indexed_as, cert_id, to_bytes(row[0]) or b"")
        chain, token, ocsp = (to_bytes(v) for v in row) if isinstance(row, list) else (None,) * 3
        if chain is None or token is None:
            log.warning(
                "ignoring store record for %s: %s: %s lists %r, which is not a record",
                name,
                self._url,
                self._keys.name(indexed_as),
                cert_id,
            )
            return None
        ring = self._ring_for("read certificates")
        try:
            key = keycrypt.decrypt(ring, token, cert_id.encode("ascii"))
        except KeyDecryptError as exc:
            self._undecryptable(name, cert_id, token, exc)
            return None
        if self.unreadable:
            self.unreadable.readable(cert_id)
        return check_record(self._url, cert_id, name, chain, key, ocsp)

    def _open_packed(
        self, name: str, indexed_as: str, cert_id: str, raw: bytes | Packed | ValueError
    ) -> StoredCertificate | None:
        """A layout-2 record: its leaf and shared chain to PEM, its key decrypted to PEM.

        ``raw``: the record's bytes, or what :func:`_unpacked` made of them.
        """
        try:
            if isinstance(raw, ValueError):
                raise raw
            packed = raw if isinstance(raw, Packed) else unpack(raw)
        except ValueError as exc:
            log.warning(
                "ignoring store record for %s: %s: record %r (listed in %s) is corrupt: %s",
                name,
                self._url,
                cert_id,
                self._keys.name(indexed_as),
                exc,
            )
            return None
        chain = b""
        if packed.chain_digest is not None:
            cached = self._chains.pem(packed.chain_digest)
            if cached is None:
                log.warning(
                    "ignoring store record for %s: %s: record %r: its chain %s cannot be read",
                    name,
                    self._url,
                    cert_id,
                    self._keys.chain(packed.chain_digest),
                )
                return None
            chain = cached
        ring = self._ring_for("read certificates")
        try:
            key = packed.key_der(ring, cert_id)
        except KeyDecryptError as exc:
            self._undecryptable(name, cert_id, packed.key_token, exc)
            return None
        if self.unreadable:
            self.unreadable.readable(cert_id)
        return check_der_record(self._url, cert_id, name, packed.leaf_der, key, chain, packed.ocsp)

    def _undecryptable(self, name: str, cert_id: str, token: bytes, exc: Exception) -> None:
        kid = _token_kid(token)
        log.warning(
            "cannot decrypt store record %s for %s (data key %s) in %s: %s;"
            " answering as if the store lacked it",
            cert_id,
            name,
            kid or "none",
            self._url,
            exc,
        )
        self.unreadable.note(cert_id, name, kid, str(exc))


def _token_kid(token: bytes) -> str | None:
    """The data key a stored key's token names; None if it is not a token."""
    try:
        return keycrypt.token_kid(token)
    except KeyDecryptError:
        return None


def _unpacked(row: object) -> Packed | ValueError | None:
    """A layout-2 record's reply (a list of one string) unpacked, or why it cannot be;
    None for any other reply (a layout-1 hash's fields, an error)."""
    if not (isinstance(row, list) and len(row) == 1 and isinstance(row[0], bytes)):
        return None
    try:
        return unpack(row[0])
    except ValueError as exc:
        return exc
