"""Reading a record of either layout, and swapping a layout-2 record for a new one.

A record is a hash (layout 1, as stores written before hold: :mod:`._records`) or a string
(layout 2, :mod:`._packed`) under the same key, ``cert:{id}``; every reader
and writer takes both.  :func:`fetch` reads many records in one pipeline
(``GET``), then the hashes among them (the ``WRONGTYPE`` replies) in a second
(``HMGET``): one round trip when every record is compact, two while some are
not.  :data:`SWAP` replaces a record only if it is still the one read (a
string's SHA-1; a hash's version and every field an update changes): the
compare-and-set of every update of one record (an OCSP response, a
re-encrypted key, the ``managed`` mark, a cluster's replace, rewriting a hash
as layout 2) on one Redis and on a cluster alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis.asyncio
import redis.exceptions

from certagent.store.redis._layout import (
    F_DROPPED,
    F_KEY,
    F_MANAGED,
    F_OCSP,
    F_VERSION,
    META_FIELDS,
    Keys,
    to_bytes,
)
from certagent.store.redis._packed import Packed, is_packed, unpack
from certagent.store.redis._records import meta_fields

#: Rounds of :func:`fetch` for records that change layout while read.
ATTEMPTS = 3

__all__ = [
    "HASH_FIELDS",
    "SWAP",
    "Row",
    "decode",
    "fetch",
    "hash_state",
    "read_one",
    "state_of",
    "wrong_type",
]

#: KEYS[1] a record; ARGV[1] its state as read (:attr:`Row.state`), ARGV[2] the new record
#: (a layout-2 string; '' for a hash of layout 1, whose fields and values follow in ARGV[3..]).
#: 1 swapped, 0 it changed meanwhile, -1 it is gone.  A string's
#: state is ``s`` + the SHA-1 of its bytes; a hash's (layout 1) ``h`` + its version, the
#: SHA-1s of its key and OCSP response, its ``managed`` and ``names_dropped``: every field
#: a write of layout 1 changes (an OCSP response or a key rotation keeps the version).
SWAP = """
local kind = redis.call('TYPE', KEYS[1])['ok']
local now
if kind == 'hash' then
  local f = redis.call('HMGET', KEYS[1], 'version', 'key', 'ocsp', 'managed', 'names_dropped')
  now = 'h' .. (f[1] or '') .. ' ' .. redis.sha1hex(f[2] or '') .. ' '
    .. redis.sha1hex(f[3] or '') .. ' ' .. (f[4] or '') .. ' ' .. (f[5] or '')
