"""At start: refuse a data key that cannot decrypt the fleet's store."""

from __future__ import annotations

import logging

from certagent.config import Settings
from certagent.errors import ConfigError, StoreError
from certagent.store.base import Store

__all__ = ["check_data_key"]

log = logging.getLogger(__name__)


async def check_data_key(store: Store, settings: Settings) -> None:
    """ConfigError naming the missing data key if the store uses one its key ring lacks.

    Samples 32 random records and the ticket-key ring (O(1) whatever the
    store's size).  A store that cannot be reached now is only logged: the
    check needs an answer, and the agent must still start to serve what HAProxy
    holds.  Nothing to check for a store that keeps no encrypted keys (a
    directory: :meth:`~certagent.store.base.Store.data_keys` is None).
    """
    keys = store.data_keys()
    if keys is None:
        return
    ring = keys.keyring
    try:
        used = await keys.key_ids_in_use()
    except StoreError as exc:
        log.warning("cannot check the data key against %s yet: %s", store.describe(), exc)
        return
    known = set(ring.kids) if ring is not None else set()
    missing = sorted(used - known)
    if not missing:
        return
    where = settings.key_file or "(no key_file configured)"
    raise ConfigError(
        f"the store {store.describe()} holds private keys encrypted with data key"
        f" {', '.join(missing)}, which {where} lacks (it has {', '.join(sorted(known)) or 'none'}):"
        " this node was probably made with its own `certagent init`. Copy the fleet's data key"
        f" file over {where} (or move it away and re-run `certagent init DIR ... --data-key"
        " FLEET_KEY_FILE --force`), then start again. Keep that file safe: losing it loses"
        " every private key in the store."
    )
