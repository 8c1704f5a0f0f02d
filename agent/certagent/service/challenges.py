"""ACME challenges that any node answers: published through the store, served by HAProxy.

The CA may validate against any node behind the balancer, so the agent that
places an order does not answer its challenges itself:

* :class:`FleetSolver` (the ordering agent's :class:`~certagent.acme.ChallengeSolver`)
  publishes each answer on the store's :class:`~certagent.store.issuance.ChallengeBoard`
  and tells the CA to validate only once every live node said it serves the answer
  (or after :data:`ACK_WAIT`, with a warning naming the nodes that did not);
  afterwards it withdraws the answer.
* :class:`ChallengeResponder` (on every agent) follows the board through the change
  feed's ``challenge`` changes and makes its HAProxy answer: HTTP-01 from a runtime
  map on ``fe_http``, TLS-ALPN-01 from a challenge slot of ``fe_tls`` holding a
  certificate this node makes itself (no key crosses the store).  It acks each
  answer it serves, and beats every :data:`BEAT_INTERVAL` seconds so that the
  solver knows which nodes are alive.

Cost: per challenge, one store write to publish, one per node to ack, a few
reads while waiting for acks (at once, then 2, 4, 8... ms apart, at most
:data:`ACK_POLL`); at rest one heartbeat per node per interval.
Nothing grows with the number of certificates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from certagent.acme import HTTP_01, TLS_ALPN_01, Authorization, Challenge
from certagent.acme.challenges import tls_alpn01_certificate
from certagent.errors import AgentError
from certagent.store.issuance import ChallengeBoard, ChallengeKind, PublishedChallenge

log = logging.getLogger(__name__)

#: A published answer lapses this long after it was published (a validation takes seconds).
CHALLENGE_TTL = 120.0
#: How long the solver waits for every live node to serve an answer.
ACK_WAIT = 5.0
#: The solver checks for acks at once, then after 2 ms, 4, 8... at most every 50 ms: a node
#: that follows the feed acks within milliseconds, so a fixed 50 ms cost most orders 50 ms.
ACK_POLL_FIRST = 0.002
ACK_POLL = 0.05
#: A node beats this often, and counts as alive for three beats.
BEAT_INTERVAL = 10.0
BEAT_TTL = 3 * BEAT_INTERVAL


class ChallengeAnswerer(Protocol):
    """What makes this node's HAProxy answer a challenge (the loader: the one writer)."""

    async def answer_http01(self, token: str, key_authorization: str) -> None: ...

    async def forget_http01(self, token: str) -> None: ...

    async def answer_tls_alpn01(self, name: str, pem: bytes) -> None:
        """Serve ``pem`` (certificate + key) to TLS-ALPN-01 clients of ``name``."""
        ...

    async def forget_tls_alpn01(self, name: str) -> None: ...


