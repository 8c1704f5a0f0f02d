"""Certificates in Redis (one server, Sentinel or Cluster), private keys encrypted at rest."""

from certagent.store.redis._addscript import ADD_SCRIPT, AddCall
from certagent.store.redis._bulk import BulkAdds
from certagent.store.redis._feed import MAX_BLOCK
from certagent.store.redis._layout import DEFAULT_PREFIX, Keys
from certagent.store.redis._records import RecordEncoder
from certagent.store.redis._store import DEFAULT_EVENTS_MAXLEN, RedisStore
from certagent.store.redis._tickets import RedisTicketRing

__all__ = [
    "ADD_SCRIPT",
    "DEFAULT_EVENTS_MAXLEN",
    "DEFAULT_PREFIX",
    "MAX_BLOCK",
    "AddCall",
    "BulkAdds",
    "Keys",
    "RecordEncoder",
    "RedisStore",
    "RedisTicketRing",
]
