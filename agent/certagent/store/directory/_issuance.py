"""The directory store's issuance roles: one node's, nothing shared (``Issuance.shared`` False).

What must survive a restart is on disk, in ``<root>/.certagent/`` (:mod:`._state`): the
ACME account (its key a PEM file, mode 0600, like the certificates' keys), the
registered names and the renewal schedule (:mod:`._renewals`). Leases, challenges,
acknowledgements, heartbeats and limits are this agent's memory
(:mod:`certagent.store.localissuance`): the node is alone, and an order in flight when
it restarts is simply placed again.

Challenges published or withdrawn and names registered or forgotten are
``challenge`` and ``domain`` changes in the store's change feed, for the agent
that made them.  A registration made by another process on the same directory
(``certagent domain add --config``) is on disk at once -- every read goes to
the file -- but reaches a running agent's cached answers only when they expire.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypeVar

from certagent.errors import StoreUnavailable
from certagent.store.directory import _state
from certagent.store.issuance import AcmeAccount, Issuance, Registration
from certagent.store.issuing import MAX_PAGE, check_account, check_name
from certagent.store.localissuance import (
    Adder,
    Clock,
    Emit,
    LocalBoard,
    LocalLimits,
    LocalLocks,
)
from certagent.store.localrenewals import LocalRenewals
from certagent.store.values import Change

__all__ = ["DirAccounts", "DirDomains", "directory_issuance"]

T = TypeVar("T")


class Run(Protocol):
    """The store's way to run a blocking call on its threads: ``await run(what, call)``."""

    def __call__(self, what: str, call: Callable[[], T], /) -> Awaitable[T]: ...


class _OnDisk:
    def __init__(self, root: Path, uri: str, run: Run) -> None:
        self._root = root
        self._uri = uri
        self._run_call = run

    async def _run(self, what: str, call: Callable[[], T]) -> T:
        try:
            return await self._run_call(what, call)
        except OSError as exc:
            raise StoreUnavailable(f"{self._uri}: {what}: {exc.strerror or exc}") from exc


class DirAccounts(_OnDisk):
    """:class:`~certagent.store.issuance.AccountStore` in ``.certagent/acme/``."""

    def __init__(self, root: Path, uri: str, run: Run, clock: Clock = time.time) -> None:
        super().__init__(root, uri, run)
        self._clock = clock

    async def load_account(self, directory: str) -> AcmeAccount | None:
        read = functools.partial(_state.load_account, self._root, directory)
        return await self._run("reading the ACME account", read)

    async def save_account(self, account: AcmeAccount, *, previous_url: str | None) -> AcmeAccount:
        """Compare-and-set on the URL, under a lock file; with none stored, any creates it."""
        check_account(account)
        now = datetime.fromtimestamp(int(self._clock()), UTC)
        write = functools.partial(_state.save_account, self._root, account, previous_url, now)
        return await self._run("storing the ACME account", write)


class DirDomains(_OnDisk):
    """:class:`~certagent.store.issuance.DomainRegistry` in ``.certagent/domains/``.

    One small file per name; listing reads the folder: O(N) per page.
    """

    def __init__(
        self, root: Path, uri: str, run: Run, emit: Emit, clock: Clock = time.time
    ) -> None:
        super().__init__(root, uri, run)
        self._emit = emit
        self._clock = clock

    async def register(self, name: str, *, issue: bool = False) -> Registration:
        name = check_name(name)
        write = functools.partial(_state.write_registration, self._root, name, issue, self._clock())
        registration = await self._run(f"registering {name}", write)
        self._emit(Change("domain", name, (name,)))
        return registration

    async def unregister(self, name: str) -> bool:
        name = check_name(name)
        gone = await self._run(
            f"unregistering {name}", functools.partial(_state.remove_registration, self._root, name)
        )
        if gone:
            self._emit(Change("domain", name, (name,)))
        return gone

    async def registration(self, name: str) -> Registration | None:
        name = check_name(name)
        read = functools.partial(_state.read_registration, self._root, name)
        return await self._run(f"reading the registration of {name}", read)

    async def registrations(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[Registration, ...]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        read = functools.partial(_state.list_registrations, self._root, after, min(limit, MAX_PAGE))
        return tuple(await self._run("listing the registrations", read))


def directory_issuance(
    root: Path,
    uri: str,
    run: Run,
    add: Adder,
    emit: Emit,
    renewals: LocalRenewals,
    clock: Clock = time.time,
) -> Issuance:
    """The issuance roles of one directory store (no I/O until used)."""
    return Issuance(
        accounts=DirAccounts(root, uri, run, clock),
        locks=LocalLocks(add, clock, renewals),
        challenges=LocalBoard(emit, clock),
        domains=DirDomains(root, uri, run, emit, clock),
        limits=LocalLimits(clock),
        renewals=renewals,
        shared=False,
    )
