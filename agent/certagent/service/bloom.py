"""The name filter's Bloom filter, and its snapshot: the bytes agents keep in the store.

A snapshot is a fixed header, the change-feed position the filter reflects and
the raw bit array (a Bloom filter sized with headroom is about 30 % ones: its
bits barely compress, so they are stored as they are)::

    magic    8 bytes   b"CAGNFLT1"
    version  u8        1
    hash     u8        1: BLAKE2b-128 of the ASCII name, double hashing
    probes   u8        bit probes per name
    reserved u8        0
    bits     u64       bits in the array
    capacity u64       names the filter was sized for
    count    u64       names added (a name that set no new bit is not counted)
    written  u64       when it was written (Unix seconds)
    poslen   u16       length of the position, then the position (ASCII)
    digest   16 bytes  BLAKE2b-128 of the bit array
    array    (bits + 7) // 8 bytes

Everything is big-endian.  :func:`decode` treats the bytes as hostile: any
length, magic, version or parameter out of bounds, or a digest that does not
match, raises StoreCorrupt (the agent then rebuilds the filter from the store).
Encoding and decoding are O(filter size): 1.2 MB per million names of capacity.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

from certagent.errors import StoreCorrupt

__all__ = [
    "FP_RATE",
    "HEADER_SIZE",
    "MAX_CAPACITY",
    "MIN_CAPACITY",
    "BloomFilter",
    "Snapshot",
    "decode",
    "decode_header",
    "encode",
]

#: False positives when the filter holds ``capacity`` names.
FP_RATE = 0.01
MIN_CAPACITY = 1024
#: The largest filter a snapshot may describe (names): 120 MB of bits.
MAX_CAPACITY = 100_000_000
MAGIC = b"CAGNFLT1"
VERSION = 1
HASH_BLAKE2B = 1
MAX_POSITION = 64
_HEAD = struct.Struct(">8sBBBBQQQQH")
#: Bytes before the position: enough to read a snapshot's parameters and age.
HEADER_SIZE = _HEAD.size
_DIGEST = 16


def _sizes(capacity: int, fp_rate: float) -> tuple[int, int]:
    """(bits, probes) for ``capacity`` names at ``fp_rate``."""
    bits = max(64, math.ceil(-capacity * math.log(fp_rate) / math.log(2) ** 2))
    return bits, max(1, round(bits / capacity * math.log(2)))


class BloomFilter:
    """Bits for about ``capacity`` names at ``fp_rate`` false positives.

    ``count`` counts only names that set at least one new bit, so a name added
    again (a renewal) does not bring the filter closer to full.
    """

    def __init__(self, capacity: int, fp_rate: float = FP_RATE) -> None:
        capacity = min(MAX_CAPACITY, max(MIN_CAPACITY, capacity))
        self.bits, self.probes = _sizes(capacity, fp_rate)
        self.capacity = capacity
        self.count = 0
        self._array = bytearray((self.bits + 7) // 8)

    def _positions(self, name: str) -> list[int]:
        digest = hashlib.blake2b(name.encode("ascii"), digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "little")
        h2 = int.from_bytes(digest[8:], "little") | 1
        return [(h1 + i * h2) % self.bits for i in range(self.probes)]

    def add(self, name: str) -> None:
        new = False
        for p in self._positions(name):
            byte, bit = p >> 3, 1 << (p & 7)
            if not self._array[byte] & bit:
                self._array[byte] |= bit
                new = True
        if new:
            self.count += 1

    def __contains__(self, name: str) -> bool:
        return all(self._array[p >> 3] & (1 << (p & 7)) for p in self._positions(name))

    @property
    def memory(self) -> int:
        return len(self._array)

    @property
    def full(self) -> bool:
        """Whether it holds more names than it was sized for (false positives above FP_RATE)."""
        return self.count > self.capacity


@dataclass(frozen=True)
class Snapshot:
    """A filter as it was at change-feed ``position``, written at ``written`` (Unix s)."""

    bloom: BloomFilter
    position: str
    written: int


@dataclass(frozen=True)
class Header:
    """What the first :data:`HEADER_SIZE` bytes of a snapshot say (not yet checked)."""

    capacity: int
    count: int
    written: int


def encode(bloom: BloomFilter, position: str, written: int) -> bytes:
    """The snapshot of ``bloom`` at ``position``: O(filter size)."""
    raw_position = position.encode("ascii")
    if len(raw_position) > MAX_POSITION:
        raise ValueError(f"change-feed position {position[:80]!r} is too long for a snapshot")
    array = bytes(bloom._array)
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        HASH_BLAKE2B,
        bloom.probes,
        0,
        bloom.bits,
        bloom.capacity,
        bloom.count,
        max(0, written),
        len(raw_position),
    )
    digest = hashlib.blake2b(array, digest_size=_DIGEST).digest()
    return b"".join((head, raw_position, digest, array))


def decode_header(data: bytes) -> Header:
    """The parameters of a snapshot from its first :data:`HEADER_SIZE` bytes; StoreCorrupt."""
    if len(data) < HEADER_SIZE:
        raise StoreCorrupt(f"name filter snapshot: {len(data)} bytes, shorter than its header")
    magic, version, hash_id, probes, _, bits, capacity, count, written, poslen = _HEAD.unpack_from(
        data
    )
    if magic != MAGIC:
        raise StoreCorrupt("name filter snapshot: not a snapshot (wrong magic)")
    if version != VERSION or hash_id != HASH_BLAKE2B:
        raise StoreCorrupt(f"name filter snapshot: version {version}/{hash_id}, not {VERSION}/1")
    if not MIN_CAPACITY <= capacity <= MAX_CAPACITY:
        raise StoreCorrupt(f"name filter snapshot: capacity {capacity} out of bounds")
    if (bits, probes) != _sizes(capacity, FP_RATE):
        raise StoreCorrupt(
            f"name filter snapshot: {bits} bits and {probes} probes do not size {capacity} names"
            f" at {FP_RATE:.0%}"
        )
    if count > 4 * capacity or poslen > MAX_POSITION:
        raise StoreCorrupt("name filter snapshot: count or position length out of bounds")
    return Header(capacity=capacity, count=count, written=written)


def decode(data: bytes) -> Snapshot:
    """The snapshot in ``data``, checked as hostile input; StoreCorrupt if anything is off."""
    header = decode_header(data)
    poslen = _HEAD.unpack_from(data)[-1]
    bits, probes = _sizes(header.capacity, FP_RATE)
    start = HEADER_SIZE + poslen + _DIGEST
    if len(data) != start + (bits + 7) // 8:
        raise StoreCorrupt(
            f"name filter snapshot: {len(data)} bytes, not {start + (bits + 7) // 8}"
        )
    try:
        position = data[HEADER_SIZE : HEADER_SIZE + poslen].decode("ascii")
    except UnicodeDecodeError as exc:
        raise StoreCorrupt("name filter snapshot: the position is not ASCII") from exc
    if not position.isprintable() or not position:
        raise StoreCorrupt("name filter snapshot: the position is empty or not printable")
    array = data[start:]
    if hashlib.blake2b(array, digest_size=_DIGEST).digest() != data[start - _DIGEST : start]:
        raise StoreCorrupt("name filter snapshot: the bit array does not match its digest")
    bloom = BloomFilter(header.capacity)
    assert (bloom.bits, bloom.probes) == (bits, probes)
    bloom._array[:] = array
    bloom.count = header.count
    return Snapshot(bloom=bloom, position=position, written=header.written)
