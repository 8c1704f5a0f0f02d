"""May the agent ask a CA for a certificate for this name?  The permission policy.

No name reaches the CA unless a policy allows it.  Policies combine: a name is
allowed if any of them allows it, tried cheapest first:

1. **suffix rules** (``acme_allow_suffixes``): ``example.com`` allows example.com
   and every name under it; in memory, free;
2. **registered names** (``acme_registered``): names a platform registered with
   ``certagent domain add`` or ``POST /v1/domains``; one store read, spent from the
   store-lookup budget like a certificate lookup;
3. **the ask endpoint** (``acme_ask``), Caddy-compatible: ``GET <url>?domain=<name>``;
   any 2xx allows, anything else (another status, a timeout, a refused connection)
   denies; at most ``acme_ask_rate`` requests a second (more are denied, not cached).

Answers are cached, allowed ones for ``acme_allow_ttl`` seconds and denied ones for
``acme_deny_ttl`` (at most ``CACHE_SIZE`` names, least recently asked dropped first),
so a name costs the store or the endpoint at most one request per TTL; a change of
a registration (the change feed's ``domain`` kind) drops that name's entry.  The
name filter and the lookup budget of the ensure path stay in front of all of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import aiohttp

from certagent.certs import hostname
from certagent.errors import AgentError, ConfigError
from certagent.service.flood import LookupBudget
from certagent.store.issuance import DomainRegistry

log = logging.getLogger(__name__)

#: Names whose answer is cached, at most.
CACHE_SIZE = 100_000


class By(StrEnum):
    """Which policy decided (``none``: no policy allowed it)."""

    SUFFIX = "suffix"
    REGISTERED = "registered"
    ASK = "ask"
    NONE = "none"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    by: By
    cached: bool = False
    reason: str = ""  # for a denial: what was asked and what it answered
    transient: bool = False  # a denial for now (over a rate, endpoint unreachable): ask later


@dataclass
class PermissionCounters:
    allowed: int = 0
    denied: int = 0
    cached: int = 0
    ask_requests: int = 0
    ask_errors: int = 0  # timeouts, refused connections: denials that are not cached
    over_budget: int = 0  # asks skipped for the ask rate (denied, not cached)


def parse_suffixes(value: str) -> tuple[str, ...]:
    """``acme_allow_suffixes`` (names separated by spaces or commas) -> validated suffixes.

    ConfigError naming the bad entry; a leading ``.`` or ``*.`` is accepted and
    dropped (``.example.com`` and ``example.com`` mean the same here).
    """
    out: list[str] = []
    for raw in value.replace(",", " ").split():
        entry = raw.removeprefix("*.").removeprefix(".")
        try:
            out.append(hostname.normalise(entry))
        except AgentError as exc:
            raise ConfigError(f"acme_allow_suffixes: {raw!r} is not a domain name ({exc})") from exc
    return tuple(out)


def suffix_allows(suffixes: Iterable[str], name: str) -> bool:
    """Whether ``name`` is one of ``suffixes`` or under one of them."""
    return any(name == s or name.endswith("." + s) for s in suffixes)


class _Cache:
    """Answers for names until they expire; LRU-bounded."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Decision]] = OrderedDict()

    def get(self, name: str) -> Decision | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        until, decision = entry
        if until <= self._clock():
            del self._entries[name]
            return None
        self._entries.move_to_end(name)
        return decision

    def put(self, name: str, decision: Decision, ttl: float) -> None:
        if ttl <= 0:
            return
        self._entries[name] = (self._clock() + ttl, decision)
        self._entries.move_to_end(name)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def drop(self, name: str) -> None:
        self._entries.pop(name, None)

    def __len__(self) -> int:
        return len(self._entries)


