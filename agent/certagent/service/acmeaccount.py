"""The fleet's one ACME account: made once, kept in the store, re-registered once if lost.

Every agent on a store orders with the same account key, stored encrypted with the
data key like private keys (:class:`~certagent.store.issuance.AccountStore`).  The
first agent that needs it generates the key, registers it and saves it with a
compare-and-set; an agent that loses that race uses the winner's.  When the CA no
longer knows the account (``accountDoesNotExist``: a CA that lost its database, as
a restarted pebble does), one agent re-registers the same key under a fleet-wide
lease and saves the new URL; the others wait for it and reload.

Cost: one store read per agent start (cached after), one CA request per
(re)registration; nothing per certificate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from certagent.acme import AccountKey, AcmeClient, ExternalAccountBinding
from certagent.errors import AgentError
from certagent.store.issuance import AccountStore, AcmeAccount, IssueLocks

log = logging.getLogger(__name__)

#: The lease name under which one agent (re-)registers the fleet's account.
ACCOUNT_LEASE = "account.certagent.invalid"
LEASE_SECONDS = 30.0
#: How long an agent that lost the race for the lease waits for the winner's account.
WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class AccountSettings:
    directory: str
    contact: tuple[str, ...] = ()
    ca_file: str | None = None
    eab: ExternalAccountBinding | None = None
    request_timeout: float = 10.0


class AccountKeeper:
    """Hands out the :class:`AcmeClient` of the fleet's account, registering it if needed."""

    def __init__(
        self,
        settings: AccountSettings,
        accounts: AccountStore,
        locks: IssueLocks,
        node: str,
        *,
        client_factory: Callable[..., AcmeClient] = AcmeClient,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.accounts = accounts
        self.locks = locks
        self.node = node
        self._factory = client_factory
        self._clock = clock
        self._client: AcmeClient | None = None
        self._lock = asyncio.Lock()
        self.registrations = 0  # accounts this agent registered (status, tests)

    async def client(self) -> AcmeClient:
        """The client of the fleet's account (registered at the CA)."""
        async with self._lock:
            if self._client is None:
                self._client = await self._open()
            return self._client

    async def lost(self, client: AcmeClient) -> AcmeClient:
        """The CA said ``accountDoesNotExist`` to ``client``: register again, once per fleet."""
        async with self._lock:
            if self._client is not client and self._client is not None:
                return self._client  # another task of this agent already did it
            stale = client.account_url
            log.warning(
                "the ACME CA at %s no longer knows account %s; registering it again",
                self.settings.directory,
                stale,
            )
            key = client.account_key
            await client.close()
            self._client = None
            self._client = await self._register(key, previous_url=stale)
            return self._client

    async def _open(self) -> AcmeClient:
        stored = await self.accounts.load_account(self.settings.directory)
        if stored is not None and stored.url is not None:
            return self._make(AccountKey.from_pem(stored.key_pem), stored.url)
        key = (
            AccountKey.from_pem(stored.key_pem) if stored is not None else AccountKey.generate()
        )
        return await self._register(key, previous_url=None if stored is None else stored.url)

    async def _register(self, key: AccountKey, *, previous_url: str | None) -> AcmeClient:
        """Register ``key`` under the fleet's account lease, or take the account another made."""
        deadline = self._clock() + WAIT_SECONDS
        while True:
            lease = await self.locks.acquire(ACCOUNT_LEASE, self.node, LEASE_SECONDS)
            if lease is not None:
                break
            if self._clock() > deadline:
                raise AgentError(
                    f"another agent has been registering the ACME account at"
                    f" {self.settings.directory} for {WAIT_SECONDS:.0f} s; will retry"
                )
            await asyncio.sleep(0.2)
            stored = await self.accounts.load_account(self.settings.directory)
            if stored is not None and stored.url is not None and stored.url != previous_url:
                return self._make(AccountKey.from_pem(stored.key_pem), stored.url)
        try:
            stored = await self.accounts.load_account(self.settings.directory)
            if stored is not None and stored.url is not None and stored.url != previous_url:
                return self._make(AccountKey.from_pem(stored.key_pem), stored.url)
            if stored is not None:
                key = AccountKey.from_pem(stored.key_pem)
            client = self._make(key, None)
            try:
                account = await client.register(
                    contact=self.settings.contact, terms_agreed=True, eab=self.settings.eab
                )
            except BaseException:
                await client.close()
                raise
            self.registrations += 1
            saved = await self.accounts.save_account(
                AcmeAccount(
                    directory=self.settings.directory,
                    key_pem=key.to_pem(),
                    url=account.url,
                    contact=self.settings.contact,
                    updated_at=datetime.now(UTC),
                ),
                previous_url=None if stored is None else stored.url,
            )
            if saved.url != account.url:  # another agent saved first: use its account
                await client.close()
                return self._make(AccountKey.from_pem(saved.key_pem), saved.url)
            return client
        finally:
            await self.locks.release(lease)

    def _make(self, key: AccountKey, url: str | None) -> AcmeClient:
        return self._factory(
            self.settings.directory,
            key,
            account_url=url,
            ca_file=self.settings.ca_file,
            request_timeout=self.settings.request_timeout,
        )

    def status(self) -> dict[str, object]:
        return {
            "directory": self.settings.directory,
            "account": None if self._client is None else self._client.account_url,
            "registered_here": self.registrations,
        }

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