elseif kind == 'string' then now = 's' .. redis.sha1hex(redis.call('GET', KEYS[1]))
else return -1 end
if now ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return 1
"""


#: The fields read from every hash besides META_FIELDS (what :attr:`Row.state` needs).
HASH_FIELDS = (F_DROPPED, F_KEY, F_OCSP)


@dataclass(frozen=True)
class Row:
    """One record as read: its metadata (layout 1's form) and what else each layout holds.

    ``packed``: the layout-2 record (``raw`` its bytes); None for a hash, whose
    other fields read (:data:`HASH_FIELDS` and those asked for) are ``fields``.
    """

    meta: dict[str, bytes | None]
    packed: Packed | None = None
    raw: bytes = b""
    fields: dict[str, bytes | None] = field(default_factory=dict)

    @property
    def dropped(self) -> bytes | None:
        """Names a cluster's replace dropped and has not yet taken out of their sets."""
        return self.packed.dropped if self.packed is not None else self.fields.get(F_DROPPED)

    @property
    def state(self) -> bytes:
        """What :data:`SWAP` compares, as Redis computes it."""
        if self.packed is not None:
            return state_of(self.raw)
        f, m = self.fields, self.meta
        return b"h" + b" ".join(
            [
                m.get(F_VERSION) or b"",
                _sha1(f.get(F_KEY) or b"").encode(),
                _sha1(f.get(F_OCSP) or b"").encode(),
                m.get(F_MANAGED) or b"",
                f.get(F_DROPPED) or b"",
            ]
        )


def state_of(raw: bytes) -> bytes:
    """A layout-2 record's state (:data:`SWAP`): ``s`` + the SHA-1 of its bytes."""
    return b"s" + _sha1(raw).encode()


def hash_state(fields: Sequence[bytes]) -> bytes:
    """The state (:data:`SWAP`) of the layout-1 hash that ``fields`` (fields and values
    in turn, as :func:`~._records.hash_fields` gives them) make once written."""
    held = dict(zip(fields[::2], fields[1::2], strict=True))
    meta = {F_VERSION: held.get(F_VERSION.encode()), F_MANAGED: held.get(F_MANAGED.encode())}
    rest = {name: held.get(name.encode()) for name in HASH_FIELDS}
    return Row(meta, fields=rest).state


def _sha1(raw: bytes) -> str:
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


def wrong_type(exc: object) -> bool:
    return isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("WRONGTYPE")


def decode(reply: object, extra: Sequence[str] = ()) -> Row | None:
    """A :class:`Row` from a ``GET`` reply (bytes) or ``HMGET`` of META_FIELDS, HASH_FIELDS
    and ``extra``; None if the record does not exist; ValueError if it is not a record.
    """
    if isinstance(reply, bytes):
        if not is_packed(reply):
            raise ValueError("the string is not a record (bad magic)")
        packed = unpack(reply)
        return Row(packed.meta(), packed, reply)
    names = [*HASH_FIELDS, *extra]
    if not isinstance(reply, list) or len(reply) != len(META_FIELDS) + len(names):
        return None
    meta = meta_fields(reply[: len(META_FIELDS)])
    if meta is None:
        return None
    rest = (to_bytes(v) for v in reply[len(META_FIELDS) :])
    return Row(meta, fields=dict(zip(names, rest, strict=True)))


async def fetch(
    client: redis.asyncio.Redis,
    keys: Keys,
    ids: Sequence[str],
    extra: Sequence[str] = (),
    *,
    hash_fields: Sequence[str] | None = None,
) -> list[object]:
    """Each record's raw reply, in order: bytes (layout 2), a list (HMGET of a hash's
    META_FIELDS, HASH_FIELDS and ``extra``, or of ``hash_fields``: layout 1), None (no such
    record) or the ResponseError Redis gave.  One pipeline, and a second for the hashes.

    A hash rewritten as a string between the two (``keys rotate`` running) is read again
    (:data:`ATTEMPTS` rounds at most): a reader never takes a record for missing because
    it changed layout under it.
    """
    fields = list(hash_fields) if hash_fields is not None else [*META_FIELDS, *HASH_FIELDS, *extra]
    replies: list[object] = [None] * len(ids)
    pending = list(range(len(ids)))
    for _ in range(ATTEMPTS):
        if not pending:
            break
        async with client.pipeline(transaction=False) as pipe:
            for n in pending:
                pipe.get(keys.cert(ids[n]))
            got = await pipe.execute(raise_on_error=False)
        hashes: list[int] = []
        for n, reply in zip(pending, got, strict=True):
            replies[n] = reply
            if wrong_type(reply):
                hashes.append(n)
        if not hashes:
            break
        async with client.pipeline(transaction=False) as pipe:
            for n in hashes:
                pipe.hmget(keys.cert(ids[n]), fields)
            rows = await pipe.execute(raise_on_error=False)
        pending = []
        for n, row in zip(hashes, rows, strict=True):
            replies[n] = row
            if wrong_type(row):  # a string again: rewritten meanwhile
                pending.append(n)
    return replies


async def read_one(
    client: redis.asyncio.Redis, key: str, extra: Sequence[str] = ()
) -> Row | None:
    """One record by its key (also inside a WATCH: the pipeline runs commands at once);
    None if it does not exist; ValueError if it is not a record.  A hash rewritten as a
    string while read is read again, as in :func:`fetch`."""
    for _ in range(ATTEMPTS):
        try:
            return decode(await client.get(key), extra)
        except redis.exceptions.ResponseError as exc:
            if not wrong_type(exc):
                raise
        try:
            return decode(await client.hmget(key, [*META_FIELDS, *HASH_FIELDS, *extra]), extra)
        except redis.exceptions.ResponseError as exc:
            if not wrong_type(exc):
                raise
    raise ValueError(f"{key} kept changing between a hash and a string")
