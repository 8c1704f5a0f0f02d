"""The bulk add's Lua script and its call: one record's ``EVALSHA``, as values or as bytes.

Pure, no I/O.  :class:`~certagent.store.redis._single.SingleNodeWriter` sends
the call through redis-py (:func:`script_keys`, :func:`script_args`); the
import's worker processes pack it whole instead (:class:`AddCall`, hiredis's C
packer: redis-py's asyncio connection packs every argument in Python, ≈40 %
of the importing process's CPU before), so the importing process only joins
and sends bytes.  Both give Redis the same command.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

import hiredis

from certagent.certs.keycrypt import KeyRing, Sealer
from certagent.certs.pem import CertBundle
from certagent.store.base import CertRecord, PreparedRecord, WireRecord
from certagent.store.redis._layout import Keys
from certagent.store.redis._packed import chain_digest, pack_upload, seconds

__all__ = [
    "ADDED",
    "ADD_SCRIPT",
    "ADD_SHA",
    "FIXED_KEYS",
    "FORMAT_MOVED",
    "ID_TAKEN",
    "STORED",
    "WRONG_TYPE",
    "AddCall",
    "WirePacker",
    "script_args",
    "script_keys",
]

#: Adds one record (EVALSHA).  KEYS: 1 the fingerprint key, 2 the record's key, 3 the
#: ``ids`` and 4 ``expiry`` sorted sets, 5 the events stream, 6 the shared chain's key (the
#: record's key again when it has none), 7 the store's format (``format``), 8.. the record's
#: name sets.  ARGV: 1 the id, 2 the expiry score, 3 the stream's MAXLEN, 4 the event's
#: names, 5 the record (format 2: one string; '' for format 1), 6 the chain ('' none), 7
#: the store format the record is encoded in, 8.. (format 1) the hash's fields and values
#: in turn.  Reply: ``{1}`` added; ``{0, id}`` the leaf is already stored as ``id``; ``{2}``
#: the id is taken (draw another); ``{3, key, type}`` a key holds the wrong type; ``{4,
#: format}`` the store is at another format now (``fleet finalize`` ran: encode it again);
#: nothing is written but with ``{1}``.  The chain is written only if it is not there with
#: those bytes.
ADD_SCRIPT = """
local id = ARGV[1]
local function wrong(key, want)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= want then return {3, key, kind} end
end
local bad = wrong(KEYS[1], 'string') or wrong(KEYS[3], 'zset')
  or wrong(KEYS[4], 'zset') or wrong(KEYS[5], 'stream') or wrong(KEYS[7], 'hash')
if not bad and ARGV[6] ~= '' then bad = wrong(KEYS[6], 'string') end
if bad then return bad end
for i = 8, #KEYS do
  bad = wrong(KEYS[i], 'set')
  if bad then return bad end
end
local active = redis.call('HGET', KEYS[7], 'format') or '1'
if active ~= ARGV[7] then return {4, active} end
local owner = redis.call('GET', KEYS[1])
if owner then return {0, owner} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {2} end
if ARGV[6] ~= '' and redis.call('GET', KEYS[6]) ~= ARGV[6] then
  redis.call('SET', KEYS[6], ARGV[6])
end
if ARGV[5] == '' then
  redis.call('HSET', KEYS[2], unpack(ARGV, 8))
else
  redis.call('SET', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[1], id)
for i = 8, #KEYS do redis.call('SADD', KEYS[i], id) end
redis.call('ZADD', KEYS[3], 0, id)
redis.call('ZADD', KEYS[4], ARGV[2], id)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*',
  'kind', 'put', 'id', id, 'names', ARGV[4])
