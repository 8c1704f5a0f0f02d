"""The issuance roles in Redis: the fleet's ACME account, registered names, shared limits.

Leases are :mod:`._leases`, the challenge board :mod:`._board`, the renewal schedule and
budget :mod:`._renewals`; :func:`redis_issuance` puts all six together for
:meth:`RedisStore.issuance <certagent.store.redis.RedisStore.issuance>`. Every key is on
the ``{global}`` slot of a cluster (:class:`~certagent.store.redis._layout.Keys`), so
each write below is one script or one MULTI/EXEC on one slot, the same on one Redis and
on a cluster.

* **Account**: a hash per CA (``acme:account:<hash of the directory URL>``); the
  key encrypted with the data key (keycrypt, aad ``acme-account <directory>``: a
  token copied to another CA's account does not decrypt).  :data:`SAVE_ACCOUNT`
  is the compare-and-set on its ``url``.
* **Registrations**: a sorted set of names (score 0: ZRANGEBYLEX pages them in
  name order) and a hash name -> ``"<added_at> <issue>"``; :data:`REGISTER` and
  :data:`UNREGISTER` change both and append the ``domain`` event.
* **Limits**: a name's backoff is a hash with a TTL of ``not_before`` plus
  :data:`~certagent.store.issuing.STATE_LAPSE` (by the caller's clock, as a
  relative TTL); the pause a string kept at the later value (:data:`PAUSE`,
  lapsing at ``until``); the open-order slots a sorted set member -> expiry in
  **Redis's clock** (:data:`TAKE_SLOT` drops the lapsed and adds while fewer
  than ``cap``), so nodes whose clocks disagree count the same slots.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import redis.asyncio

from certagent.certs import keycrypt
from certagent.certs.keycrypt import KeyRing
from certagent.certs.pem import CertBundle
from certagent.errors import KeyDecryptError, StoreCorrupt, StoreError
from certagent.store.issuance import AcmeAccount, Issuance, NameState, Registration
from certagent.store.issuing import (
    MAX_PAGE,
    STATE_LAPSE,
    account_aad,
    check_account,
    check_name,
    check_time,
    check_ttl,
    clean_error,
    decode_registration,
)
from certagent.store.redis._board import RedisBoard
from certagent.store.redis._connection import redis_errors
from certagent.store.redis._layout import Keys, to_bytes, to_text
from certagent.store.redis._leases import RedisLeases
from certagent.store.redis._renewals import RedisRenewals
from certagent.store.redis._writer import ATTEMPTS, Fence
from certagent.store.values import CertRecord

__all__ = [
    "PAUSE",
    "RECORD_FAILURE",
    "REGISTER",
    "SAVE_ACCOUNT",
    "SWAP_KEY",
    "TAKE_SLOT",
    "UNREGISTER",
    "RedisAccounts",
    "RedisDomains",
    "RedisLimits",
    "redis_issuance",
]

log = logging.getLogger(__name__)

#: KEYS[1] the account; ARGV[1] the URL expected ('' none), ARGV[2..] its fields and values.
#: 1 stored; 0 another account is stored (its URL is not the one expected).
SAVE_ACCOUNT = """
if redis.call('EXISTS', KEYS[1]) == 1
    and (redis.call('HGET', KEYS[1], 'url') or '') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""
