"""A certificate transaction outside a load batch, and OCSP stapling on a loaded slot.

The commands and the judgement of their replies are
:class:`certagent.runtime.protocol.Transaction`, the same ones a load batch
sends (:mod:`certagent.runtime.batch`): ``set ssl cert`` [+ its ``.ocsp``],
``commit ssl cert`` and a trailing ``abort ssl cert``, in one write, so no
transaction is left open (docs/haproxy.md, 2.6.12).  Here alone, a transaction
HAProxy answers ``currently locked`` is sent again after a short backoff.

``set ssl ocsp-response`` replaces the response of a certificate that already
staples one, with no transaction.  The caller holds the loader's single-writer
lock.  Cost: one round trip per attempt, whatever the number of slots.
"""

from __future__ import annotations

import asyncio
import logging

from certagent.errors import Locked
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient

__all__ = ["LOCKED_RETRIES", "commit", "replace_ocsp"]

log = logging.getLogger(__name__)

#: A transaction answered ``currently locked`` is sent again this many times at most,
#: after 10 ms, 20 ms, ... (0.63 s in all).
LOCKED_RETRIES = 6


async def commit(
    client: RuntimeClient, transaction: protocol.Transaction, *, retries: int = LOCKED_RETRIES
) -> None:
    """Run ``transaction``; raises as :meth:`~certagent.runtime.protocol.Transaction.check`."""
    delay = 0.01
    for attempt in range(retries + 1):
        replies = await client.pipeline(transaction.commands())
        try:
            transaction.check(replies)
        except Locked:
            if attempt == retries:
                raise
            log.warning("HAProxy certificate operations locked; retrying in %.0f ms", delay * 1000)
            await asyncio.sleep(delay)
            delay *= 2
        else:
            return


async def replace_ocsp(client: RuntimeClient, ocsp: bytes) -> None:
    """A fresh response for a certificate HAProxy already staples (matched by its CertID)."""
    protocol.check_set_ocsp(await client.execute(protocol.set_ocsp_response(ocsp)))