class Permission:
    """The combined policy; :meth:`decide` is the only question it answers.

    Per name at most one store read and one ask request per TTL; concurrent
    questions about one name share one answer.
    """

    def __init__(
        self,
        *,
        suffixes: tuple[str, ...] = (),
        registry: DomainRegistry | None = None,
        ask_url: str = "",
        ask_timeout: float = 2.0,
        ask_rate: float = 10.0,
        allow_ttl: float = 3600.0,
        deny_ttl: float = 300.0,
        store_budget: LookupBudget | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not suffixes and registry is None and not ask_url:
            raise ConfigError(
                "on-demand issuance needs a permission policy, so that no made-up name"
                " reaches the CA: set acme_ask (an endpoint asked per name),"
                " acme_allow_suffixes, or acme_registered = true (names registered with"
                " 'certagent domain add')"
            )
        self.suffixes = suffixes
        self.registry = registry
        self.ask_url = ask_url
        self.ask_timeout = ask_timeout
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self.counters = PermissionCounters()
        self._store_budget = store_budget
        self._ask_budget = LookupBudget(ask_rate, max(1.0, ask_rate), clock=clock)
        self._cache = _Cache(CACHE_SIZE, clock)
        self._session = session
        self._own_session = False
        self._pending: dict[str, asyncio.Future[Decision]] = {}

    def describe(self) -> list[str]:
        """The policies in force, for the start-up log line and ``status``."""
        out = []
        if self.suffixes:
            out.append("suffixes " + " ".join(self.suffixes))
        if self.registry is not None:
            out.append("registered names")
        if self.ask_url:
            out.append(f"ask {self.ask_url}")
        return out

    def forget(self, name: str) -> None:
        """Drop the cached answer for ``name`` (its registration changed)."""
        self._cache.drop(name)

    async def decide(self, name: str) -> Decision:
        """Whether validated ``name`` may be issued.  StoreError if the registry is unreachable."""
        if suffix_allows(self.suffixes, name):
            return self._count(Decision(True, By.SUFFIX))
        cached = self._cache.get(name)
        if cached is not None:
            self.counters.cached += 1
            return self._count(Decision(cached.allowed, cached.by, True, cached.reason))
        pending = self._pending.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._pending[name] = future
        try:
            decision = await self._decide(name)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            del self._pending[name]
        future.set_result(decision)
        return self._count(decision)

    def _count(self, decision: Decision) -> Decision:
        if decision.allowed:
            self.counters.allowed += 1
        else:
            self.counters.denied += 1
        return decision

    async def _decide(self, name: str) -> Decision:
        if self.registry is not None:
            if self._store_budget is not None and not self._store_budget.take():
                return Decision(
                    False, By.NONE, reason="over the store-lookup budget", transient=True
                )
            if await self.registry.registration(name) is not None:
                decision = Decision(True, By.REGISTERED)
                self._cache.put(name, decision, self.allow_ttl)
                return decision
        if self.ask_url:
            return await self._ask(name)
        decision = Decision(False, By.NONE, reason="not registered")
        self._cache.put(name, decision, self.deny_ttl)
        return decision

    async def _ask(self, name: str) -> Decision:
        if not self._ask_budget.take():
            self.counters.over_budget += 1
            return Decision(False, By.ASK, reason="over the ask endpoint's rate", transient=True)
        self.counters.ask_requests += 1
        session = self._session or self._new_session()
        try:
            async with asyncio.timeout(self.ask_timeout):
                async with session.get(
                    self.ask_url, params={"domain": name}, allow_redirects=False
                ) as response:
                    status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.counters.ask_errors += 1
            reason = f"{self.ask_url} did not answer ({type(exc).__name__}: {exc})"
            log.warning("permission for %s denied: %s", name, reason)
            return Decision(False, By.ASK, reason=reason, transient=True)  # not cached
        if 200 <= status < 300:
            decision = Decision(True, By.ASK)
            self._cache.put(name, decision, self.allow_ttl)
        else:
            # a 5xx denies too (Caddy's rule), but says nothing lasting about the name
            decision = Decision(
                False, By.ASK, reason=f"{self.ask_url} answered {status}", transient=status >= 500
            )
            self._cache.put(name, decision, self.deny_ttl)
        return decision

    def _new_session(self) -> aiohttp.ClientSession:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.ask_timeout), trust_env=False
        )
        self._own_session = True
        return self._session

    def cached(self) -> int:
        return len(self._cache)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
