"""Certificate storage: the ``Store`` roles, and their Redis and directory implementations."""

from certagent.store.base import (
    BulkWriter,
    CertRecord,
    Change,
    ChangeFeed,
    DataKeys,
    Lifecycle,
    OcspWriter,
    Page,
    Reader,
    RingStore,
    Store,
    StoredCertificate,
    Writer,
)
from certagent.store.directory import DirectoryStore
from certagent.store.factory import open_configured, open_store, read_secret
from certagent.store.redis import RedisStore
from certagent.store.url import (
    StoreUrl,
    parse_store_url,
    redact_url,
    with_password,
    with_sentinel_password,
)
from certagent.store.view import StoreView

__all__ = [
    "BulkWriter",
    "CertRecord",
    "Change",
    "ChangeFeed",
    "DataKeys",
    "DirectoryStore",
    "Lifecycle",
    "OcspWriter",
    "Page",
    "Reader",
    "RedisStore",
    "RingStore",
    "Store",
    "StoreUrl",
    "StoreView",
    "StoredCertificate",
    "Writer",
    "open_configured",
    "open_store",
    "parse_store_url",
    "read_secret",
    "redact_url",
    "with_password",
    "with_sentinel_password",
]