class FleetSolver:
    """Publishes challenge answers for the whole fleet (see the module docstring)."""

    def __init__(
        self,
        board: ChallengeBoard,
        *,
        challenge_types: Sequence[str] = (HTTP_01,),
        ack_wait: float = ACK_WAIT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.challenge_types: Sequence[str] = tuple(challenge_types)
        self.ack_wait = ack_wait
        self._clock = clock
        self.unacked = 0  # answers the CA was told to check before every node acked

    async def present(
        self, authorization: Authorization, challenge: Challenge, key_authorization: str
    ) -> None:
        kind: ChallengeKind = "tls-alpn-01" if challenge.type == TLS_ALPN_01 else "http-01"
        if challenge.token is None:
            raise AgentError(f"the CA's {challenge.type} challenge for {authorization.name}"
                             " has no token")
        await self.board.publish(
            PublishedChallenge(
                kind=kind,
                name=authorization.name,
                token=challenge.token,
                key_authorization=key_authorization,
                expires_at=self._clock() + CHALLENGE_TTL,
            )
        )
        await self._wait_for_acks(challenge.token, authorization.name)

    async def _wait_for_acks(self, token: str, name: str) -> None:
        deadline = time.monotonic() + self.ack_wait
        pause = ACK_POLL_FIRST
        while True:
            live, acked = await asyncio.gather(self.board.live_nodes(), self.board.acks(token))
            missing = live - acked
            if acked and not missing:
                return
            if time.monotonic() >= deadline:
                self.unacked += 1
                log.warning(
                    "challenge for %s: %s did not confirm serving it within %.0f s;"
                    " asking the CA to validate anyway",
                    name,
                    ", ".join(sorted(missing)) or "no node",
                    self.ack_wait,
                )
                return
            await asyncio.sleep(pause)
            pause = min(2 * pause, ACK_POLL)

    async def cleanup(self, authorization: Authorization, challenge: Challenge) -> None:
        if challenge.token is not None:
            await self.board.withdraw(challenge.token)


class ChallengeResponder:
    """Makes this node's HAProxy answer what the board holds (see the module docstring)."""

    def __init__(
        self,
        board: ChallengeBoard,
        answerer: ChallengeAnswerer,
        node: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.answerer = answerer
        self.node = node
        self._clock = clock
        self._served: dict[str, PublishedChallenge] = {}  # token -> what this node answers
        self._lock = asyncio.Lock()
        self.answered = 0
        self.failures = 0

    @property
    def serving(self) -> int:
        return len(self._served)

    def forget_served(self) -> None:
        """A new HAProxy session holds none of our answers: :meth:`sync` answers all again."""
        self._served.clear()

    async def sync(self) -> None:
        """Answer every live challenge on the board and drop the rest (start, reconnect).

        O(live challenges).
        """
        current = {c.token: c for c in await self.board.current()}
        for token in set(self._served) - set(current):
            await self._forget(token)
        for challenge in current.values():
            await self._answer(challenge)

    async def changed(self, token: str) -> None:
        """The feed said challenge ``token`` was published or withdrawn: follow it."""
        challenge = await self.board.get(token)
        if challenge is None:
            await self._forget(token)
        else:
            await self._answer(challenge)

    async def _answer(self, challenge: PublishedChallenge) -> None:
        async with self._lock:
            if challenge.token in self._served or challenge.expires_at <= self._clock():
                return
            try:
                if challenge.kind == "http-01":
                    await self.answerer.answer_http01(challenge.token, challenge.key_authorization)
                else:
                    made = tls_alpn01_certificate(challenge.name, challenge.key_authorization)
                    await self.answerer.answer_tls_alpn01(challenge.name, made.pem)
            except AgentError as exc:
                self.failures += 1
                log.warning("cannot answer the %s challenge for %s: %s", challenge.kind,
                            challenge.name, exc)
                return
            self._served[challenge.token] = challenge
            self.answered += 1
        await self.board.ack(challenge.token, self.node)
        log.info("answering the %s challenge for %s", challenge.kind, challenge.name)

    async def _forget(self, token: str) -> None:
        async with self._lock:
            challenge = self._served.pop(token, None)
            if challenge is None:
                return
            try:
                if challenge.kind == "http-01":
                    await self.answerer.forget_http01(token)
                else:
                    await self.answerer.forget_tls_alpn01(challenge.name)
            except AgentError as exc:
                log.warning("cannot remove the %s challenge for %s: %s", challenge.kind,
                            challenge.name, exc)

    async def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, c in self._served.items() if c.expires_at <= now]:
            await self._forget(token)

    async def run(self, stop: asyncio.Event) -> None:
        """Beat, and drop lapsed answers, every :data:`BEAT_INTERVAL` s until ``stop``."""
        first = True
        while not stop.is_set():
            try:
                await self.board.beat(self.node, BEAT_TTL)
                if first:
                    await self.sync()
                    first = False
                await self._expire()
            except AgentError as exc:
                log.warning("challenge board: %s; retrying in %.0f s", exc, BEAT_INTERVAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), BEAT_INTERVAL)

    def status(self) -> dict[str, int]:
        return {"serving": self.serving, "answered": self.answered, "failures": self.failures}
