from __future__ import annotations

import random

import pytest

from certagent.runtime.pool import Slot, SlotPool, SlotState, last_seen_from_table, recency

PREFIX = "/certagent/slot-"


def slot(pool: SlotPool, n: int, fp: str, *hosts: str, at: float = 0.0) -> Slot:
    s = Slot(pool.slot_name(n), fp, f"id-{fp}", set(hosts), at)
    pool.place(s)
    assert all(pool.for_host(h) == (s,) for h in hosts)
    return s


def test_grows_to_capacity_with_fresh_names() -> None:
    pool = SlotPool(2, PREFIX)
    assert pool.growth(1) == [("/certagent/slot-00001.pem", SlotState.NEW)]
    slot(pool, 1, "A", "a.test")
    assert pool.growth(1) == [("/certagent/slot-00002.pem", SlotState.NEW)]
    slot(pool, 2, "B", "b.test")
    assert pool.growth(1) == []
    assert len(pool) == 2


def test_spare_names_are_reused_before_new_ones() -> None:
    pool = SlotPool(3, PREFIX)
    pool.add_spare("/certagent/slot-00007.pem")
    assert pool.growth(1) == [("/certagent/slot-00007.pem", SlotState.KNOWN)]
    pool.place(Slot("/certagent/slot-00007.pem", "A", None, {"a.test"}))
    assert pool.growth(1) == [("/certagent/slot-00001.pem", SlotState.NEW)]


def test_lookup_by_host_and_fingerprint() -> None:
    pool = SlotPool(5, PREFIX)
    s = slot(pool, 1, "W", "a.w.test")
    pool.mark_host("b.w.test", [s])
    assert pool.for_host("b.w.test") == (s,)
    assert pool.for_fingerprint("W") is s
    assert pool.for_host("c.w.test") == ()
    assert not pool.is_marked("c.w.test")


def test_recycling_a_slot_forgets_its_old_certificate_and_hosts() -> None:
    pool = SlotPool(1, PREFIX)
    old = slot(pool, 1, "A", "a.test", "a2.test")
    pool.drop_hosts(old)
    new = Slot(old.name, "B", "id-B", {"b.test"}, 5.0)
    pool.place(new)
    assert not pool.is_marked("a.test")
    assert not pool.is_marked("a2.test")
    assert pool.for_fingerprint("A") is None
    assert pool.for_host("b.test") == (new,)
    assert pool.slots == (new,)


def test_place_over_an_existing_slot_without_drop_also_forgets() -> None:
    pool = SlotPool(1, PREFIX)
    slot(pool, 1, "A", "a.test")
    new = slot(pool, 1, "B", "b.test")
    assert not pool.is_marked("a.test")
    assert pool.for_fingerprint("B") is new


def test_unmark_host_only_touches_that_host() -> None:
    pool = SlotPool(2, PREFIX)
    s = slot(pool, 1, "A", "a.test", "b.test")
    pool.unmark_host("a.test")
    assert s.hosts == {"b.test"}
    assert not pool.is_marked("a.test")
    assert pool.for_host("b.test") == (s,)


def test_dual_certificates_share_a_host_and_leave_together() -> None:
    pool = SlotPool(3, PREFIX)
    ec = slot(pool, 1, "EC")
    rsa = slot(pool, 2, "RSA")
    pool.mark_host("d.test", [ec, rsa])
    assert pool.for_host("d.test") == (ec, rsa)
    assert rsa.hosts == {"d.test"}
    pool.drop_hosts(ec)  # recycling the ECDSA slot unmarks the host entirely
    assert not pool.is_marked("d.test")
    assert rsa.hosts == set()


def test_recertify_keeps_hosts() -> None:
    pool = SlotPool(2, PREFIX)
    s = slot(pool, 1, "OLD", "a.test")
    pool.recertify(s, "NEW", "id-NEW")
    assert pool.for_fingerprint("OLD") is None
    assert pool.for_fingerprint("NEW") is s
    assert pool.for_host("a.test") == (s,)
    assert pool.get(s.name) is s


def test_victim_skips_excluded_slots() -> None:
    pool = SlotPool(2, PREFIX)
    old = slot(pool, 1, "A", "a.test", at=0.0)
    slot(pool, 2, "B", "b.test", at=5.0)
    assert [v.fingerprint for v in pool.victims(1, {}, exclude=[old.name])] == ["B"]
    assert pool.victims(1, {}, exclude=[s.name for s in pool.slots]) == []


