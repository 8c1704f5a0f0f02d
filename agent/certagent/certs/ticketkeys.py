"""TLS session-ticket keys shared by a fleet: the ring, its rotation, HAProxy's view of it.

Pure functions on values; no I/O.

HAProxy 2.6 keeps ``TLS_TICKETS_NO`` = 3 keys per ``tls-ticket-keys`` file: the
previous one, the current one (it encrypts new tickets) and the next one; all
three decrypt.  ``set ssl tls-key <file> <key>`` shifts the ring by one: the new
key becomes the next one, the old next one encrypts, the old current one becomes
the previous one and the old previous one is dropped.  ``show tls-keys <file>``
lists them in that order (previous, current, next), as the file does.

The fleet's ring at generation ``g`` is ``(K[g-2], K[g-1], K[g])``.  A rotation
appends ``K[g+1]``.  Two nodes one rotation apart still resume each other's
tickets (each holds the key the other encrypts with), so nodes need not rotate
at the same instant.  A ticket stays decryptable at least one rotation interval
after it was issued, so the interval must be at least the ticket lifetime
(HAProxy's ``tune.ssl.lifetime``, 300 s by default): see :data:`MIN_INTERVAL`.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "KEY_BYTES",
    "MIN_INTERVAL",
    "RING_SIZE",
    "TicketRing",
    "fresh_key",
    "keys_file",
    "new_ring",
    "parse_key",
    "pushes",
]

#: Keys HAProxy 2.6 holds per ticket-key file (its TLS_TICKETS_NO build default).
RING_SIZE = 3
#: Bytes per key: 16 key name + 32 HMAC key + 32 AES-256 key (HAProxy's 80-byte form).
KEY_BYTES = 80
#: The shortest rotation interval, in seconds: a ticket must outlive its lifetime
#: (``tune.ssl.lifetime``, 300 s) with room for nodes that rotate late.
MIN_INTERVAL = 600.0


def fresh_key() -> str:
    """A new random key, base64 as HAProxy reads it (80 bytes: AES-256 tickets)."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def parse_key(text: str) -> str:
    """``text`` if it is one base64 key of :data:`KEY_BYTES` bytes, else ValueError.

    Never quotes the key in the message: it is secret.
    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("a ticket key is not valid base64") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a ticket key has {len(raw)} bytes; expected {KEY_BYTES}")
    return text


@dataclass(frozen=True)
class TicketRing:
    """The fleet's keys at one generation: previous, current (encrypts), next."""

    generation: int
    keys: tuple[str, ...]
    #: Unix time of the rotation that made this generation.
    rotated_at: float

    def __post_init__(self) -> None:
        if len(self.keys) != RING_SIZE:
            raise ValueError(f"a ticket ring holds {RING_SIZE} keys, not {len(self.keys)}")
        if len(set(self.keys)) != RING_SIZE:
            raise ValueError("a ticket ring holds the same key twice")
        if self.generation < RING_SIZE - 1:
            raise ValueError(f"ticket ring generation {self.generation} < {RING_SIZE - 1}")

    def rotated(self, key: str, now: float) -> TicketRing:
        """The next generation: ``key`` appended, the oldest dropped."""
        return TicketRing(self.generation + 1, (*self.keys[1:], key), now)

    def due(self, interval: float) -> float:
        """When the next rotation is due (Unix time)."""
        return self.rotated_at + interval

    def __repr__(self) -> str:  # never show the keys
        return f"TicketRing(generation={self.generation}, rotated_at={self.rotated_at:.0f})"


def new_ring(now: float) -> TicketRing:
    """A first ring: three fresh keys, generation 2 (``K[0..2]``)."""
    return TicketRing(RING_SIZE - 1, tuple(fresh_key() for _ in range(RING_SIZE)), now)


def keys_file(ring: TicketRing) -> bytes:
    """The ``tls-ticket-keys`` file for ``ring``: one key per line, oldest first.

    HAProxy reading it encrypts with the penultimate line: the ring's current key.
    """
    return "".join(f"{key}\n" for key in ring.keys).encode("ascii")


def pushes(held: Sequence[str], ring: TicketRing) -> list[str]:
    """The keys to ``set ssl tls-key``, in order, so HAProxy holding ``held`` holds ``ring``.

    ``held`` is what ``show tls-keys`` lists (previous, current, next).  One key
    when HAProxy is one rotation behind, two when it is two behind, all three
    otherwise (a fresh HAProxy, another fleet's keys, or a ring that went back).
    """
    target = list(ring.keys)
    current = list(held)
    if current == target:
        return []
    for behind in range(1, RING_SIZE):
        if len(current) == RING_SIZE and current[behind:] == target[: RING_SIZE - behind]:
            return target[RING_SIZE - behind :]
    return target
