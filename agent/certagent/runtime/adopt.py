"""Adoption: rebuild the slot pool from what a running HAProxy holds.

Runs when the loader (re)connects: after an agent restart, an HAProxy reload
or a lost connection.  Costs O(K), once per connection: ``show ssl cert``, the
crt-list and the usage table's loaded hosts are read whole, and each slot's
certificate once (``show ssl cert <slot>``, pipelined).
"""

from __future__ import annotations

import logging

from certagent.certs.selfsigned import PLACEHOLDER_NAME
from certagent.errors import StrayTransaction
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import Slot, SlotPool

log = logging.getLogger(__name__)

# ``show ssl cert <slot>`` commands per pipelined write while adopting.
CHUNK = 256


async def adopt(client: RuntimeClient, pool: SlotPool, names: HAProxyNames, now: float) -> None:
    """Read slots and loaded hosts into ``pool`` (emptied first).

    Raises :class:`StrayTransaction` if HAProxy holds an open certificate
    transaction: the loader then reloads HAProxy instead (see
    :mod:`certagent.runtime.recover`).

    A slot listed in the crt-list with the placeholder is free; one known but
    not listed is spare; two slots with one certificate keep the hosts of one.
    Hosts marked loaded in a slot that does not hold a certificate are unmarked.
    """
    c = client
    pool.clear()
    certs = protocol.parse_show_ssl_cert(await c.execute(protocol.show_certs()))
    if certs.transaction is not None:
        # Never abort it: after a commit cut short by its client's death, 2.6.12 keeps
        # a transaction on freed memory, and abort/set/commit on it crash the worker.
        raise StrayTransaction(certs.transaction)
    listing = await c.execute(protocol.show_crtlist(names.crt_list))
    in_list = set(protocol.parse_show_crtlist(listing))
    marked: dict[str, list[str]] = {}  # slot name -> hosts marked loaded in it
    stale: list[str] = []
    table = await c.execute(protocol.show_marked(names.usage_table))
    for entry in protocol.parse_show_table(table):
        if entry.gpt0:
            marked.setdefault(pool.slot_name(entry.gpt0), []).append(entry.key)
    listed = [n for n in certs.names if pool.is_slot_name(n)]
    for name in listed:
        if name not in in_list:
            pool.add_spare(name)
    held = [n for n in listed if n in in_list]
    for start in range(0, len(held), CHUNK):
        chunk = held[start : start + CHUNK]
        replies = await c.pipeline([protocol.show_cert(n) for n in chunk])
        for name, reply in zip(chunk, replies, strict=True):
            details = protocol.parse_cert_details(reply)
            if details.dns_names == (PLACEHOLDER_NAME,):
                pool.add_free(name)
                continue
            slot = Slot(
                name,
                details.fingerprint_sha1,
                None,
                set(marked.pop(name, [])),
                now,
                names=details.dns_names,
            )
            if pool.for_fingerprint(slot.fingerprint) is not None:
                # Two slots with one certificate: keep the first one's hosts, recycle this one.
                stale += sorted(slot.hosts)
                slot.hosts.clear()
                slot.fingerprint = f"duplicate:{name}"
            pool.place(slot)
    stale += [host for hosts in marked.values() for host in hosts]  # marks of no slot
    if stale:
        unmarks = [x for h in stale for x in protocol.unmark(names.usage_table, h)]
        answers = iter(await c.pipeline(unmarks))
        for _ in stale:
            protocol.check_unmark(answers)
    log.info(
        "adopted %d slots (%d hosts marked loaded) from HAProxy pid %s",
        len(pool),
        sum(len(s.hosts) for s in pool.slots),
        c.identity.pid if c.identity else "?",
    )