def test_victim_is_least_recently_used_by_traffic() -> None:
    pool = SlotPool(3, PREFIX)
    hot = slot(pool, 1, "A", "hot.test", at=0.0)
    slot(pool, 2, "B", "cold.test", at=1.0)
    fresh = slot(pool, 3, "C", "new.test", at=50.0)
    seen = {"hot.test": 99.0, "cold.test": 2.0}
    assert [v.fingerprint for v in pool.victims(1, seen)] == ["B"]
    assert [v.fingerprint for v in pool.victims(3, seen)] == ["B", "C", "A"]
    assert recency(hot, seen) == 99.0
    assert recency(fresh, seen) == 50.0  # load time protects a slot not yet in the table


def test_victim_counts_any_host_of_a_wildcard_slot() -> None:
    pool = SlotPool(2, PREFIX)
    w = slot(pool, 1, "W", "a.w.test", at=0.0)
    pool.mark_host("b.w.test", [w])
    slot(pool, 2, "X", "x.test", at=10.0)
    assert [v.fingerprint for v in pool.victims(1, {"b.w.test": 20.0})] == ["X"]


def test_victims_of_empty_pool() -> None:
    assert SlotPool(1, PREFIX).victims(1, {}) == []


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SlotPool(0, PREFIX)


def test_clear() -> None:
    pool = SlotPool(2, PREFIX)
    slot(pool, 1, "A", "a.test")
    pool.add_spare("/certagent/slot-00009.pem")
    pool.clear()
    assert len(pool) == 0
    assert not pool.is_marked("a.test")
    assert pool.growth(1) == [("/certagent/slot-00001.pem", SlotState.NEW)]


def test_last_seen_from_table() -> None:
    seen = last_seen_from_table(
        [("a.test", 3_600_000), ("b.test", 3_590_000), ("c.test", None), ("d.test", 4_000_000)],
        expire_ms=3_600_000,
        now=1000.0,
    )
    assert seen == {"a.test": 1000.0, "b.test": 990.0, "d.test": 1000.0}


def test_free_slots_come_first_and_count_toward_capacity() -> None:
    pool = SlotPool(2, PREFIX)
    a = slot(pool, 1, "A", "a.test")
    slot(pool, 2, "B", "b.test")
    assert pool.growth(1) == []
    pool.add_free(a.name)
    assert not pool.is_marked("a.test")
    assert pool.for_fingerprint("A") is None
    assert pool.free_slots == (a.name,)
    assert pool.growth(2) == [(a.name, SlotState.LISTED)]
    slot(pool, 1, "C", "c.test")
    assert pool.free_slots == ()
    assert pool.growth(1) == []


def test_for_certificate() -> None:
    pool = SlotPool(3, PREFIX)
    a = slot(pool, 1, "A", "a.test")
    slot(pool, 2, "B", "b.test")
    assert pool.for_certificate("id-A") == [a]
    assert pool.for_certificate("id-Z") == []


def test_growth_places_free_then_spare_then_new_within_capacity() -> None:
    pool = SlotPool(4, PREFIX)
    a = slot(pool, 1, "A", "a.test")
    pool.add_free(a.name)
    pool.add_spare("/certagent/slot-00009.pem")
    assert pool.growth(10) == [
        (a.name, SlotState.LISTED),
        ("/certagent/slot-00009.pem", SlotState.KNOWN),
        ("/certagent/slot-00002.pem", SlotState.NEW),
        ("/certagent/slot-00003.pem", SlotState.NEW),
    ]
    assert pool.growth(1) == [(a.name, SlotState.LISTED)]
    slot(pool, 2, "B", "b.test")
    slot(pool, 3, "C", "c.test")
    slot(pool, 4, "D", "d.test")
    assert pool.growth(3) == [(a.name, SlotState.LISTED)]  # 3 slots + 1 free line = capacity


def test_victims_in_lru_order() -> None:
    pool = SlotPool(3, PREFIX)
    slot(pool, 1, "A", "a.test", at=3.0)
    slot(pool, 2, "B", "b.test", at=1.0)
    slot(pool, 3, "C", "c.test", at=2.0)
    assert [v.fingerprint for v in pool.victims(2, {})] == ["B", "C"]
    assert [v.fingerprint for v in pool.victims(5, {"b.test": 9.0})] == ["C", "A", "B"]
    assert [v.fingerprint for v in pool.victims(2, {}, exclude=[pool.slot_name(2)])] == ["C", "A"]


