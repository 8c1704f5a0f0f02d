"""Which slot to recycle: sampled, usage-aware LRU whose cost does not grow with K.

fe_sni's stick table holds one entry per loaded host (``gpt0`` = its slot
number).  Every connection that skips the agent is tracked there: ``exp``
tells how long ago the host was last used and ``conn_cnt`` how often since
the agent marked it.  Reading the whole table costs O(K), so victims are
chosen the way Redis approximates LRU: draw a few slots at random, add the
best candidates left over from earlier draws, re-read only their hosts'
entries (``show table <t> key <host>``, one pipelined round trip), and take
the least valuable.

Value, lowest first: a slot none of whose hosts had more than one connection
since it was loaded (probation) goes before one that was used again
(protected), and within each group the one idle longest goes first.  A one-off
scan of new hosts therefore recycles other one-off hosts, not a host in steady
use; when every candidate is protected this is plain LRU.  The slots loaded
most recently (the last quarter of the pool's worth of loads, and those of the
last ``SPARED_S`` up to three quarters; at most ``RECENT_MAX``) are left out of
the draw: their first client may still be on its way from the agent's answer
to its handshake.  In a storm of new hosts larger than the pool, every slot
then stays about as long as the pool's worth of loads takes, not a quarter of
that for the unlucky ones a sample finds.  Beyond those, a slot whose
hosts had several clients answered "ok" in the ``ASKED_WINDOW_S`` before the
usage read, more than their entries counted connections then (the second client
of a coalesced load still on its way, on a loaded machine), goes last of all:
recycling it would give that client the default certificate, recycling anything
else costs a load later.

:class:`VictimChooser` is pure (no I/O): :meth:`~VictimChooser.candidates`
says which slots to read, :meth:`~VictimChooser.choose` ranks them from their
:class:`HostUsage`.  :func:`read_usage` is the one runtime-API round trip.
Cost per recycle: O(samples + count) commands and work, whatever K is.

Read-ahead: while recycling, the write that loads a batch also reads the
usage of the candidates for the next choice (:meth:`VictimChooser.draw_ahead`),
so a recycle that follows within ``AHEAD_TTL`` chooses from that read
(:meth:`VictimChooser.choose_ahead`) and costs no round trip of its own.  A
candidate whose slot was reloaded or whose hosts changed since is left out;
if too few are left, the caller reads afresh.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient
from certagent.runtime.pool import Slot, SlotPool

#: Slots drawn at random per choice, and best leftovers kept for the next one.
SAMPLES = 8
KEEP_BEST = 8
#: The latest loads spared: a quarter of the pool, and beyond that those of the last
#: ``SPARED_S`` seconds up to three quarters of it (a storm turning the pool over quickly);
#: never more than ``RECENT_MAX`` (each choice excludes them: its cost grows with their number).
RECENT_MAX = 1024
SPARED_S = 0.5
#: A read-ahead older than this (seconds) is not used: the next choice reads afresh.
AHEAD_TTL = 0.5


@dataclass(frozen=True)
class HostUsage:
    """One host's usage-table entry: when it was last used, and how often since its load."""

    last_seen: float
    conn_cnt: int


def usage_from_entry(entry: protocol.TableEntry, expire_ms: int, now: float) -> HostUsage | None:
    """``show table`` entry -> usage; each touch resets ``exp`` to the table's expire."""
    if entry.expire_ms is None:
        return None
    idle = max(0, expire_ms - entry.expire_ms) / 1000.0
    return HostUsage(now - idle, entry.conn_cnt or 0)


def value(
    slot: Slot, usage: Mapping[str, HostUsage], read_at: float | None = None
) -> tuple[bool, bool, float]:
    """``(awaited, protected, last used)`` of a slot: the lower, the better a victim.

    A host missing from ``usage`` left the table (idle past its expiry), so it
    adds nothing; a slot's load time counts as a use.  The first connection
    after a load is the client that asked for it: only more make a host
    "protected".  ``awaited`` (only given ``read_at``, when ``usage`` was read):
    more than one client was answered "ok" for it in the ``ASKED_WINDOW_S``
    before the read (coalesced on one load) and they outnumber the connections
    its hosts' entries counted, so some were still on their way.  A single
    asker, and clients answered after the read, are covered by sparing the
    latest loads instead (:meth:`VictimChooser.loaded`): an ask whose client
    never connects (it gave up, or a probe) must not shield a slot for long.
    """
    protected = False
    last = slot.loaded_at
    connections = 0
    for host in slot.hosts:
        seen = usage.get(host)
        if seen is not None:
            last = max(last, seen.last_seen)
            protected = protected or seen.conn_cnt > 1
            connections += seen.conn_cnt
    # the first client is covered by sparing the latest loads; only more of them count
    awaited = read_at is not None and slot.asked_before(read_at) > max(connections, 1)
    return awaited, protected, last


