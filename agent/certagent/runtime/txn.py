"""One certificate transaction outside a load batch, and OCSP stapling on a loaded slot.

``set ssl cert S <<PEM`` [``set ssl cert S.ocsp <<BASE64``] ``commit ssl cert S``,
aborted on failure (never a transaction left open: see docs/haproxy.md, 2.6.12);
``set ssl ocsp-response <<BASE64`` replaces the response of a certificate that
already staples one, with no transaction.  The caller holds the loader's
single-writer lock.
"""

from __future__ import annotations

import base64
import logging

from certagent.errors import HAProxyError, WrongTransaction
from certagent.runtime import protocol
from certagent.runtime.client import RuntimeClient

__all__ = ["abort_quietly", "replace_ocsp", "set_and_commit"]

log = logging.getLogger(__name__)


async def set_and_commit(
    client: RuntimeClient, name: str, pem: bytes | None, ocsp: bytes | None = None
) -> None:
    """Put ``pem`` (None: keep the certificate) and ``ocsp`` into ``name``, then commit."""
    try:
        if pem is not None:
            reply = await client.execute_cert("set", "ssl", "cert", name, payload=pem)
            protocol.check_set_cert(name, reply)
        if ocsp is not None:
            reply = await client.execute_cert(
                "set", "ssl", "cert", f"{name}.ocsp", payload=base64.b64encode(ocsp) + b"\n"
            )
            protocol.check_set_cert(name, reply)
        protocol.check_commit_cert(name, await client.execute_cert("commit", "ssl", "cert", name))
    except WrongTransaction:
        raise
    except HAProxyError:
        await abort_quietly(client, name)
        raise


async def replace_ocsp(client: RuntimeClient, ocsp: bytes) -> None:
    """A fresh response for a certificate HAProxy already staples (matched by its CertID)."""
    reply = await client.execute(
        "set", "ssl", "ocsp-response", payload=base64.b64encode(ocsp) + b"\n"
    )
    protocol.check_set_ocsp(reply)


async def abort_quietly(client: RuntimeClient, name: str) -> None:
    if not client.connected:
        return
    try:
        reply = await client.execute_cert("abort", "ssl", "cert", name)
    except HAProxyError as exc:
        log.warning("abort ssl cert %s after a failed load: %s", name, exc)
        return
    log.info("aborted transaction on %s after a failed load: %s", name, reply[:120])