def test_growth_takes_the_lowest_free_numbers_and_stays_cheap_in_a_large_pool() -> None:
    pool = SlotPool(100_000, PREFIX)
    for n in (1, 2, 4):
        slot(pool, n, f"F{n}")
    assert pool.growth(3) == [
        ("/certagent/slot-00003.pem", SlotState.NEW),
        ("/certagent/slot-00005.pem", SlotState.NEW),
        ("/certagent/slot-00006.pem", SlotState.NEW),
    ]
    assert pool.growth(1) == [("/certagent/slot-00003.pem", SlotState.NEW)]  # nothing reserved
    for n in range(3, 50_001):
        slot(pool, n, f"F{n}")
    calls = 0
    real = pool.slot_name

    def counting(number: int) -> str:
        nonlocal calls
        calls += 1
        return real(number)

    pool.slot_name = counting  # type: ignore[method-assign]
    for _ in range(100):
        assert pool.growth(1) == [("/certagent/slot-50001.pem", SlotState.NEW)]
    assert calls <= 100 * 3 + 50_001  # one scan past the used numbers, then O(1) per call
    pool.slot_name = real  # type: ignore[method-assign]
    pool.clear()
    assert pool.growth(1) == [("/certagent/slot-00001.pem", SlotState.NEW)]


def test_sample_draws_distinct_slots_outside_exclude_in_constant_time() -> None:
    pool = SlotPool(10_000, PREFIX)
    for n in range(1, 10_001):
        slot(pool, n, f"F{n}", f"h{n}.test")
    rng = random.Random(7)
    drawn = pool.sample(16, rng, exclude=[pool.slot_name(1)])
    assert len(drawn) == 16 == len({s.name for s in drawn})
    assert pool.slot_name(1) not in {s.name for s in drawn}
    # a small pool is returned whole
    small = SlotPool(3, PREFIX)
    for n in (1, 2, 3):
        slot(small, n, f"S{n}")
    assert {s.name for s in small.sample(16, rng)} == {small.slot_name(n) for n in (1, 2, 3)}
    assert small.sample(16, rng, exclude=[small.slot_name(2)]) == [
        small.get(small.slot_name(1)),
        small.get(small.slot_name(3)),
    ]


def test_sample_follows_free_and_recycled_slots() -> None:
    pool = SlotPool(4, PREFIX)
    for n in (1, 2, 3):
        slot(pool, n, f"F{n}", f"h{n}.test")
    pool.add_free(pool.slot_name(2))
    rng = random.Random(1)
    names = {s.name for _ in range(50) for s in pool.sample(1, rng)}
    assert names == {pool.slot_name(1), pool.slot_name(3)}
    slot(pool, 2, "G2", "g2.test")  # recycled back into use
    assert len(pool.sample(10, rng)) == 3


def test_indexes_by_certificate_and_wildcard_parent() -> None:
    pool = SlotPool(5, PREFIX)
    w = slot(pool, 1, "W", "a.w.test")
    pool.mark_host("b.w.test", [w])
    x = slot(pool, 2, "X", "x.test")
    assert pool.hosts_covered_by("*.w.test") == ["a.w.test", "b.w.test"]
    assert pool.hosts_covered_by("x.test") == ["x.test"]
    assert pool.hosts_covered_by("y.test") == []
    assert pool.for_certificate("id-W") == [w]
    pool.recertify(w, "W2", "id-W2")
    assert pool.for_certificate("id-W") == []
    assert pool.for_certificate("id-W2") == [w]
    pool.unmark_host("a.w.test")
    assert pool.hosts_covered_by("*.w.test") == ["b.w.test"]
    pool.add_free(x.name)
    assert pool.for_certificate("id-X") == []
    assert pool.hosts_covered_by("x.test") == []


def test_slot_numbers_round_trip() -> None:
    pool = SlotPool(5, PREFIX)
    assert pool.slot_number(pool.slot_name(42)) == 42
    assert pool.slot_number("/other/slot-00001.pem") is None
    assert pool.slot_number(PREFIX + "x.pem") is None
    assert pool.slot_number(PREFIX + "00000.pem") is None
