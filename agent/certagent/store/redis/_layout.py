"""The Redis store's key layout: key names, record fields, ids, reply values.

Pure functions on values, no I/O; how records and events are encoded into
those keys is :mod:`certagent.store.redis._records`.  docs/store.md describes
the same layout for operators.

Key layout (``prefix`` defaults to ``certagent:``; all values are bytes)::

    {prefix}cert:{id}     STRING  a record written since layout 2 (:mod:`._packed`): names,
                                  dates, the leaf's DER, its key encrypted, the chain's SHA-256
    {prefix}chain:{sha256} STRING the certificates after the leaf (DER, concatenated) of every
                                  layout-2 record whose ``C`` field names that SHA-256
    {prefix}cert:{id}     HASH    a record of layout 1 (written before; still read and updated):
                                  chain               leaf + chain certificates, PEM, leaf first
                                  key                 the private key: keycrypt token (aad = id)
                                  names               the certificate's names, space-separated
                                  fingerprint_sha1    uppercase hex (as HAProxy prints it)
                                  fingerprint_sha256  lowercase hex
                                  serial              uppercase hex
                                  key_type            ECDSA-P256, RSA-2048, ...
                                  not_before          ISO 8601 UTC, e.g. 2025-01-31T12:00:00Z
                                  not_after           ISO 8601 UTC
                                  version             1 on add, + 1 on every replace
                                  updated_at          ISO 8601 UTC
                                  ocsp                the DER OCSP response to staple (optional)
                                  managed             "acme": obtained by the agent (absent for
                                                      an upload, and after a replace)
                                  names_dropped       (a cluster only) names a replace dropped,
                                                      until they are out of their name sets
    {prefix}name:{name}   SET     ids of the records with that name (an ECDSA and an RSA one)
    {prefix}fp:{sha256}   STRING  id of the record holding that leaf (duplicate check)
    {prefix}ids           ZSET    every id, score 0: id order and cursors (ZRANGEBYLEX)
    {prefix}expiry        ZSET    every id, scored by notAfter (Unix seconds)
    {prefix}events        STREAM  one entry per write: kind (put|delete), id, names;
                                  kind tls-keys (no id, no names) when the ring rotates
    {prefix}tls:ring      HASH    generation, rotated_at, k0 k1 k2: the TLS ticket keys,
                                  keycrypt tokens (aad = tls-ticket-key), oldest first
    {prefix}tls:lock      STRING  held (SET NX PX) by the agent rotating the ring
    {prefix}lock:{id}     STRING  (a cluster only) held (SET NX PX) by the agent writing record id
    {prefix}datakeys      HASH    node -> "<lapse ms> <kid> <kid> ...": the data keys each running
                                  agent holds, until its announcement lapses (Redis's clock)
    {prefix}namefilter    STRING  the agents' name filter at a position of the events stream
                                  (:mod:`certagent.service.bloom`), rewritten now and then
    {prefix}format        HASH    the store's active format (:mod:`certagent.store.formats`):
                                  format, and the version, node and time that set it; absent:
                                  format 1 (a store of a release before 0.3.0)
    {prefix}fleet:nodes   HASH    node -> "<lapse ms> <seen ms> <JSON>": each agent's release
                                  and the formats it reads, beat every 20 s (Redis's clock);
                                  kept 10 minutes after its last beat (:mod:`._fleet`)

The issuance roles (:mod:`certagent.store.issuance`; all on the ``{global}`` slot of a
cluster, so that one script or MULTI covers a lease and a record's commit)::

    {prefix}acme:account:{h}      HASH    the account of the CA whose directory URL has
                                          SHA-256 h (32 hex digits): directory, key (keycrypt,
                                          aad "acme-account <directory>"), url, contact (JSON
                                          list), updated_at
    {prefix}acme:lease:{name}     STRING  "<token> <node>", PX the lease's TTL
    {prefix}acme:fence            STRING  the last fencing token handed out (INCR)
    {prefix}acme:challenges       HASH    token -> the challenge (JSON); PEXPIRE past the latest
    {prefix}acme:acks:{token}     SET     nodes serving that challenge; PEXPIRE 1 h
    {prefix}acme:nodes            ZSET    node -> when its beat lapses (ms, Redis's clock)
    {prefix}acme:domains          ZSET    every registered name, score 0 (ZRANGEBYLEX)
    {prefix}acme:domain-info      HASH    name -> "<added_at Unix seconds> <issue 0|1>"
    {prefix}acme:backoff:{name}   HASH    failures, not_before, last_error; PEXPIRE a day
                                          past not_before
    {prefix}acme:pause            STRING  until when the CA asked to wait (Unix seconds), PX
    {prefix}acme:orders           ZSET    name -> when its open-order slot lapses (ms, Redis's
                                          clock)
    {prefix}acme:renew            ZSET    the renewal schedule: member "<name> <not_after>",
                                          scored by renew_at (Unix seconds)
    {prefix}acme:renew-entries    HASH    name -> its member of acme:renew (to move or drop it)
    {prefix}acme:budget:{key}:{s}:{i}
                                  STRING  spends in window i (of s seconds) of budget key; PX
                                          the window's end + 1 s
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_PREFIX",
    "F_CHAIN",
    "F_DROPPED",
    "F_KEY",
    "F_KEY_TYPE",
    "F_MANAGED",
    "F_NAMES",
    "F_NOT_AFTER",
    "F_NOT_BEFORE",
    "F_OCSP",
    "F_SERIAL",
    "F_SHA1",
    "F_SHA256",
    "F_UPDATED_AT",
    "F_VERSION",
    "META_FIELDS",
    "ZERO",
    "Keys",
    "to_bytes",
    "to_text",
    "valid_id",
]

DEFAULT_PREFIX = "certagent:"

F_CHAIN = "chain"
F_KEY = "key"
F_NAMES = "names"
F_SHA1 = "fingerprint_sha1"
F_SHA256 = "fingerprint_sha256"
F_SERIAL = "serial"
F_KEY_TYPE = "key_type"
F_NOT_BEFORE = "not_before"
F_NOT_AFTER = "not_after"
F_VERSION = "version"
F_UPDATED_AT = "updated_at"
F_OCSP = "ocsp"  # the DER OCSP response to staple, when one was stored
#: "acme" for a certificate the agent obtained; absent (= "") for an upload.
F_MANAGED = "managed"
#: Names a replace on a cluster dropped, kept in the record until they are out of the name sets.
F_DROPPED = "names_dropped"
#: The fields a :class:`CertRecord` is made of (no key material).
META_FIELDS = (
    F_NAMES,
    F_SHA256,
    F_SERIAL,
    F_KEY_TYPE,
    F_NOT_BEFORE,
    F_NOT_AFTER,
    F_VERSION,
    F_UPDATED_AT,
    F_MANAGED,
)
#: The position before every event.
ZERO = "0-0"

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class Keys:
    """Builds every Redis key the store uses.

    With ``cluster``, keys carry hash tags (see docs/store.md): a record's hash
    is tagged by its id (``cert:{id}``), a name set by its name (``name:{host}``),
    a fingerprint by itself (``fp:{sha256}``), and the keys every write or
    rotation shares -- ``ids``, ``expiry``, ``events``, ``tls:ring``, ``tls:lock``
    -- by one fixed tag (``{global}:events``), so each of those groups stays in
    one slot.  Every issuance key (``acme:...``) is on ``{global}`` too.
    """

    prefix: str = DEFAULT_PREFIX
    cluster: bool = False

    def __post_init__(self) -> None:
        if self.cluster and ("{" in self.prefix or "}" in self.prefix):
            raise ValueError("a Redis Cluster key prefix cannot hold '{' or '}'")

    def _tag(self, part: str) -> str:
        return f"{{{part}}}" if self.cluster else part

    def _global(self, name: str) -> str:
        return f"{self.prefix}{{global}}:{name}" if self.cluster else f"{self.prefix}{name}"

    def cert(self, cert_id: str) -> str:
        return f"{self.prefix}cert:{self._tag(cert_id)}"

    def name(self, name: str) -> str:
        return f"{self.prefix}name:{self._tag(name)}"

    def chain(self, digest: bytes) -> str:
        """The shared chain whose DER has SHA-256 ``digest`` (:mod:`._packed`)."""
        return f"{self.prefix}chain:{self._tag(digest.hex())}"

    def name_pattern(self) -> str:
        """The SCAN pattern of every name key."""
        return f"{self.prefix}name:{{*}}" if self.cluster else f"{self.prefix}name:*"

    def name_of(self, key: str) -> str:
        """The name a name key (from :meth:`name_pattern`) is for."""
        raw = key[len(self.prefix) + len("name:") :]
        return raw[1:-1] if self.cluster else raw

    def fingerprint(self, sha256: str) -> str:
        return f"{self.prefix}fp:{self._tag(sha256)}"

    def record_lock(self, cert_id: str) -> str:
        """Held (SET NX PX) while a cluster write changes the record (same slot as it)."""
        return f"{self.prefix}lock:{self._tag(cert_id)}"

    def ids(self) -> str:
        return self._global("ids")

    def expiry(self) -> str:
        return self._global("expiry")

    def events(self) -> str:
        return self._global("events")

    def tls_ring(self) -> str:
        return self._global("tls:ring")

    def tls_lock(self) -> str:
        return self._global("tls:lock")

    def data_key_holders(self) -> str:
        """The data keys each agent holds (:mod:`certagent.store.redis._fleetkeys`)."""
        return self._global("datakeys")

    def name_filter(self) -> str:
        return self._global("namefilter")

    def store_format(self) -> str:
        """The store's active format (:mod:`certagent.store.formats`)."""
        return self._global("format")

    def fleet_nodes(self) -> str:
        """Each agent's release and the formats it reads (:mod:`._fleet`)."""
        return self._global("fleet:nodes")

    # --- issuance: every key on the {global} slot ---------------------------------------

    def account(self, directory: str) -> str:
        """The ACME account of the CA at ``directory`` (a URL: hashed into the key)."""
        digest = hashlib.sha256(directory.encode("utf-8")).hexdigest()[:32]
        return self._global(f"acme:account:{digest}")

    def account_pattern(self) -> str:
        """The SCAN pattern of every account key."""
        return self._global("acme:account:*")

    def lease(self, name: str) -> str:
        """The issuance lease on validated ``name``."""
        return self._global(f"acme:lease:{name}")

    def fence(self) -> str:
        return self._global("acme:fence")

    def challenges(self) -> str:
        return self._global("acme:challenges")

    def acks(self, token: str) -> str:
        """The nodes serving the challenge of validated ``token``."""
        return self._global(f"acme:acks:{token}")

    def nodes(self) -> str:
        return self._global("acme:nodes")

    def domains(self) -> str:
        return self._global("acme:domains")

    def domain_info(self) -> str:
        return self._global("acme:domain-info")

    def backoff(self, name: str) -> str:
        """The backoff state of validated ``name``."""
        return self._global(f"acme:backoff:{name}")

    def pause(self) -> str:
        return self._global("acme:pause")

    def order_slots(self) -> str:
        return self._global("acme:orders")

    def renewals(self) -> str:
        """The renewal schedule (a sorted set)."""
        return self._global("acme:renew")

    def renewal_entries(self) -> str:
        """Name -> its member of :meth:`renewals`."""
        return self._global("acme:renew-entries")

    def budget(self, key: str, seconds: str, index: int) -> str:
        """The count of window ``index`` of ``seconds`` s of checked budget ``key``."""
        return self._global(f"acme:budget:{key}:{seconds}:{index}")


def valid_id(cert_id: str) -> bool:
    """Whether ``cert_id`` can be a record id: 1-64 letters, digits, ``_.-``; no ``/`` or ``:``."""
    return _ID.match(cert_id) is not None


# --- values ---------------------------------------------------------------------------------


def to_bytes(value: object) -> bytes | None:
    """redis-py types replies loosely; with decode_responses=False they are bytes."""
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None


def to_text(value: object) -> str:
    raw = to_bytes(value)
    return "" if raw is None else raw.decode("ascii", "replace")
