"""The fleet's issuance budget: how many orders it may place, renewals first.

:meth:`IssueBudget.take` is asked before every order (a new name's or a
renewal's; one order per key type), by an issuer that already holds a fleet
order slot, so a unit is spent only for an order placed.  It spends one unit
from fixed windows counted in the store
(:meth:`~certagent.store.renewals.Renewals.spend`, all-or-nothing and atomic
across the fleet, so ten nodes together respect one budget):

* ``rate:all`` -- ``acme_rate_per_hour`` orders per hour for the whole fleet;
* ``rate:new`` -- new names only, ``(1 - acme_renewal_reserve)`` of that hourly
  rate: a new name spends from both windows, a renewal from ``rate:all`` alone, so
  when the hour's budget runs short the reserve is left to renewals;
* ``domain:all:<registered domain>`` and ``domain:new:<registered domain>`` --
  ``acme_domain_per_week`` orders per week for the names under one registered
  domain (eTLD+1, from the Public Suffix List of the ``publicsuffixlist`` package:
  ``a.example.co.uk`` and ``b.example.co.uk`` share ``example.co.uk``), with the
  same reserve for renewals (CAs count per registered domain: Let's Encrypt's
  "certificates per registered domain").

A limit of 0 leaves its windows out; with every limit 0 no store call is made.
The CA's own ``429``/``Retry-After`` and the fleet's cap on open orders
(:meth:`~certagent.store.issuance.IssueLimits.take_order_slot`) are separate brakes
kept by the issuer.

Cost per call: one registered-domain lookup (O(labels of the name)) and one store
call touching at most four keys; nothing grows with the number of certificates.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

from certagent.config import Settings
from certagent.store.renewals import BudgetWindow, Renewals

__all__ = [
    "BudgetCounters",
    "BudgetSettings",
    "IssueBudget",
    "Suffixes",
    "public_suffix_list",
    "registered_domain",
]

log = logging.getLogger(__name__)

HOUR = 3600.0
WEEK = 7 * 86400.0


@dataclass(frozen=True)
class BudgetSettings:
    """The fleet's limits; 0 = no limit (``acme_rate_per_hour`` etc., docs/configuration.md)."""

    rate_per_hour: int = 0
    domain_per_week: int = 0
    renewal_reserve: float = 0.0  # in [0, 1): the share of each window only renewals may use

    @property
    def limited(self) -> bool:
        return self.rate_per_hour > 0 or self.domain_per_week > 0

    @classmethod
    def from_settings(cls, settings: Settings) -> BudgetSettings:
        return cls(
            rate_per_hour=settings.acme_rate_per_hour,
            domain_per_week=settings.acme_domain_per_week,
            renewal_reserve=settings.acme_renewal_reserve,
        )


@dataclass
class BudgetCounters:
    """What :meth:`IssueBudget.take` answered, by kind (``renewal`` / ``new``)."""

    taken: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)


def new_share(limit: int, reserve: float) -> int:
    """Of ``limit`` orders per window, how many new names may use: at least 1."""
    return max(1, math.floor(limit * (1.0 - reserve)))


class Suffixes(Protocol):
    """What the budget asks of the Public Suffix List (``publicsuffixlist.PublicSuffixList``)."""

    def privatesuffix(self, domain: str) -> str | None: ...


def public_suffix_list() -> Suffixes:
    """The Public Suffix List of the ``publicsuffixlist`` package, parsed (~0.1 s).

    Imported by name and typed by :class:`Suffixes`: the package ships type information
    from 1.1 on and not before, so a plain import would type-check against one end of
    the supported range only (an untyped import below 1.1, an unused ignore above).
    """
    module = importlib.import_module("publicsuffixlist")
    return cast(Suffixes, module.PublicSuffixList())


def registered_domain(suffixes: Suffixes, name: str) -> str:
    """The registered domain (eTLD+1) of validated ``name``; a wildcard counts as its base.

    A name that is itself a public suffix (or a single label) is its own group.
    """
    base = name.removeprefix("*.").lower()
    return suffixes.privatesuffix(base) or base


class IssueBudget:
    """See the module docstring."""

    def __init__(
        self,
        renewals: Renewals,
        settings: BudgetSettings,
        *,
        suffixes: Suffixes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.renewals = renewals
        self.settings = settings
        self.counters = BudgetCounters()
        # the list is parsed once (~0.1 s); only when a per-domain limit needs it
        self._suffixes = suffixes
        self._clock = clock

    def windows(self, name: str, *, renewal: bool) -> tuple[BudgetWindow, ...]:
        """The windows an order for ``name`` spends from (see the module docstring)."""
        s = self.settings
        out: list[BudgetWindow] = []
        if s.rate_per_hour > 0:
            out.append(BudgetWindow("rate:all", s.rate_per_hour, HOUR))
            if not renewal:
                share = new_share(s.rate_per_hour, s.renewal_reserve)
                out.append(BudgetWindow("rate:new", share, HOUR))
        if s.domain_per_week > 0:
            domain = registered_domain(self.suffixes, name)
            out.append(BudgetWindow(f"domain:all:{domain}", s.domain_per_week, WEEK))
            if not renewal:
                share = new_share(s.domain_per_week, s.renewal_reserve)
                out.append(BudgetWindow(f"domain:new:{domain}", share, WEEK))
        return tuple(out)

    @property
    def suffixes(self) -> Suffixes:
        if self._suffixes is None:
            self._suffixes = public_suffix_list()
        return self._suffixes

    async def take(self, name: str, *, renewal: bool) -> float:
        """Spend one order for ``name``: 0.0 = go; otherwise seconds to wait (nothing spent).

        StoreUnavailable if the store cannot be asked.
        """
        kind = "renewal" if renewal else "new"
        windows = self.windows(name, renewal=renewal)
        if not windows:
            self.counters.taken[kind] += 1
            return 0.0
        wait = await self.renewals.spend(windows, self._clock())
        if wait > 0:
            self.counters.refused[kind] += 1
            # the caller says what it does about it (the issuer and the renewer log it)
            log.debug(
                "not ordering %s (%s) yet: the fleet's issuance budget is spent for %.0f s",
                name,
                kind,
                wait,
            )
            return wait
        self.counters.taken[kind] += 1
        return 0.0

    def status(self) -> dict[str, object]:
        s = self.settings
        return {
            "rate_per_hour": s.rate_per_hour,
            "domain_per_week": s.domain_per_week,
            "renewal_reserve": s.renewal_reserve,
            "taken": dict(self.counters.taken),
            "refused": dict(self.counters.refused),
        }
