"""The name filter's snapshot format: a round trip, and hostile bytes refused."""

from __future__ import annotations

import struct

import pytest

from certagent.errors import StoreCorrupt
from certagent.service import bloom
from certagent.service.bloom import HEADER_SIZE, BloomFilter


def filled(count: int = 3000) -> BloomFilter:
    new = BloomFilter(2 * count)
    for i in range(count):
        new.add(f"h{i}.example.test")
    return new


def test_a_snapshot_round_trip_keeps_every_bit_and_parameter() -> None:
    original = filled()
    snapshot = bloom.decode(bloom.encode(original, "1700000000000-7", 1_800_000_000))
    assert snapshot.position == "1700000000000-7" and snapshot.written == 1_800_000_000
    copy = snapshot.bloom
    assert (copy.bits, copy.probes, copy.capacity, copy.count) == (
        original.bits, original.probes, original.capacity, original.count,
    )  # fmt: skip
    assert all(f"h{i}.example.test" in copy for i in range(3000))
    strangers = sum(f"x{i}.other.test" in copy for i in range(5000))
    assert strangers == sum(f"x{i}.other.test" in original for i in range(5000))
    header = bloom.decode_header(bloom.encode(original, "0-0", 5)[:HEADER_SIZE])
    assert (header.capacity, header.count, header.written) == (6000, original.count, 5)


def test_adding_a_name_again_does_not_count_it_twice() -> None:
    new = BloomFilter(1000)
    new.add("a.example.test")
    new.add("a.example.test")
    assert new.count == 1 and not new.full


def test_a_snapshot_is_about_the_size_of_its_bits() -> None:
    data = bloom.encode(BloomFilter(1_000_000), "1-1", 0)
    assert 1_190_000 < len(data) < 1_200_100  # 9.6 bits a name of capacity


def _with(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


GOOD = bloom.encode(filled(500), "1700000000000-0", 1)


@pytest.mark.parametrize(
    ("corrupt", "says"),
    [
        (b"", "shorter than its header"),
        (GOOD[:HEADER_SIZE - 1], "shorter than its header"),
        (_with(GOOD, 0, b"XXXXXXXX"), "wrong magic"),
        (_with(GOOD, 8, b"\x02"), "version"),
        (_with(GOOD, 9, b"\x07"), "version"),
        (_with(GOOD, 10, b"\x1f"), "do not size"),  # probes
        (_with(GOOD, 12, struct.pack(">Q", 2**40)), "do not size"),  # bits
        (_with(GOOD, 20, struct.pack(">Q", 10)), "capacity"),
        (_with(GOOD, 20, struct.pack(">Q", 10**12)), "capacity"),
        (_with(GOOD, 28, struct.pack(">Q", 2**60)), "count"),
        (_with(GOOD, 44, struct.pack(">H", 65_000)), "position length"),
        (_with(GOOD, 44, struct.pack(">H", 0)), "bytes, not"),
        (GOOD[:-1], "bytes, not"),
        (GOOD + b"\x00", "bytes, not"),
        (_with(GOOD, HEADER_SIZE, b"\xff"), "not ASCII"),
        (_with(GOOD, HEADER_SIZE, b"\n"), "not printable"),
        (_with(GOOD, len(GOOD) - 1, bytes([GOOD[-1] ^ 1])), "digest"),
    ],
)
def test_a_corrupt_snapshot_is_refused_with_what_is_wrong(corrupt: bytes, says: str) -> None:
    with pytest.raises(StoreCorrupt, match=says):
        bloom.decode(corrupt)


def test_a_position_too_long_for_a_snapshot_is_refused_when_writing() -> None:
    with pytest.raises(ValueError, match="too long"):
        bloom.encode(BloomFilter(10), "9" * 65, 0)