#: KEYS[1] an account; ARGV[1] its key as read, 2 the key re-encrypted.  1 swapped, else 0.
SWAP_KEY = """
if redis.call('HGET', KEYS[1], 'key') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'key', ARGV[2])
return 1
"""
#: KEYS[1] the names, 2 their info, 3 the events; ARGV[1] the name, 2 now (Unix seconds),
#: 3 issue (0|1), 4 the stream's MAXLEN.  The stored value (``added_at`` kept if registered).
REGISTER = """
local before = redis.call('HGET', KEYS[2], ARGV[1])
local added = ARGV[2]
if before then added = string.match(before, '^(%d+) ') or added end
local value = added .. ' ' .. ARGV[3]
redis.call('HSET', KEYS[2], ARGV[1], value)
redis.call('ZADD', KEYS[1], 0, ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*',
  'kind', 'domain', 'id', ARGV[1], 'names', ARGV[1])
return value
"""
#: KEYS as REGISTER; ARGV[1] the name, 2 MAXLEN.  1 forgotten (event appended), 0 unknown.
UNREGISTER = """
local gone = redis.call('HDEL', KEYS[2], ARGV[1]) + redis.call('ZREM', KEYS[1], ARGV[1])
if gone == 0 then return 0 end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*',
  'kind', 'domain', 'id', ARGV[1], 'names', ARGV[1])
return 1
"""
#: KEYS[1] the name's backoff; ARGV[1] not_before, 2 the error, 3 the TTL in ms.  failures.
RECORD_FAILURE = """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'not_before', ARGV[1], 'last_error', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return failures
"""
#: KEYS[1] the pause; ARGV[1] until (Unix seconds), 2 the TTL in ms.  1 if it was later.
PAUSE = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if current >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
#: KEYS[1] the slots; ARGV[1] the name, 2 the cap, 3 the TTL in ms.  1 taken (or renewed:
#: the name held one), 0 all ``cap`` are taken.
TAKE_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if not redis.call('ZSCORE', KEYS[1], ARGV[1])
    and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[3])), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""

_ISO = "%Y-%m-%dT%H:%M:%SZ"


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class _Role:
    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shown: str) -> None:
        self._client = client
        self._keys = keys
        self._url = shown

    def _errors(self, action: str) -> AbstractContextManager[None]:
        return redis_errors(self._url, action)