return {1}
"""

#: What Redis names the script (SHA-1 of its text, as ``SCRIPT LOAD`` answers).
ADD_SHA = hashlib.sha1(ADD_SCRIPT.encode(), usedforsecurity=False).hexdigest()

ADDED, STORED, ID_TAKEN, WRONG_TYPE, FORMAT_MOVED = 1, 0, 2, 3, 4
#: The keys before the name sets in :data:`ADD_SCRIPT`'s KEYS.
FIXED_KEYS = 7


def script_keys(keys: Keys, prepared: PreparedRecord) -> list[str]:
    """The KEYS of :data:`ADD_SCRIPT` for ``prepared``, in its order."""
    return _keys(keys, prepared.record, prepared.shared)


def script_args(prepared: PreparedRecord, events_maxlen: int) -> list[bytes | str]:
    """The ARGV of :data:`ADD_SCRIPT` for ``prepared``, in its order."""
    return [
        *_args(prepared.record, prepared.payload, prepared.expiry, prepared.shared, events_maxlen),
        str(prepared.layout),
        *prepared.fields,
    ]


@dataclass(frozen=True)
class AddCall:
    """Packs :data:`ADD_SCRIPT`'s ``EVALSHA`` for a record: picklable, for worker processes."""

    keys: Keys
    events_maxlen: int

    def command(self, record: CertRecord, payload: bytes, expiry: float, shared: bytes) -> bytes:
        """The RESP bytes of the call for a format-2 record, as redis-py would send them."""
        keys = _keys(self.keys, record, shared)
        args = [*_args(record, payload, expiry, shared, self.events_maxlen), "2"]
        # hiredis's stub types the argument as a 1-tuple; it takes any number
        packed: bytes = hiredis.pack_command(("EVALSHA", ADD_SHA, len(keys), *keys, *args))  # type: ignore[arg-type]
        return packed


class WirePacker:
    """A new upload's packed call, in one pass from its checked bundle: for the import's workers.

    The bytes :meth:`AddCall.command` gives for the record
    ``RecordEncoder.prepare`` makes (same id, same nonce), without the record,
    its dict of fields or the keys and arguments as lists of their own, the
    cipher set up once, the shared chain's digest and key made once per chain.
    Not thread-safe (its caches): one per process.
    """

    def __init__(self, call: AddCall, ring: KeyRing) -> None:
        self._keys = call.keys
        self._seal = Sealer(ring).seal
        self._fixed = (call.keys.ids(), call.keys.expiry(), call.keys.events())
        self._format = call.keys.store_format()
        self._maxlen = str(call.events_maxlen)
        self._digests: dict[bytes, bytes] = {}
        self._chain_keys: dict[bytes, str] = {}
        self._updated: tuple[datetime | None, bytes] = (None, b"")

    def __repr__(self) -> str:
        return f"WirePacker({self._keys!r})"

    def wire(self, bundle: CertBundle, updated_at: datetime, cert_id: str) -> WireRecord:
        """``bundle`` as a new record ``cert_id`` (version 1, updated at ``updated_at``)."""
        if updated_at is not self._updated[0]:
            self._updated = (updated_at, seconds(updated_at))
        record, chain, digest = pack_upload(
            self._seal, cert_id, bundle, self._updated[1], self._digests
        )
        keys, names = self._keys, bundle.names
        cert_key = keys.cert(cert_id)
        chain_key = cert_key if digest is None else self._chain_key(digest)
        # hiredis's stub types the argument as a 1-tuple; it takes any number
        command: bytes = hiredis.pack_command(
            (  # type: ignore[arg-type]
                "EVALSHA", ADD_SHA, FIXED_KEYS + len(names),
                keys.fingerprint(bundle.fingerprint_sha256), cert_key, *self._fixed, chain_key,
                self._format, *[keys.name(name) for name in names],
                cert_id, repr(bundle.not_after.timestamp()), self._maxlen,
                " ".join(dict.fromkeys(names)), record, chain, "2",
            )
        )  # fmt: skip
        return WireRecord(cert_id, bundle.fingerprint_sha256, command)

    def _chain_key(self, digest: bytes) -> str:
        found = self._chain_keys.get(digest)
        if found is None:
            if len(self._chain_keys) >= 64:
                self._chain_keys.clear()
            found = self._chain_keys[digest] = self._keys.chain(digest)
        return found


def _keys(keys: Keys, record: CertRecord, shared: bytes) -> list[str]:
    cert_key = keys.cert(record.id)
    return [
        keys.fingerprint(record.fingerprint_sha256),
        cert_key,
        keys.ids(),
        keys.expiry(),
        keys.events(),
        keys.chain(chain_digest(shared)) if shared else cert_key,
        keys.store_format(),
        *(keys.name(name) for name in record.names),
    ]


def _args(
    record: CertRecord, payload: bytes, expiry: float, shared: bytes, events_maxlen: int
) -> list[bytes | str]:
    return [
        record.id,
        repr(expiry),  # as redis-py encodes the score of a single add's ZADD
        str(events_maxlen),
        " ".join(dict.fromkeys(record.names)),
        payload,
        shared,
    ]
