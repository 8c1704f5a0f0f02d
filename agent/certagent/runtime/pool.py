"""The slot pool: which certificate sits in which crt-list slot, and which slot to recycle.

Pure bookkeeping, no I/O.  HAProxy 2.6 leaks the whole instance on
``del ssl crt-list``, so the agent never deletes: it grows up to ``capacity``
crt-list entries (slots) and then rewrites the least recently used slot with
``set ssl cert`` + ``commit ssl cert``.  A slot is identified by its name
(``/certagent/slot-0001.pem``); the certificate in it by the SHA-1 fingerprint
of its leaf, which is also what ``show ssl cert <slot>`` prints, so slots can be
adopted after an agent restart.

Every operation here costs O(1) or O(hosts touched), whatever the number of
slots K, except :meth:`SlotPool.victims` (exact LRU over every slot, O(K); the
loader uses :meth:`SlotPool.sample` instead) and :meth:`SlotPool.clear`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice


class SlotState(Enum):
    """What HAProxy already has of a slot a load is about to use."""

    NEW = "new"  # nothing: new ssl cert, set, commit, add ssl crt-list
    KNOWN = "known"  # an empty certificate store: set, commit, add ssl crt-list
    LISTED = "listed"  # a crt-list line with the placeholder: set, commit


#: Clients answered "ok" within this many seconds may still be on their way to their handshake.
ASKED_WINDOW_S = 2.0
ASKS_KEPT = 8


@dataclass
class Slot:
    name: str
    fingerprint: str
    cert_id: str | None
    hosts: set[str] = field(default_factory=set)
    loaded_at: float = 0.0
    seen_at: float = 0.0  # the latest use of its hosts the agent has read (victim choice)
    names: tuple[str, ...] = ()  # the certificate's names (wildcards index the slot)
    ocsp: bytes | None = None  # the OCSP response HAProxy staples for it (DER), if any
    # when clients were answered "ok" for its hosts, the latest few within ASKED_WINDOW_S
    asks: tuple[float, ...] = ()

    def note_asked(self, now: float) -> None:
        """A client was just told its host is served from this slot."""
        kept = [t for t in self.asks[-(ASKS_KEPT - 1) :] if now - t <= ASKED_WINDOW_S]
        self.asks = (*kept, now)

    def asked_before(self, at: float) -> int:
        """Clients answered within ASKED_WINDOW_S before ``at`` (at most ASKS_KEPT)."""
        return sum(1 for t in self.asks if 0.0 <= at - t <= ASKED_WINDOW_S)


class SlotPool:
    def __init__(self, capacity: int, prefix: str) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.prefix = prefix
        self._slots: dict[str, Slot] = {}
        self._by_fingerprint: dict[str, Slot] = {}
        # host -> the slots serving it (two for an ECDSA + RSA pair); a host is here
        # exactly while it is marked loaded in HAProxy's usage table
        self._by_host: dict[str, tuple[Slot, ...]] = {}
        self._marked_at: dict[str, float] = {}  # host -> when it was last marked loaded
        # certificate id -> its slots; parent domain -> marked hosts below it (for wildcards)
        self._by_cert: dict[str, set[str]] = {}
        self._by_wildcard: dict[str, set[str]] = {}  # "*.d" -> slots whose certificate has it
        self._by_parent: dict[str, set[str]] = {}
        # slot names in a list, for O(1) random sampling (swap-remove keeps it dense)
        self._names: list[str] = []
        self._position: dict[str, int] = {}
        # Ordered sets (dicts with None values): O(1) membership however large the pool.
        self._spare: dict[str, None] = {}  # slot names HAProxy knows but no crt-list line uses
        self._free: dict[str, None] = {}  # crt-list slots holding the placeholder certificate
        self._lowest_untaken = 1  # every slot number below this one is in use

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> tuple[Slot, ...]:
        return tuple(self._slots.values())

    def clear(self) -> None:
        self._slots.clear()
        self._by_fingerprint.clear()
        self._by_host.clear()
        self._marked_at.clear()
        self._by_cert.clear()
        self._by_wildcard.clear()
        self._by_parent.clear()
        self._names.clear()
        self._position.clear()
        self._spare.clear()
        self._free.clear()
        self._lowest_untaken = 1

    def slot_name(self, number: int) -> str:
        return f"{self.prefix}{number:05d}.pem"

    def slot_number(self, name: str) -> int | None:
        """The number in a slot name (the usage table's ``gpt0``); None if not ours."""
        if not name.startswith(self.prefix) or not name.endswith(".pem"):
            return None
        digits = name[len(self.prefix) : -len(".pem")]
        return int(digits) if digits.isdigit() and 0 < int(digits) < 2**31 else None

    def is_slot_name(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def for_host(self, host: str) -> tuple[Slot, ...]:
        """The slots serving ``host``; empty if the host is not marked loaded."""
        return self._by_host.get(host, ())

    def get(self, name: str) -> Slot | None:
        return self._slots.get(name)

    def recertify(
        self, slot: Slot, fingerprint: str, cert_id: str | None, names: tuple[str, ...] = ()
    ) -> None:
        """``slot`` now holds another certificate (rotated in place); its hosts stay."""
        if self._by_fingerprint.get(slot.fingerprint) is slot:
            del self._by_fingerprint[slot.fingerprint]
        self._unindex_cert(slot)
        slot.fingerprint = fingerprint
        slot.cert_id = cert_id
        slot.names = names
        self._by_fingerprint[fingerprint] = slot
        self._index_cert(slot)

    def is_marked(self, host: str) -> bool:
        """Whether ``host`` is marked loaded (served by a slot, its connections skip the agent)."""
        return host in self._by_host

    def note_asked(self, host: str, now: float) -> None:
        """A client was just answered "ok" for ``host``: its slots note it (O(1))."""
        for slot in self._by_host.get(host, ()):
            slot.note_asked(now)

    def marked_at(self, host: str) -> float | None:
        """When ``host`` was last marked loaded; None if it is not marked."""
        return self._marked_at.get(host)

    def remarked(self, host: str, at: float) -> None:
        if host in self._marked_at:
            self._marked_at[host] = at

    def for_fingerprint(self, fingerprint: str) -> Slot | None:
        return self._by_fingerprint.get(fingerprint)

    def for_certificate(self, cert_id: str) -> list[Slot]:
        return [self._slots[name] for name in sorted(self._by_cert.get(cert_id, ()))]

    def for_wildcard(self, pattern: str) -> Slot | None:
        """A slot whose certificate has the name ``pattern`` (``*.d``), if one is loaded."""
        holders = self._by_wildcard.get(pattern)
        return self._slots[min(holders)] if holders else None

    def hosts_covered_by(self, pattern: str) -> list[str]:
        """Marked hosts that ``pattern`` names: itself, or for ``*.d`` every ``x.d``."""
        if pattern.startswith("*."):
            return sorted(self._by_parent.get(pattern[2:], ()))
        return [pattern] if pattern in self._by_host else []

    def sample(self, count: int, rng: random.Random, exclude: Iterable[str] = ()) -> list[Slot]:
        """Up to ``count`` distinct slots drawn at random, none named in ``exclude``; O(count)."""
        excluded = set(exclude)
        if count <= 0 or not self._names:
            return []
        if count >= len(self._names) - len(excluded):
            return [s for s in self._slots.values() if s.name not in excluded]
        picked: dict[str, Slot] = {}
        for _ in range(4 * count + 8):  # bounded: excluded names may be drawn again
            name = self._names[rng.randrange(len(self._names))]
            if name not in excluded:
                picked[name] = self._slots[name]
                if len(picked) == count:
                    break
        return list(picked.values())

    @property
    def free_slots(self) -> tuple[str, ...]:
        return tuple(self._free)

    def _taken(self, name: str) -> bool:
        return name in self._slots or name in self._free or name in self._spare

    def growth(self, count: int) -> list[tuple[str, SlotState]]:
        """Up to ``count`` places for loads that need no recycling, best first.

        Free slots (already crt-list lines), then spare names HAProxy knows,
        then new names (the lowest numbers not in use), never past ``capacity``
        crt-list lines in all.  Costs O(count), not O(pool size): names only
        leave the pool on :meth:`clear`, so the lowest untaken number only grows.
        """
        places = [(name, SlotState.LISTED) for name in islice(self._free, count)]
        room = self.capacity - len(self._slots) - len(self._free)
        spare = list(islice(self._spare, max(0, min(count - len(places), room))))
        places += [(name, SlotState.KNOWN) for name in spare]
        room -= len(spare)
        while self._taken(self.slot_name(self._lowest_untaken)):
            self._lowest_untaken += 1
        number = self._lowest_untaken
        while len(places) < count and room > 0:
            name = self.slot_name(number)
            if not self._taken(name):
                places.append((name, SlotState.NEW))
                room -= 1
            number += 1
        return places

    def add_spare(self, name: str) -> None:
        if name not in self._slots and name not in self._spare:
            self._spare[name] = None

    def add_free(self, name: str) -> None:
        """``name`` is a crt-list slot holding the placeholder certificate."""
        old = self._slots.pop(name, None)
        if old is not None:
            self._forget(old)
            self._drop_name(name)
        self._spare.pop(name, None)
        self._free[name] = None

    def place(self, slot: Slot) -> None:
        """Record ``slot`` (new, adopted or recycled) with its certificate and hosts."""
        old = self._slots.get(slot.name)
        if old is not None:
            self._forget(old)
        else:
            self._position[slot.name] = len(self._names)
            self._names.append(slot.name)
        self._spare.pop(slot.name, None)
        self._free.pop(slot.name, None)
        self._slots[slot.name] = slot
        self._by_fingerprint[slot.fingerprint] = slot
        self._index_cert(slot)
        for host in list(slot.hosts):
            self.mark_host(host, (*self.for_host(host), slot))

    def mark_host(self, host: str, slots: Iterable[Slot], at: float = 0.0) -> None:
        """Record that ``host`` is marked loaded (at time ``at``) and served by ``slots``."""
        self.unmark_host(host)
        group = tuple(slots)
        for slot in group:
            slot.hosts.add(host)
        self._by_host[host] = group
        self._marked_at[host] = at
        self._by_parent.setdefault(_parent(host), set()).add(host)

    def unmark_host(self, host: str) -> None:
        """``host`` is no longer marked loaded: none of its slots serves it any more."""
        group = self._by_host.pop(host, None)
        if group is None:
            return
        del self._marked_at[host]
        for slot in group:
            slot.hosts.discard(host)
        siblings = self._by_parent.get(_parent(host))
        if siblings is not None:
            siblings.discard(host)
            if not siblings:
                del self._by_parent[_parent(host)]

    def drop_hosts(self, slot: Slot) -> list[str]:
        """Unmark every host ``slot`` serves (also from their other slots); return them."""
        hosts = sorted(slot.hosts)
        for host in hosts:
            self.unmark_host(host)
        slot.hosts.clear()
        return hosts

    def _forget(self, slot: Slot) -> None:
        if self._by_fingerprint.get(slot.fingerprint) is slot:
            del self._by_fingerprint[slot.fingerprint]
        self._unindex_cert(slot)
        self.drop_hosts(slot)

    def _index_cert(self, slot: Slot) -> None:
        if slot.cert_id is not None:
            self._by_cert.setdefault(slot.cert_id, set()).add(slot.name)
        for pattern in slot.names:
            if pattern.startswith("*."):
                self._by_wildcard.setdefault(pattern, set()).add(slot.name)

    def _unindex_cert(self, slot: Slot) -> None:
        for pattern in slot.names:
            holders = self._by_wildcard.get(pattern)
            if holders is not None:
                holders.discard(slot.name)
                if not holders:
                    del self._by_wildcard[pattern]
        if slot.cert_id is None or slot.cert_id not in self._by_cert:
            return
        names = self._by_cert[slot.cert_id]
        names.discard(slot.name)
        if not names:
            del self._by_cert[slot.cert_id]

    def _drop_name(self, name: str) -> None:
        """Swap-remove ``name`` from the sampling list."""
        index = self._position.pop(name)
        last = self._names.pop()
        if last != name:
            self._names[index] = last
            self._position[last] = index

    def victims(
        self, count: int, last_seen: Mapping[str, float], exclude: Iterable[str] = ()
    ) -> list[Slot]:
        """The ``count`` slots least recently used by real traffic, oldest first.

        ``last_seen`` maps hostnames to the time of their last connection (from
        HAProxy's stick-table); a slot's recency is the latest of those for its
        hosts and its own load time, so a slot loaded a moment ago is not taken
        before its first connection shows in the table.  Fewer if the pool has
        fewer slots outside ``exclude``.
        """
        excluded = set(exclude)
        candidates = (s for s in self._slots.values() if s.name not in excluded)
        return heapq.nsmallest(count, candidates, key=lambda s: recency(s, last_seen))


def _parent(host: str) -> str:
    return host.partition(".")[2]


def recency(slot: Slot, last_seen: Mapping[str, float]) -> float:
    return max([slot.loaded_at, *(last_seen.get(h, 0.0) for h in slot.hosts)])


def last_seen_from_table(
    entries: Iterable[tuple[str, int | None]], expire_ms: int, now: float
) -> dict[str, float]:
    """Turn stick-table ``(key, exp ms left)`` pairs into ``host -> last seen (s)``.

    Each connection refreshes an entry's expiry to the table's ``expire``, so the
    time since the last connection is ``expire - exp``.
    """
    seen: dict[str, float] = {}
    for key, exp_left in entries:
        if exp_left is None:
            continue
        seen[key] = now - max(0, expire_ms - exp_left) / 1000.0
    return seen