class RedisAccounts(_Role):
    """:class:`~certagent.store.issuance.AccountStore` on Redis: O(1), one round trip."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        keyring: Callable[[str], KeyRing],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(client, keys, shown)
        self._keyring = keyring
        self._clock = clock
        self._save = client.register_script(SAVE_ACCOUNT)
        self._swap = client.register_script(SWAP_KEY)

    async def load_account(self, directory: str) -> AcmeAccount | None:
        with self._errors("read the ACME account"):
            raw: Mapping[bytes, bytes] = await self._client.hgetall(  # type: ignore[assignment]
                self._keys.account(directory)
            )
        if not raw:
            return None
        where = f"{self._url}: the ACME account for {directory}"
        if to_text(raw.get(b"directory")) != directory:
            raise StoreCorrupt(f"{where}: its key holds another CA's account")
        ring = self._keyring("read the ACME account key")
        try:
            key = keycrypt.decrypt(ring, raw.get(b"key") or b"", account_aad(directory))
            contact = json.loads(raw.get(b"contact") or b"[]")
            if not isinstance(contact, list) or not all(isinstance(c, str) for c in contact):
                raise ValueError("contact is not a list of strings")
            return AcmeAccount(
                directory=directory,
                key_pem=key,
                url=to_text(raw.get(b"url")) or None,
                contact=tuple(contact),
                updated_at=datetime.strptime(to_text(raw.get(b"updated_at")), _ISO).replace(
                    tzinfo=UTC
                ),
            )
        except KeyDecryptError as exc:
            raise KeyDecryptError(f"{where}: {exc}") from exc
        except ValueError as exc:
            raise StoreCorrupt(f"{where} is malformed: {exc}") from exc

    async def save_account(self, account: AcmeAccount, *, previous_url: str | None) -> AcmeAccount:
        """Compare-and-set on the URL (:data:`SAVE_ACCOUNT`); with none stored, any creates it."""
        check_account(account)
        ring = self._keyring("store the ACME account key")
        updated = datetime.fromtimestamp(int(self._clock()), UTC)
        fields: dict[str, str | bytes] = {
            "directory": account.directory,
            "key": keycrypt.encrypt(ring, account.key_pem, account_aad(account.directory)),
            "url": account.url or "",
            "contact": json.dumps(list(account.contact)),
            "updated_at": updated.strftime(_ISO),
        }
        args: list[str | bytes] = [previous_url or ""]
        for field, value in fields.items():
            args += [field, value]
        key = self._keys.account(account.directory)
        for _ in range(ATTEMPTS):
            with self._errors("store the ACME account"):
                saved = await self._save(keys=[key], args=args)
            if saved == 1:
                log.info(
                    "stored the ACME account %s for %s in %s",
                    account.url or "(not registered yet)",
                    account.directory,
                    self._url,
                )
                return AcmeAccount(
                    account.directory, account.key_pem, account.url, account.contact, updated
                )
            stored = await self.load_account(account.directory)
            if stored is not None:
                return stored  # another node's write came first
        raise StoreError(f"{self._url}: the ACME account kept changing; gave up")


    async def reencrypt(self, ring: KeyRing) -> int:
        """Re-encrypt every account key not made with the current data key (``keys rotate``).

        SCANs for the account keys (O(keys in the store), like the rest of a
        rotation) and swaps each key by compare-and-set; how many were swapped.
        """
        swapped = 0
        with self._errors("re-encrypt the ACME account keys"):
            async for name in self._client.scan_iter(match=self._keys.account_pattern()):
                directory, token = (
                    to_bytes(v) for v in await self._client.hmget(name, ["directory", "key"])
                )
                if directory is None or token is None:
                    continue
                try:
                    if not keycrypt.needs_rotation(ring, token):
                        continue
                    aad = account_aad(directory.decode("ascii"))
                    fresh = keycrypt.reencrypt(ring, token, aad)
                except (KeyDecryptError, UnicodeDecodeError) as exc:
                    log.warning(
                        "cannot re-encrypt the ACME account key %s in %s: %s",
                        to_text(name),
                        self._url,
                        exc,
                    )
                    continue
                swapped += await self._swap(keys=[name], args=[token, fresh]) == 1
        return swapped


class RedisDomains(_Role):
    """:class:`~certagent.store.issuance.DomainRegistry` on Redis."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        maxlen: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(client, keys, shown)
        self._maxlen = maxlen
        self._clock = clock
        self._register = client.register_script(REGISTER)
        self._unregister = client.register_script(UNREGISTER)

    def _script_keys(self) -> list[str]:
        return [self._keys.domains(), self._keys.domain_info(), self._keys.events()]

    async def register(self, name: str, *, issue: bool = False) -> Registration:
        name = check_name(name)
        with self._errors(f"register {name}"):
            value = await self._register(
                keys=self._script_keys(),
                args=[name, f"{self._clock():.0f}", int(issue), self._maxlen],
            )
        return self._decode(name, value)

    async def unregister(self, name: str) -> bool:
        name = check_name(name)
        with self._errors(f"unregister {name}"):
            gone = await self._unregister(keys=self._script_keys(), args=[name, self._maxlen])
        return bool(gone == 1)

    async def registration(self, name: str) -> Registration | None:
        name = check_name(name)
        with self._errors(f"read the registration of {name}"):
            value = await self._client.hget(self._keys.domain_info(), name)
        return None if value is None else self._decode(name, value)

    async def registrations(
        self, *, after: str | None = None, limit: int = 100
    ) -> tuple[Registration, ...]:
        """Names in order after ``after``: ZRANGEBYLEX, then HMGET; O(log N + limit)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        low = "-" if after is None else f"({after}"
        with self._errors("list the registrations"):
            names = [
                to_text(n)
                for n in await self._client.zrangebylex(
                    self._keys.domains(), low, "+", start=0, num=min(limit, MAX_PAGE)
                )
            ]
            values = await self._client.hmget(self._keys.domain_info(), names) if names else []
        found: list[Registration] = []
        for name, value in zip(names, values, strict=True):
            if value is None:
                continue  # unregistered between the two reads
            try:
                found.append(self._decode(name, value))
            except StoreCorrupt as exc:
                log.warning("listing registrations: %s", exc)
        return tuple(found)

    def _decode(self, name: str, value: object) -> Registration:
        try:
            return decode_registration(name, to_bytes(value) or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreCorrupt(f"{self._url}: the registration of {name}: {exc}") from exc


class RedisLimits(_Role):
    """:class:`~certagent.store.issuance.IssueLimits` on Redis: each call one round trip."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: Keys,
        shown: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(client, keys, shown)
        self._clock = clock
        self._record_failure = client.register_script(RECORD_FAILURE)
        self._pause = client.register_script(PAUSE)
        self._take_slot = client.register_script(TAKE_SLOT)

    async def name_state(self, name: str) -> NameState | None:
        name = check_name(name)
        with self._errors(f"read the backoff of {name}"):
            failures, not_before, error = await self._client.hmget(
                self._keys.backoff(name), ["failures", "not_before", "last_error"]
            )
        if failures is None:
            return None
        try:
            return NameState(int(failures), float(not_before or 0), to_text(error))
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: the backoff of {name}: {exc}") from exc

    async def record_failure(self, name: str, error: str, not_before: float) -> NameState:
        """One more failure; the state lapses STATE_LAPSE s after ``not_before`` (this clock)."""
        name, error = check_name(name), clean_error(error)
        not_before = check_time(not_before, "not_before")
        ttl = max(not_before - self._clock(), 0.0) + STATE_LAPSE
        with self._errors(f"record a failure of {name}"):
            failures = await self._record_failure(
                keys=[self._keys.backoff(name)], args=[repr(float(not_before)), error, _ms(ttl)]
            )
        return NameState(int(failures), float(not_before), error)

    async def clear_failures(self, name: str) -> None:
        name = check_name(name)
        with self._errors(f"clear the backoff of {name}"):
            await self._client.delete(self._keys.backoff(name))

    async def paused_until(self) -> float:
        with self._errors("read the CA pause"):
            raw = to_text(await self._client.get(self._keys.pause()))
        try:
            until = float(raw) if raw else 0.0
        except ValueError as exc:
            raise StoreCorrupt(f"{self._url}: the CA pause is not a time: {raw[:40]!r}") from exc
        return until if until > self._clock() else 0.0

    async def pause(self, until: float) -> None:
        """Keep the later pause; it lapses at ``until`` by this node's clock (a relative PX)."""
        left = check_time(until, "until") - self._clock()
        if left <= 0:
            return
        with self._errors("pause issuance"):
            await self._pause(keys=[self._keys.pause()], args=[repr(float(until)), _ms(left)])

    async def take_order_slot(self, name: str, cap: int, ttl: float) -> bool:
        """:data:`TAKE_SLOT`: O(log cap), plus the lapsed slots it drops."""
        name, ttl = check_name(name), check_ttl(ttl)
        with self._errors(f"take an order slot for {name}"):
            taken = await self._take_slot(
                keys=[self._keys.order_slots()], args=[name, int(cap), _ms(ttl)]
            )
        return bool(taken == 1)

    async def free_order_slot(self, name: str) -> None:
        name = check_name(name)
        with self._errors(f"free the order slot of {name}"):
            await self._client.zrem(self._keys.order_slots(), name)


def redis_issuance(
    client: redis.asyncio.Redis,
    keys: Keys,
    shown: str,
    *,
    accounts: RedisAccounts,
    add: Callable[[CertBundle, Fence, str], Awaitable[CertRecord]],
    maxlen: int,
    cluster: bool,
    clock: Callable[[], float] = time.time,
) -> Issuance:
    """The six roles of one RedisStore (no I/O): shared by every agent on that Redis."""
    return Issuance(
        accounts=accounts,
        locks=RedisLeases(client, keys, shown, add, clock),
        challenges=RedisBoard(client, keys, shown, maxlen, clock),
        domains=RedisDomains(client, keys, shown, maxlen, clock),
        limits=RedisLimits(client, keys, shown, clock),
        renewals=RedisRenewals(client, keys, shown, cluster=cluster),
        shared=True,
    )
