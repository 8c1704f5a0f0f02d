"""The store's online migration: records of format 1 (hashes) rewritten in format 2 (strings).

Run by ``certagent fleet finalize`` once the store is at format 2, and again by every
later ``finalize`` (records a racing writer left behind; a cluster's writers read the
format before writing, not in one transaction with it).  Records keep their id,
version, metadata, OCSP response and index entries, and no event is written (the
certificates did not change); agents keep serving throughout, as every release since
0.2.0 reads both.  Each record is swapped only if it is still the one read
(:data:`~._rows.SWAP`): a write meanwhile wins (in the active format) and the record is
read again.

Cost: O(N) records read in batches of :data:`BATCH` (one pipeline each, two while some
are hashes), and per batch of hashes one pipeline of chain writes and one of swaps; CPU
is the decryption, parse and packing of each hash (≈0.2 ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import redis.asyncio

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import parse_bundle
from certagent.errors import CertificateError, KeyDecryptError
from certagent.store.formats import Migration
from certagent.store.redis._layout import F_CHAIN, F_KEY, F_OCSP, Keys
from certagent.store.redis._listing import every_id
from certagent.store.redis._packed import chain_digest, pack_record
from certagent.store.redis._records import decode_record, parse_names
from certagent.store.redis._rows import SWAP, Row, decode, fetch

__all__ = ["BATCH", "migrate", "repack"]

log = logging.getLogger(__name__)

BATCH = 500
#: Rounds for the records a write changed under the migration.
_ROUNDS = 3


def repack(ring: KeyRing, cert_id: str, row: Row) -> tuple[bytes, bytes]:
    """A hash's record as format 2 (its key decrypted and sealed again with the current
    data key): ``(record, chain)``.  ValueError (saying why) if it cannot be."""
    token, chain = row.fields.get(F_KEY), row.fields.get(F_CHAIN)
    if token is None or chain is None:
        raise ValueError("the chain or the key is missing")
    try:
        key = keycrypt.decrypt(ring, token, cert_id.encode("ascii"))
        bundle = parse_bundle(chain, key, rsa_key_check="match")  # checked on upload
    except (KeyDecryptError, CertificateError) as exc:
        raise ValueError(str(exc)) from exc
    record = decode_record(cert_id, row.meta)
    return pack_record(
        ring, record, bundle, ocsp=row.fields.get(F_OCSP), dropped=parse_names(row.dropped)
    )


async def migrate(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    ring: KeyRing,
    progress: Callable[[Migration], None] | None = None,
) -> Migration:
    """Rewrite every hash record in format 2; ``progress`` after each batch.

    redis-py errors escape (the store translates them).
    """
    report = Migration()
    async for ids in every_id(client, keys, BATCH):
        report.scanned += len(ids)
        await _batch(client, keys, shown, ring, ids, report)
        if progress is not None:
            progress(report)
    log.info(
        "migrated %s to format 2: %d records read, %d rewritten, %d left in format 1",
        shown,
        report.scanned,
        report.rewritten,
        report.left,
    )
    return report


async def _batch(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    ring: KeyRing,
    ids: Sequence[str],
    report: Migration,
) -> None:
    todo = list(ids)
    for _ in range(_ROUNDS):
        replies = await fetch(client, keys, todo, [F_CHAIN])
        swaps: list[tuple[str, bytes, bytes]] = []
        chains: dict[bytes, bytes] = {}
        for cert_id, reply in zip(todo, replies, strict=True):
            try:
                row = None if isinstance(reply, Exception) else decode(reply, [F_CHAIN])
                if row is None or row.packed is not None:
                    continue  # gone, or format 2 already
                payload, chain = repack(ring, cert_id, row)
            except ValueError as exc:
                log.warning("cannot rewrite record %r of %s in format 2: %s", cert_id, shown, exc)
                report.note(cert_id, str(exc))
                continue
            if chain:
                chains[chain_digest(chain)] = chain
            swaps.append((cert_id, row.state, payload))
        if not swaps:
            return
        async with client.pipeline(transaction=False) as pipe:
            for digest, chain in chains.items():  # before any record naming them
                pipe.set(keys.chain(digest), chain)
            for cert_id, state, payload in swaps:
                pipe.eval(SWAP, 1, keys.cert(cert_id), state, payload)
            done = (await pipe.execute())[len(chains) :]
        todo = []
        for (cert_id, _, _), reply in zip(swaps, done, strict=True):
            if reply == 1:
                report.rewritten += 1
            elif reply == 0:
                todo.append(cert_id)  # written meanwhile: read it again
        if not todo:
            return
    for cert_id in todo:
        report.note(cert_id, "it kept changing while the migration ran; run it again")