class VictimChooser:
    """The sampling policy, with its small memory of good candidates (pure)."""

    def __init__(
        self,
        *,
        samples: int = SAMPLES,
        keep_best: int = KEEP_BEST,
        rng: random.Random | None = None,
    ) -> None:
        if samples < 1 or keep_best < 0:
            raise ValueError("samples must be at least 1 and keep_best at least 0")
        self.samples = samples
        self.keep_best = keep_best
        self._rng = rng or random.Random()  # noqa: S311 (sampling, not secrets)
        self._best: dict[str, Slot] = {}
        self._recent: OrderedDict[str, float] = OrderedDict()  # slot -> when loaded
        # read-ahead: candidates with their hosts as drawn, their usage, when read
        self._drawn: list[tuple[Slot, frozenset[str]]] = []
        self._ahead: tuple[list[tuple[Slot, frozenset[str]]], dict[str, HostUsage], float] = (
            [],
            {},
            float("-inf"),
        )

    def forget(self) -> None:
        self._best.clear()
        self._recent.clear()
        self._drawn = []
        self._ahead = ([], {}, float("-inf"))

    def draw_ahead(self, pool: SlotPool, count: int, keep: Iterable[str]) -> list[str]:
        """Draw the candidates for the next choice of ``count``; the hosts to read now."""
        slots = self.candidates(pool, count, keep) if count > 0 else []
        self._drawn = [(s, frozenset(s.hosts)) for s in slots]
        return sorted({h for s in slots for h in s.hosts})

    def read_ahead(self, usage: dict[str, HostUsage], now: float) -> None:
        """The usage of the hosts :meth:`draw_ahead` returned, read at ``now``."""
        self._ahead, self._drawn = (self._drawn, usage, now), []

    def choose_ahead(
        self, pool: SlotPool, count: int, keep: Iterable[str], now: float
    ) -> list[Slot] | None:
        """Victims from the read-ahead if it is fresh and enough of it still holds, else None."""
        drawn, usage, read_at = self._ahead
        self._ahead = ([], {}, float("-inf"))
        if count <= 0 or now - read_at > AHEAD_TTL:
            return None
        excluded = set(keep) | self._recent.keys()
        valid = [
            slot
            for slot, hosts in drawn
            if slot.name not in excluded and pool.get(slot.name) is slot and slot.hosts == hosts
        ]
        if len(valid) < count:
            return None
        return self.choose(valid, count, usage, read_at)

    def loaded(self, pool: SlotPool, name: str, now: float) -> None:
        """Slot ``name`` was loaded at ``now``: spare it for a while (amortised O(1))."""
        self._recent[name] = now
        self._recent.move_to_end(name)
        spared = min(RECENT_MAX, pool.capacity // 4)
        most = min(RECENT_MAX, 3 * pool.capacity // 4)
        while len(self._recent) > spared:
            oldest = next(iter(self._recent.values()))
            if len(self._recent) <= most and now - oldest < SPARED_S:
                break
            self._recent.popitem(last=False)

    def candidates(self, pool: SlotPool, count: int, keep: Iterable[str] = ()) -> list[Slot]:
        """The slots whose usage to read before choosing ``count`` victims."""
        if count <= 0:
            return []
        kept = set(keep)
        excluded = kept | self._recent.keys()
        found = {s.name: s for s in pool.sample(self.samples + count, self._rng, excluded)}
        for name, slot in self._best.items():
            if name not in excluded and pool.get(name) is slot:
                found.setdefault(name, slot)
        if len(found) < count:  # nothing older left: the oldest of the recent ones
            for name in self._recent:
                recent = pool.get(name)
                if recent is not None and name not in kept:
                    found.setdefault(name, recent)
                    if len(found) >= count:
                        break
        return list(found.values())

    def choose(
        self,
        candidates: Sequence[Slot],
        count: int,
        usage: Mapping[str, HostUsage],
        read_at: float | None = None,
    ) -> list[Slot]:
        """The ``count`` least valuable of ``candidates`` (``usage`` read at ``read_at``;
        without it no slot counts as awaited); remembers the next best few."""
        values = {s.name: value(s, usage, read_at) for s in candidates}
        for slot in candidates:
            slot.seen_at = max(slot.seen_at, values[slot.name][2])
        ranked = sorted(candidates, key=lambda s: (*values[s.name], s.name))
        self._best = {s.name: s for s in ranked[count : count + self.keep_best]}
        return ranked[:count]


def usage_commands(table: str, hosts: Iterable[str]) -> list[protocol.Command]:
    """The usage-table entry of each of ``hosts`` (validated names): one command each."""
    return [protocol.show_entry(table, host) for host in hosts]


def parse_usage(replies: Iterable[str], expire_ms: int, now: float) -> dict[str, HostUsage]:
    """Usage by host from the replies to :func:`usage_commands` (absent: not in the table)."""
    found: dict[str, HostUsage] = {}
    for reply in replies:
        for entry in protocol.parse_show_table(reply):
            seen = usage_from_entry(entry, expire_ms, now)
            if seen is not None:
                found[entry.key] = seen
    return found


async def read_usage(
    client: RuntimeClient, table: str, expire_ms: int, hosts: Iterable[str], now: float
) -> dict[str, HostUsage]:
    """The usage-table entries of ``hosts``, in one pipelined round trip."""
    replies = await client.pipeline(usage_commands(table, sorted(set(hosts))))
    return parse_usage(replies, expire_ms, now)
