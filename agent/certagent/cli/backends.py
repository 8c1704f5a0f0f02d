"""Where ``certagent cert`` commands act: the store directly, or a running agent's REST API.

Both validate uploads with :func:`certagent.certs.validate.validate_upload`:
:class:`StoreBackend` here before writing to the store, the API server for
:class:`~certagent.api.client.ApiBackend`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from certagent import config
from certagent.api.body import upload_policy
from certagent.api.client import ApiBackend
from certagent.api.problems import AlreadyStored
from certagent.api.tls import client_context
from certagent.api.views import ocsp_json, record_json
from certagent.certs.pem import CertBundle
from certagent.certs.validate import UploadPolicy, validate_upload
from certagent.cli._import_work import read_file
from certagent.errors import (
    ConfigError,
    DuplicateCertificate,
    NotFound,
)
from certagent.service.datakey import FleetKeys
from certagent.store import open_configured
from certagent.store.base import BulkWriter, Store

__all__ = ["TOKEN_ENV", "Backend", "Record", "StoreBackend", "open_backend", "read_file"]

TOKEN_ENV = "CERTAGENT_TOKEN"  # noqa: S105 (a variable name)

Record = dict[str, Any]


# --- backends: the store directly, or the REST API ---------------------------------------------


class Backend(Protocol):
    async def add(self, chain: bytes, key: bytes | None) -> Record: ...
    async def replace(self, cert_id: str, chain: bytes, key: bytes | None) -> Record: ...
    async def get(self, cert_id: str) -> Record: ...
    async def page(
        self,
        name: str | None,
        expiring_before: datetime | None,
        cursor: str | None,
        limit: int = 500,
    ) -> tuple[list[Record], str | None]:
        """At most ``limit`` records (1-500) after ``cursor``, and the cursor after them."""
        ...
    async def delete(self, cert_id: str) -> None: ...
    async def put_ocsp(self, cert_id: str, der: bytes) -> Record: ...
    async def close(self) -> None: ...


@dataclass
class StoreBackend:
    store: Store
    policy: UploadPolicy
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    #: checks that the fleet's agents hold the key file's current data key (None: no encryption)
    fleet: FleetKeys | None = None
    _fleet_checked: bool = False

    def _validate(self, chain: bytes, key: bytes | None) -> CertBundle:
        return validate_upload(chain, key, now=self.now(), policy=self.policy)

    async def check_keys(self) -> None:
        """ForeignDataKey if the fleet could not read what this writes; asks once per command."""
        if self.fleet is not None and not self._fleet_checked:
            await self.fleet.check()
            self._fleet_checked = True

    async def add(self, chain: bytes, key: bytes | None) -> Record:
        bundle = self._validate(chain, key)
        await self.check_keys()
        try:
            return record_json(await self.store.add(bundle))
        except DuplicateCertificate as exc:
            raise AlreadyStored(str(exc)) from exc

    async def replace(self, cert_id: str, chain: bytes, key: bytes | None) -> Record:
        await self.get(cert_id)
        bundle = self._validate(chain, key)
        await self.check_keys()
        try:
            return record_json(await self.store.replace(cert_id, bundle))
        except DuplicateCertificate as exc:
            raise AlreadyStored(str(exc)) from exc

    async def get(self, cert_id: str) -> Record:
        record = await self.store.get(cert_id)
        if record is None:
            raise NotFound(f"no certificate with id {cert_id!r} in {self.store.describe()}")
        return record_json(record)

    async def page(
        self,
        name: str | None,
        expiring_before: datetime | None,
        cursor: str | None,
        limit: int = 500,
    ) -> tuple[list[Record], str | None]:
        found = await self.store.list(
            name=name, expiring_before=expiring_before, cursor=cursor, limit=limit
        )
        return [record_json(r) for r in found.records], found.cursor

    async def delete(self, cert_id: str) -> None:
        await self.store.delete(cert_id)

    async def put_ocsp(self, cert_id: str, der: bytes) -> Record:
        await self.get(cert_id)
        return ocsp_json(cert_id, await self.store.put_ocsp(cert_id, der, self.now()))

    async def close(self) -> None:
        await self.store.close()

    def bulk(self) -> BulkWriter | None:
        """Many adds per round trip, if the store has them (Redis)."""
        return self.store.bulk()


def open_backend(args: argparse.Namespace) -> Backend:
    if (args.config is None) == (args.api is None):
        raise ConfigError("give either --config FILE (the store directly) or --api URL")
    tls_options = (args.api_ca, args.api_client_cert, args.api_client_key)
    if args.api is not None:
        https = args.api.startswith("https://")
        if not https and any(o is not None for o in tls_options):
            raise ConfigError(
                "--api-ca, --api-client-cert and --api-client-key are for an https:// --api URL"
            )
        if args.api_client_key is not None and args.api_client_cert is None:
            raise ConfigError("--api-client-key goes with --api-client-cert")
        token = args.token or os.environ.get(TOKEN_ENV, "")
        if not token and args.api_client_cert is None:
            raise ConfigError(
                f"--api needs a token: --token TOKEN or ${TOKEN_ENV} (or, under mutual TLS, a"
                " client certificate the agent gives to a token: --api-client-cert)"
            )
        tls = client_context(*tls_options) if https else None
        return ApiBackend(args.api, token, tls=tls)
    if any(o is not None for o in tls_options):
        raise ConfigError("--api-ca, --api-client-cert and --api-client-key go with --api URL")
    settings = config.load(args.config)
    store = open_configured(settings)
    keys = store.data_keys()
    fleet = FleetKeys(keys, settings.key_file) if keys is not None else None
    return StoreBackend(store, upload_policy(settings), fleet=fleet)
