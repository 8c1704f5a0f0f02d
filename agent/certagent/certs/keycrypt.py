"""Private keys encrypted at rest with AES-256-GCM.

A :class:`KeyRing` holds the data keys, each named by a short key id (kid); the
``current`` one encrypts, any of them decrypts.  The key file has one
``kid:base64key`` line per key, the first being current::

    # certagent data keys -- made with `certagent keys generate`
    k3fa9c1e2b7d0:3q2+7w...=
    k1:AAECAw...=

A key id made by ``keys generate`` (or ``init``) is the key's fingerprint
(:func:`key_fingerprint`), so agents that share a key file agree on it and a
record names the exact key it needs; older files may use any name.

An encrypted key is a self-describing token::

    b"cak1:" + kid + b":" + base64(nonce (12 bytes) + ciphertext + GCM tag (16 bytes))

or, for stores that keep bytes (the Redis store's compact records), the same
without base64 (``encrypt(..., binary=True)``; a quarter shorter)::

    b"cak2:" + kid + b":" + nonce (12 bytes) + ciphertext + GCM tag (16 bytes)

The caller's ``aad`` (the record id) is authenticated with the ciphertext, so a
token copied to another record does not decrypt.  :func:`needs_rotation` finds
tokens made with an older kid for ``certagent keys rotate``, which re-encrypts
them with :func:`reencrypt`.

Nothing here logs, and no error message contains key bytes, plaintext or the
token itself.  Only :meth:`KeyRing.from_file` reads a file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from certagent.errors import ConfigError, KeyDecryptError

__all__ = [
    "BINARY_PREFIX",
    "KEY_BYTES",
    "NONCE_BYTES",
    "TOKEN_PREFIX",
    "KeyRing",
    "Sealer",
    "decrypt",
    "encrypt",
    "generate_key_line",
    "held_ids",
    "key_fingerprint",
    "needs_rotation",
    "reencrypt",
    "token_kid",
]

TOKEN_PREFIX = b"cak1:"
#: A token whose sealed bytes are not base64-encoded.
BINARY_PREFIX = b"cak2:"
KEY_BYTES = 32
NONCE_BYTES = 12
_TAG_BYTES = 16
_KID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,15}\Z")
_FINGERPRINT = re.compile(r"k[0-9a-f]{12}\Z")
_HOW_TO_CREATE = "create one with `certagent keys generate k1 > keyfile`"


@dataclass(frozen=True)
class KeyRing:
    """Data keys by kid; ``current`` encrypts.  Key bytes are left out of ``repr()``."""

    #: ``(kid, 32-byte key)`` pairs.
    keys: tuple[tuple[str, bytes], ...] = field(repr=False)
    current: str

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError(f"the key ring is empty; {_HOW_TO_CREATE}")
        seen: set[str] = set()
        for kid, key in self.keys:
            _check_kid(kid)
            if kid in seen:
                raise ConfigError(f"key id {kid!r} appears twice; give each key its own id")
            seen.add(kid)
            if len(key) != KEY_BYTES:
                raise ConfigError(
                    f"key {kid!r} is {len(key)} bytes; AES-256 needs {KEY_BYTES}:"
                    f" make a new one with `certagent keys generate {kid}`"
                )
            if _FINGERPRINT.match(kid) and kid != key_fingerprint(key):
                raise ConfigError(
                    f"key id {kid!r} is a fingerprint, but not this key's: the line was edited"
                    " or copied wrongly; copy the key file again from where it was made"
                )
        if self.current not in seen:
            raise ConfigError(f"the current key id {self.current!r} is not in the key ring")

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(kid for kid, _ in self.keys)

    def key(self, kid: str) -> bytes | None:
        """The data key named ``kid``, or ``None``."""
        return next((key for name, key in self.keys if name == kid), None)

    @classmethod
    def from_text(cls, text: str, *, source: str = "key file") -> KeyRing:
        """Parse ``kid:base64key`` lines; the first key is current.

        Blank lines and ``#`` comments are ignored.  Errors name ``source`` and
        the line number, never the line itself.
        """
        keys: list[tuple[str, bytes]] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{source}, line {number}"
            kid, sep, encoded = line.partition(":")
            kid, encoded = kid.strip(), encoded.strip()
            if not sep or not kid or not encoded:
                raise ConfigError(f"{where}: expected kid:base64key; {_HOW_TO_CREATE}")
            if not _KID.match(kid):
                raise ConfigError(f"{where}: {_kid_rule()}")
            try:
                key = base64.b64decode(encoded, validate=True)
            except binascii.Error as exc:
                raise ConfigError(
                    f"{where}: key {kid!r} is not valid base64;"
                    f" make a new one with `certagent keys generate {kid}`"
                ) from exc
            if len(key) != KEY_BYTES:
                raise ConfigError(
                    f"{where}: key {kid!r} is {len(key)} bytes; AES-256 needs {KEY_BYTES}:"
                    f" make a new one with `certagent keys generate {kid}`"
                )
            if any(kid == known for known, _ in keys):
                raise ConfigError(
                    f"{where}: key id {kid!r} appears twice; give each key its own id"
                )
            keys.append((kid, key))
        if not keys:
            raise ConfigError(f"{source} holds no key; {_HOW_TO_CREATE}")
        return cls(keys=tuple(keys), current=keys[0][0])

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> KeyRing:
        """Read and parse a key file (see :meth:`from_text`)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConfigError(f"key file {path} does not exist; {_HOW_TO_CREATE}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(f"cannot read key file {path}: {reason}") from exc
        return cls.from_text(text, source=f"key file {path}")


def key_fingerprint(key: bytes) -> str:
    """The key id that names ``key`` by itself: ``k`` + 12 hex digits of its SHA-256.

    Two agents that hold the same key agree on its id, and an id copied next to
    another key is caught (:class:`KeyRing` checks it).
    """
    return "k" + hashlib.sha256(b"certagent data key\0" + key).hexdigest()[:12]


def held_ids(ring: KeyRing) -> tuple[str, ...]:
    """What names each key of ``ring`` beyond doubt, current first: its kid, or ``kid=fingerprint``.

    A kid made by ``keys generate`` is the key's fingerprint already; an older,
    hand-picked one (``k1``) may name different keys in two files, so the
    fingerprint goes with it.  Agents announce these; writers compare them.
    """
    out = []
    for kid, key in sorted(ring.keys, key=lambda pair: pair[0] != ring.current):
        fingerprint = key_fingerprint(key)
        out.append(kid if kid == fingerprint else f"{kid}={fingerprint}")
    return tuple(out)


def generate_key_line(kid: str | None = None) -> str:
    """A new ``kid:base64key`` line (no newline) with a random 32-byte key.

    Without ``kid`` the key's fingerprint names it (:func:`key_fingerprint`).
    """
    key = os.urandom(KEY_BYTES)
    kid = key_fingerprint(key) if kid is None else kid
    _check_kid(kid)
    return f"{kid}:{base64.b64encode(key).decode('ascii')}"


def encrypt(
    ring: KeyRing,
    plaintext: bytes,
    aad: bytes,
    *,
    nonce: bytes | None = None,
    binary: bool = False,
) -> bytes:
    """Encrypt ``plaintext`` with the current key, binding ``aad``; return a token.

    ``binary``: a ``cak2`` token (raw bytes after the key id) instead of ``cak1``
    (base64).  ``nonce`` is for tests only: never reuse one with the same key.
    """
    if nonce is None:
        nonce = os.urandom(NONCE_BYTES)
    elif len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
    key = ring.key(ring.current)
    assert key is not None  # KeyRing.__post_init__ checked it
    sealed = AESGCM(key).encrypt(nonce, plaintext, aad)
    if binary:
        return BINARY_PREFIX + ring.current.encode("ascii") + b":" + nonce + sealed
    return TOKEN_PREFIX + ring.current.encode("ascii") + b":" + base64.b64encode(nonce + sealed)


class Sealer:
    """``encrypt(ring, plaintext, aad, binary=True)``, many times: the cipher set up once.

    For the bulk import's workers (one per batch of records).  The same tokens
    as :func:`encrypt` (a random nonce each); holds the current data key.
    """

    def __init__(self, ring: KeyRing) -> None:
        key = ring.key(ring.current)
        assert key is not None  # KeyRing.__post_init__ checked it
        self._aead = AESGCM(key)
        self._head = BINARY_PREFIX + ring.current.encode("ascii") + b":"

    def __repr__(self) -> str:
        return "Sealer()"

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return self._head + nonce + self._aead.encrypt(nonce, plaintext, aad)


def decrypt(ring: KeyRing, token: bytes, aad: bytes) -> bytes:
    """Decrypt a token from :func:`encrypt` made with the same ``aad``.

    Raises :class:`KeyDecryptError` for a malformed token, a kid not in the
    ring, or a token that does not authenticate (wrong key, wrong ``aad``,
    altered bytes).
    """
    kid, payload = _parse(token)
    key = ring.key(kid)
    if key is None:
        raise KeyDecryptError(
            f"the key was encrypted with data key {kid!r}, which is not in the key ring"
            f" ({', '.join(ring.kids)}); add that key back to the key file"
        )
    if token.startswith(BINARY_PREFIX):
        sealed = payload
    else:
        try:
            sealed = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise KeyDecryptError(f"the token for data key {kid!r} is not valid base64") from exc
    if len(sealed) < NONCE_BYTES + _TAG_BYTES:
        raise KeyDecryptError(f"the token for data key {kid!r} is truncated")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise KeyDecryptError(
            f"data key {kid!r} cannot decrypt this record: the key file has a different"
            f" {kid!r}, the token belongs to another record, or it was altered"
        ) from exc


def token_kid(token: bytes) -> str:
    """The kid a token was encrypted with, without decrypting it."""
    return _parse(token)[0]


def needs_rotation(ring: KeyRing, token: bytes) -> bool:
    """Whether ``token`` was encrypted with a key other than the ring's current one."""
    return token_kid(token) != ring.current


def reencrypt(ring: KeyRing, token: bytes, aad: bytes) -> bytes:
    """Decrypt ``token`` and encrypt it again with the current key (``keys rotate``).

    The new token has the old one's form (``cak1`` or ``cak2``).
    """
    return encrypt(ring, decrypt(ring, token, aad), aad, binary=token.startswith(BINARY_PREFIX))


# --- helpers ----------------------------------------------------------------------


def _parse(token: bytes) -> tuple[str, bytes]:
    if not token.startswith((TOKEN_PREFIX, BINARY_PREFIX)):
        what = "a plaintext PEM" if token.lstrip().startswith(b"-----BEGIN") else "not a token"
        raise KeyDecryptError(
            f"the stored key is {what}, not an encrypted cak1 token;"
            " re-upload the certificate so the agent encrypts its key"
        )
    raw_kid, sep, payload = token[len(TOKEN_PREFIX) :].partition(b":")  # both prefixes: 5 bytes
    kid = raw_kid.decode("ascii", errors="replace")
    if not sep or not _KID.match(kid):
        raise KeyDecryptError("the encrypted key token has no valid key id")
    return kid, payload


def _check_kid(kid: str) -> None:
    if not _KID.match(kid):
        raise ConfigError(_kid_rule())


def _kid_rule() -> str:
    return "a key id is 1-16 letters, digits, '-' or '_', starting with a letter or digit"
