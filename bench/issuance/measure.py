"""The two timings of the issuance bench: a first connection, and the CA's own order.

* :func:`first_connections`: a verified TLS handshake per never-seen name (the
  agent orders while HAProxy holds the connection), ``workers`` at a time.
* :func:`ca_orders`: the same number of orders placed directly with
  :mod:`certagent.acme`, HTTP-01 answered through the node's HAProxy map (the
  path the agent's own answers take, without the store and the agent).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench import _runtime_api as api
from bench._load import client_context
from bench.issuance.breakdown import captured_orders, order_spans
from bench.scale.common import Cpu
from certagent.acme import (
    AccountKey,
    AcmeClient,
    AcmeProtocolError,
    Authorization,
    Challenge,
    obtain_certificate,
)
from certagent.errors import AgentError
from certagent.runtime.client import RuntimeClient
from certagent.testing import tlsclient

#: past the agent's hold (10 s): a connection that got the fallback still ends
HANDSHAKE_TIMEOUT = 20.0
ORDER_TIMEOUT = 60.0


@dataclass
class Timed:
    """Seconds per name that went well, and what went wrong with the others."""

    seconds: list[float] = field(default_factory=list)
    fallback: int = 0  # a certificate that did not verify: the default one
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0  # seconds for the whole batch
    #: name -> wall-clock (time.time) start and end of its first connection
    marks: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: seconds from newOrder's answer to the downloaded chain, per direct order
    order_seconds: list[float] = field(default_factory=list)

    def fail(self, name: str, exc: BaseException) -> None:
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(f"{name}: {exc!r}"[:300])


def _first_connection(port: int, name: str, ctx: ssl.SSLContext, out: Timed) -> float:
    """Seconds from connect() to a handshake verified against pebble's root for ``name``."""
    wall = time.time()
    started = time.perf_counter()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        took = time.perf_counter() - started
        out.marks[name] = (wall, wall + took)
        der = tls.getpeercert(binary_form=True)
    if der is None or name not in tlsclient.cert_info(der).san:
        raise ssl.SSLError(f"the certificate served for {name} does not name it")
    return took


def first_connections(port: int, root: Path, names: Sequence[str], workers: int) -> Timed:
    """One first connection per name, ``workers`` at a time; each must verify."""
    ctx = client_context(root)
    out = Timed()

    def one(name: str) -> None:
        try:
            out.seconds.append(_first_connection(port, name, ctx, out))
        except ssl.SSLCertVerificationError:
            out.fallback += 1
        except OSError as exc:  # ssl errors and timeouts included
            out.fail(name, exc)

    started = time.perf_counter()
    if workers == 1:
        for name in names:
            one(name)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, names))
    out.wall = time.perf_counter() - started
    return out


def _token(challenge: Challenge) -> str:
    if challenge.token is None:
        raise AcmeProtocolError(f"the http-01 challenge {challenge.url} has no token")
    return challenge.token


class MapSolver:
    """HTTP-01 answers in the node's fe_http map, through HAProxy's runtime API."""

    challenge_types: Sequence[str] = ("http-01",)

    def __init__(self, runtime: RuntimeClient, map_file: str) -> None:
        self.runtime = runtime
        self.map_file = map_file

    async def present(
        self, authorization: Authorization, challenge: Challenge, key_authorization: str
    ) -> None:
        step = api.add_map(self.map_file, _token(challenge), key_authorization)
        step.check(await self.runtime.execute(step.command))

    async def cleanup(self, authorization: Authorization, challenge: Challenge) -> None:
        step = api.del_map(self.map_file, _token(challenge))
        step.check(await self.runtime.execute(step.command))


@dataclass
class DirectCa:
    """Orders of the bench's own at the node's CA, answered through the node's HAProxy."""

    directory_url: str
    ca_file: Path
    admin_socket: str
    map_file: str

    def orders(self, names: Sequence[str], workers: int, warmup: str, cpu: Cpu) -> Timed:
        """One order per name, ``workers`` at a time, after an untimed one for ``warmup``.

        A new account per batch; the warm-up order fetches the directory and opens
        the kept-alive connection, as the agent's first order did.  ``cpu`` is read
        around the timed orders only.
        """
        with captured_orders() as events:
            out = asyncio.run(self._orders(names, workers, warmup, cpu))
        spans = order_spans(events)
        out.order_seconds = [end - start for n, (start, end) in spans.items() if n in names]
        return out

    async def _orders(self, names: Sequence[str], workers: int, warmup: str, cpu: Cpu) -> Timed:
        runtime = RuntimeClient(self.admin_socket)
        await runtime.connect()
        try:
            key = AccountKey.generate()
            async with AcmeClient(self.directory_url, key, ca_file=str(self.ca_file)) as client:
                await client.register(terms_agreed=True)
                solver = MapSolver(runtime, self.map_file)
                await obtain_certificate(client, [warmup], solver, timeout=ORDER_TIMEOUT)
                cpu.start()
                try:
                    return await _batch(client, solver, names, workers)
                finally:
                    cpu.stop()
        finally:
            await runtime.close()


async def _batch(
    client: AcmeClient, solver: MapSolver, names: Sequence[str], workers: int
) -> Timed:
    out = Timed()
    gate = asyncio.Semaphore(workers)

    async def one(name: str) -> None:
        async with gate:
            started = time.perf_counter()
            try:
                await obtain_certificate(client, [name], solver, timeout=ORDER_TIMEOUT)
            except (AgentError, OSError) as exc:  # counted and shown in the result
                out.fail(name, exc)
                return
            out.seconds.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(n) for n in names))
    out.wall = time.perf_counter() - started
    return out
