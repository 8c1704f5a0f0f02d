"""The Redis store's lookup: which records serve a hostname, in one or two round trips.

One round trip on a single Redis (plain or Sentinel): :data:`LOOKUP_SCRIPT` reads
the exact name's set, else its wildcard's, and the ``chain``, ``key`` and
``ocsp`` of each valid id.  Two pipelined round trips on a Redis Cluster, where
the name sets and the records live in different slots (the sets, then the
records of the first set holding an id), and for a user who may not run
scripts (``NOPERM``, logged once).  Every id and record is re-validated and
every key decrypted here.  Cost per lookup: O(records of one name), whatever N.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import redis.asyncio
import redis.exceptions
from redis.commands.core import AsyncScript

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.errors import KeyDecryptError, StoreError
from certagent.store.base import StoredCertificate
from certagent.store.records import best_first, candidate_names, check_record
from certagent.store.redis._connection import MAX_CONNECTIONS, redis_errors
from certagent.store.redis._layout import F_CHAIN, F_KEY, F_OCSP, Keys, to_bytes, to_text, valid_id

__all__ = ["LOOKUP_SCRIPT", "Lookup", "wrong_type"]

log = logging.getLogger(__name__)

#: The lazy path's lookup in one round trip (EVALSHA).  KEYS: the name sets to try, in
#: order (the host, then its wildcard); ARGV: the record key prefix, then the fields.
#: Reply: ``{k, members_1 .. members_k [, ids, rows]}``: the members of each set examined
#: (or its error text, e.g. WRONGTYPE), stopping at the first set holding an id that
#: :func:`valid_id` accepts; then that set's valid ids and, for each, ``HMGET`` of the
#: fields (or its error text).  The caller re-validates everything it gets back.
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
        local row = redis.pcall('HMGET', prefix .. id, unpack(ARGV, 2))
        if row.err then rows[j] = row.err else rows[j] = row end
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
    ) -> None:
        self._client = client
        self._keys = keys
        self._url = shown
        self._ring_for = ring_for
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
        found = (self._open(names[0], indexed_as, cert_id, row) for cert_id, row in rows)
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
                async with self._client.pipeline(transaction=False) as pipe:
                    for cert_id in ids:
                        pipe.hmget(self._keys.cert(cert_id), [F_CHAIN, F_KEY, F_OCSP])
                    rows = await pipe.execute(raise_on_error=False)
                return name, list(zip(ids, rows, strict=True))
        return None

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
        """Decrypt and check one record found for ``name``; None (and a warning) if unusable."""
        if isinstance(row, redis.exceptions.ResponseError):
            if not wrong_type(row):
                raise StoreError(f"{self._url}: lookup failed: {row}") from row
            row = [None, None, None]
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
            log.warning(
                "ignoring store record for %s: %s: record %r: %s", name, self._url, cert_id, exc
            )
            return None
        return check_record(self._url, cert_id, name, chain, key, ocsp)


def wrong_type(exc: redis.exceptions.ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")
