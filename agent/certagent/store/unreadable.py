"""Records a store could not decrypt, as lookups met them: by id, name and data key.

A store that encrypts private keys (:meth:`~certagent.store.base.Store.data_keys`)
notes each record it cannot decrypt here instead of only logging it; the agent
shows them in ``certagent status`` and its metrics.  Bounded whatever the
store's size: the latest :data:`RECORDS` records, and a count per key id for
the first :data:`KEY_IDS` key ids (later ones count as ``other``).  Nothing
here holds key material: a key id is a name, a reason is a
:class:`~certagent.errors.KeyDecryptError` message.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["KEY_IDS", "NO_KEY_ID", "OTHER_KEY_IDS", "RECORDS", "Unreadable", "UnreadableRecords"]

#: Records listed at most (the most recently met).
RECORDS = 20
#: Key ids counted by name at most; further ones are counted as :data:`OTHER_KEY_IDS`.
KEY_IDS = 8
OTHER_KEY_IDS = "other"
#: The key id of a stored key that is not a token naming one (plaintext, garbage).
NO_KEY_ID = "none"


@dataclass(frozen=True)
class Unreadable:
    """One record a lookup could not decrypt."""

    cert_id: str
    name: str  # the hostname looked up
    key_id: str  # the data key its token names; NO_KEY_ID if it names none
    reason: str
    seen_at: float  # Unix seconds, the last time it was met


class UnreadableRecords:
    """The records met that did not decrypt; O(1) per note, O(RECORDS + KEY_IDS) per snapshot."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._records: OrderedDict[str, Unreadable] = OrderedDict()
        #: lookups that met an undecryptable record, by key id (bounded), since start
        self.by_key_id: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._records)

    def note(self, cert_id: str, name: str, key_id: str | None, reason: str) -> None:
        """A lookup of ``name`` met record ``cert_id``, which did not decrypt."""
        kid = key_id or NO_KEY_ID
        self._records[cert_id] = Unreadable(cert_id, name, kid, reason, self._clock())
        self._records.move_to_end(cert_id)
        while len(self._records) > RECORDS:
            self._records.popitem(last=False)
        label = kid if kid in self.by_key_id or len(self.by_key_id) < KEY_IDS else OTHER_KEY_IDS
        self.by_key_id[label] = self.by_key_id.get(label, 0) + 1

    def readable(self, cert_id: str) -> None:
        """Record ``cert_id`` decrypted (its key was fixed, or rotated): off the list."""
        self._records.pop(cert_id, None)

    def records(self) -> tuple[Unreadable, ...]:
        """The records listed, most recently met last."""
        return tuple(self._records.values())

    def snapshot(self) -> dict[str, Any]:
        """For ``certagent status``: the records (newest first) and the counts by key id."""
        return {
            "records": [
                {
                    "id": r.cert_id,
                    "name": r.name,
                    "key_id": r.key_id,
                    "reason": r.reason,
                    "seen_at": round(r.seen_at),
                }
                for r in reversed(self._records.values())
            ],
            "by_key_id": dict(sorted(self.by_key_id.items())),
        }
