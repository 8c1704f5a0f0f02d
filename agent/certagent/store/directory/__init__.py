"""Certificates as PEM files in a directory (plain files or certbot's ``live/`` layout)."""

from certagent.store.directory._files import MAX_FILE_SIZE, atomic_write
from certagent.store.directory._index import WILDCARD_PREFIX, file_stem, name_of_stem
from certagent.store.directory._store import DEFAULT_POLL_INTERVAL, READ_TIMEOUT, DirectoryStore
from certagent.store.directory._tickets import LocalRing
from certagent.store.directory._watch import WatchMode

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "MAX_FILE_SIZE",
    "READ_TIMEOUT",
    "WILDCARD_PREFIX",
    "DirectoryStore",
    "LocalRing",
    "WatchMode",
    "atomic_write",
    "file_stem",
    "name_of_stem",
]
