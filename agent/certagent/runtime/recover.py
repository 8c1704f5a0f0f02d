"""Getting out of a state that HAProxy 2.6.12 cannot leave without crashing: a reload.

Measured, and read in HAProxy 2.6's ``src/ssl_ckch.c``: ``commit ssl cert`` runs
in an I/O handler, and when its client is gone before it finishes (the agent
killed by SIGKILL while HAProxy works through its last batch), the handler's
release callback frees the transaction's new certificate store but leaves
``ckchs_transaction`` pointing at it.  ``show ssl cert`` still lists
``*<slot>``; ``abort``, ``set`` or ``commit`` on it use freed memory, and the
worker dies with SIGSEGV (the master then exits with it).

So the agent never touches a transaction it finds at connect.  It asks
HAProxy's master for a graceful reload -- ``reload`` on the master CLI when
``haproxy_master_socket`` is set (Debian's unit runs ``haproxy -S``, and its
master runs as root), else SIGUSR2 to the worker's parent: the new worker
starts without the transaction, the old one finishes its connections and
exits, and the agent re-warms the new worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from certagent.errors import HAProxyError, HAProxyUnavailable, StrayTransaction
from certagent.runtime import protocol
from certagent.runtime.adopt import adopt
from certagent.runtime.client import Identity, RuntimeClient, probe_identity
from certagent.runtime.haproxycfg import HAProxyNames
from certagent.runtime.pool import SlotPool

log = logging.getLogger(__name__)

# How long a reload the agent asked for may take before the new worker answers (s).
RELOAD_WAIT = 15.0
# How long HAProxy's master CLI may take to take the reload request (s).
MASTER_TIMEOUT = 5.0


def master_of(worker_pid: int) -> int:
    """The pid of ``worker_pid``'s HAProxy master (its parent); HAProxyError if it has none.

    HAProxy must run in master-worker mode (``-W``, as the generated setup and
    Debian's unit do); a worker without a master cannot be reloaded from here.
    """
    try:
        stat = Path(f"/proc/{worker_pid}/stat").read_text()
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError) as exc:
        raise HAProxyError(f"cannot find the master of HAProxy worker {worker_pid}: {exc}") from exc
    if parent <= 1 or not cmdline or b"haproxy" not in os.path.basename(cmdline[0]):
        raise HAProxyError(
            f"HAProxy worker {worker_pid} has no master process (pid {parent} is not haproxy);"
            " run HAProxy in master-worker mode (-W) so that the agent can reload it"
        )
    return parent


async def reload_through_master_socket(path: str, timeout: float = MASTER_TIMEOUT) -> None:
    """``reload`` on HAProxy's master CLI (``haproxy -S <path>``); HAProxyError if refused.

    Waits for the master's first bytes (or its closing the connection), at most
    ``timeout`` seconds.
    """
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                writer.write(protocol.master_reload().encode())
                await writer.drain()
                await reader.read(4096)
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        reason = str(exc) or f"no answer within {timeout:.0f}s"
        raise HAProxyError(
            f"cannot ask HAProxy's master to reload on {path}: {reason}; it must be HAProxy's"
            " master CLI (haproxy -S), reachable by the agent's user"
        ) from exc
    log.warning("asked HAProxy's master for a graceful reload on %s", path)


async def graceful_reload(worker_pid: int, master_socket: str = "") -> int:
    """Ask HAProxy's master to reload: through its CLI if given, else SIGUSR2.

    Returns the master's pid (0 when asked through the socket).
    """
    if master_socket:
        await reload_through_master_socket(master_socket)
        return 0
    master = master_of(worker_pid)
    try:
        os.kill(master, signal.SIGUSR2)
    except OSError as exc:
        raise HAProxyError(
            f"cannot signal HAProxy's master (pid {master}) to reload: {exc.strerror}; the agent"
            " must run as HAProxy's user"
        ) from exc
    log.warning("asked HAProxy's master (pid %d) for a graceful reload", master)
    return master


async def reload_and_adopt(
    client: RuntimeClient,
    pool: SlotPool,
    names: HAProxyNames,
    stray: StrayTransaction,
    clock: Callable[[], float],
    master_socket: str = "",
) -> tuple[Identity, list[str]]:
    """Reload HAProxy around ``stray``; the new worker's identity and the hosts to re-warm.

    The broken worker's marked hosts are read first (a read is safe), most
    recently used first; then the connection closes, the master reloads, and
    the new worker is adopted.  A second stray transaction there is an error.
    """
    old = client.identity
    if old is None:
        raise stray
    log.error(
        "%s: a commit cut short (an agent killed mid-batch) leaves it on freed memory in"
        " HAProxy 2.6.12, and any command on it crashes the worker; reloading HAProxy instead",
        stray,
    )
    hosts = await _marked_by_recency(client, names)
    await client.close()
    await graceful_reload(old.pid, master_socket)
    deadline = clock() + RELOAD_WAIT
    while True:
        try:
            seen: Identity | None = await probe_identity(client.path, timeout=client.timeout)
        except HAProxyError:
            seen = None
        if seen is not None and seen.pid != old.pid:
            break
        if clock() > deadline:
            raise HAProxyUnavailable(
                f"HAProxy did not come back from the reload within {RELOAD_WAIT:.0f}s"
            ) from stray
        await asyncio.sleep(0.05)
    identity = await client.connect()
    await adopt(client, pool, names, clock())
    return identity, hosts


async def _marked_by_recency(client: RuntimeClient, names: HAProxyNames) -> list[str]:
    """Hosts the connected worker marks loaded, most recently used first (O(K), read-only)."""
    try:
        reply = await client.execute(protocol.show_marked(names.usage_table))
    except HAProxyError as exc:
        log.warning("cannot read the loaded hosts before the reload: %s", exc)
        return []
    entries = protocol.parse_show_table(reply)
    entries.sort(key=lambda e: -(e.expire_ms or 0))  # the longest expiry was used last
    return [e.key for e in entries]
