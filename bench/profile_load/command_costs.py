"""q1: HAProxy CPU per runtime-API command of a load, and of the map and table commands.

At the pool's current K (K slots, K pool-map entries, K table entries, and K entries
in the dense control map): a load into a recycled slot (``set``, ``commit``, the
trailing ``abort``), a load into a new slot (``new``, ``set`` + ``commit``, ``add ssl
crt-list``), ``add``/``set``/``del map`` and ``set``/``show``/``clear table``.
Each figure is one batch's worker CPU per operation, repeated ``reps`` times.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from bench import _runtime_api as api
from bench.profile_load.rig import TABLE, ProfiledHAProxy, dense_key, host, slot
from bench.profile_load.session import summary
from bench.profile_load.settings import say
from certagent.testing import rss_kb


class Samples(dict[str, list[float]]):
    """µs per operation, one sample per repetition, by case."""

    def add(self, case: str, value: float) -> None:
        self.setdefault(case, []).append(value)

    def diff(self, a: str, b: str) -> list[float]:
        """``a - b`` within each repetition."""
        return [x - y for x, y in zip(self[a], self[b], strict=True)]

    def total(self, *cases: str) -> list[float]:
        """The sum of ``cases`` within each repetition."""
        return [sum(values) for values in zip(*(self[c] for c in cases), strict=True)]


def command_costs(rig: ProfiledHAProxy, label: str) -> dict[str, Any]:
    """Every case at the pool's current K, ``reps`` times, round-robin."""
    params, k = rig.params, rig.k
    rng = random.Random(k)
    # set/del map walk the whole map (~35/19 ms per command at 100k entries): fewer ops
    n_map = params.n_cheap if k <= 10_000 else max(20, params.n_cheap * 3000 // k)
    rig.fill_dense_map(k)
    say(
        f"q1 at K={k:,}: {params.reps} reps, N={params.n_cert} (certificate commands), "
        f"N={params.n_cheap} (table), N={n_map} (maps)"
    )
    samples = Samples()
    for rep in range(params.reps):
        rig.budget.check(f"q1 {label} rep {rep}", 5)
        rig.alive()
        samples.add(
            "show version (CLI floor)",
            rig.meter.timed([api.show_version()] * params.n_cheap, params.n_cheap, "show version"),
        )
        _recycled_slot(rig, rng, samples)
        _new_slot(rig, samples)
        _maps(rig, rng, n_map, samples)
        _table(rig, rng, rep, samples)
    return {
        "k_slots": k,
        "k_slots_at_end": rig.k + len(rig.extra_slots),
        "map_entries": k,
        "table_entries": k,
        "rss_mb": round(rss_kb(rig.pid) / 1024, 1),
        "n_cert": params.n_cert,
        "n_cheap": params.n_cheap,
        "n_map": n_map,
        "dense_map_entries": rig.dense_k,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "measured": {name: summary(v) for name, v in samples.items()},
        "derived": {name: summary(v) for name, v in _derived(samples).items()},
    }


def _recycled_slot(rig: ProfiledHAProxy, rng: random.Random, samples: Samples) -> None:
    """A load into listed slots: ``set`` alone, ``set`` + ``commit``, + ``abort``; an abort."""
    n, k = rig.params.n_cert, rig.k
    # set ssl cert into a recycled (listed) slot, repeated on one slot; abort afterwards
    one = slot(rng.randrange(k))
    pems = [rig.fresh_pem("q1s-") for _ in range(n)]
    samples.add(
        "set ssl cert (recycled slot)",
        rig.meter.timed([api.set_cert(one, pem) for pem in pems], n, "set"),
    )
    rig.session.run([api.abort_open(one)], "abort after set")

    steps: list[api.Step] = []
    for s in (slot(i) for i in rng.sample(range(k), n)):
        steps += [api.set_cert(s, rig.fresh_pem("q1c-")), api.commit_cert(s)]
    samples.add("set+commit (recycled slot)", rig.meter.timed(steps, n, "set+commit"))

    steps = []
    for s in (slot(i) for i in rng.sample(range(k), n)):
        steps += api.load(s, rig.fresh_pem("q1a-"))  # the agent's sequence
    samples.add("set+commit+abort (recycled slot)", rig.meter.timed(steps, n, "set+commit+abort"))

    # abort with no transaction open (what the trailing abort does after a good commit)
    one = slot(rng.randrange(k))
    samples.add(
        "abort ssl cert (no transaction)",
        rig.meter.timed([api.abort_closed(one)] * n, n, "abort"),
    )


def _new_slot(rig: ProfiledHAProxy, samples: Samples) -> None:
    """A new slot: ``new``, ``set`` + ``commit`` into the unlisted store, ``add ssl crt-list``."""
    n = rig.params.n_cert
    news = [rig.unique("/certagent/new-") for _ in range(n)]
    samples.add("new ssl cert", rig.meter.timed([api.new_cert(s) for s in news], n, "new"))
    steps: list[api.Step] = []
    for s in news:
        steps += [api.set_cert(s, rig.fresh_pem("q1n-")), api.commit_cert(s)]
    samples.add("set+commit (new, unlisted store)", rig.meter.timed(steps, n, "set+commit new"))
    samples.add(
        "add ssl crt-list (new slot)",
        rig.meter.timed([api.add_to_crtlist(rig.crtlist, s) for s in news], n, "add crt-list"),
    )
    rig.extra_slots += news


def _maps(rig: ProfiledHAProxy, rng: random.Random, n_map: int, samples: Samples) -> None:
    """Add new keys, set existing keys, delete the new keys (the map is back to K entries).

    'pool map' is the map filled along with the certificates (entries scattered among
    ~20 KB of certificate data each, as in the agent); 'dense map' is a second map
    filled with K entries in one burst (contiguous allocations), as a control.
    """
    k = rig.k
    for which, map_file, key_of in (
        ("pool map", rig.mapfile, host),
        ("dense map", rig.densemap, dense_key),
    ):
        keys = [rig.unique("q1m-") + ".test" for _ in range(n_map)]
        samples.add(
            f"add map (new key), {which}",
            rig.meter.timed(
                [api.add_map(map_file, x, "/certagent/x") for x in keys], n_map, "add map"
            ),
        )
        existing = [key_of(i) for i in rng.sample(range(k), min(n_map, k))]
        samples.add(
            f"set map (existing key), {which}",
            rig.meter.timed(
                [api.set_map(map_file, x, slot(0)) for x in existing], len(existing), "set map"
            ),
        )
        samples.add(
            f"del map (key), {which}",
            rig.meter.timed([api.del_map(map_file, x) for x in keys], n_map, "del map"),
        )


def _table(rig: ProfiledHAProxy, rng: random.Random, rep: int, samples: Samples) -> None:
    """``set table`` on existing and new keys, ``show table key``, ``clear``, a full dump."""
    n, k = rig.params.n_cheap, rig.k
    existing = [host(i) for i in rng.sample(range(k), min(n, k))]
    samples.add(
        "set table key data.gpt0 (existing key)",
        rig.meter.timed(
            [api.set_gpt0(TABLE, x, rep + 2) for x in existing], len(existing), "set table"
        ),
    )
    new_keys = [rig.unique("q1t-") + ".test" for _ in range(n)]
    samples.add(
        "set table key data.gpt0 (new key)",
        rig.meter.timed([api.set_gpt0(TABLE, x, 1) for x in new_keys], n, "set table new"),
    )
    samples.add(
        "show table key (existing key)",
        rig.meter.timed(
            [api.show_table_key(TABLE, x) for x in existing], len(existing), "show table key"
        ),
    )
    samples.add(
        "clear table key",
        rig.meter.timed([api.clear_table_key(TABLE, x) for x in new_keys], n, "clear table"),
    )
    samples.add(
        "show table (full dump, per command)",
        rig.meter.timed([api.show_table(TABLE)], 1, "show table"),
    )


def _derived(samples: Samples) -> dict[str, list[float]]:
    """Costs that cannot be sent alone, paired within each repetition."""
    derived = {
        "commit ssl cert (recycled slot) = set+commit - set": samples.diff(
            "set+commit (recycled slot)", "set ssl cert (recycled slot)"
        ),
        "abort after a successful commit = set+commit+abort - set+commit": samples.diff(
            "set+commit+abort (recycled slot)", "set+commit (recycled slot)"
        ),
        "commit (new, unlisted store) = set+commit(new) - set": samples.diff(
            "set+commit (new, unlisted store)", "set ssl cert (recycled slot)"
        ),
        "full new-slot load = new + set+commit + add crt-list": samples.total(
            "new ssl cert", "set+commit (new, unlisted store)", "add ssl crt-list (new slot)"
        ),
    }
    for which in ("pool map", "dense map"):
        derived[f"remap a host = del map + add map, {which}"] = samples.total(
            f"del map (key), {which}", f"add map (new key), {which}"
        )
    return derived
