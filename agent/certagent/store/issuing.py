"""What every store's issuance roles check and encode the same way: pure functions, no I/O.

The roles are :mod:`certagent.store.issuance`'s; the Redis store, the directory
store and the in-memory ones (:mod:`certagent.store.localissuance`) call these so
that a name, node, token or account reaches a key, a file name or an event only
once validated, and so that they encode challenges, leases and registrations
alike.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

from certagent.certs import hostname
from certagent.errors import LeaseLost
from certagent.store.issuance import AcmeAccount, Lease, PublishedChallenge, Registration

__all__ = [
    "ACK_SECONDS",
    "CHALLENGE_GRACE",
    "HOLD_SECONDS",
    "MAX_PAGE",
    "MAX_TTL",
    "STATE_LAPSE",
    "account_aad",
    "check_account",
    "check_name",
    "check_node",
    "check_time",
    "check_token",
    "check_ttl",
    "clean_error",
    "decode_challenge",
    "decode_registration",
    "encode_challenge",
    "encode_registration",
    "lease_lost",
    "lease_value",
    "parse_lease_value",
]

#: A name's backoff state lapses this long after its ``not_before`` (seconds).
STATE_LAPSE = 86_400.0
#: :meth:`~certagent.store.issuance.IssueLocks.add_issued` makes its lease last at least
#: this long before writing (seconds), so that it cannot lapse in the middle of the write.
HOLD_SECONDS = 60.0
#: The nodes that acknowledged a challenge are kept this long at most (seconds).
ACK_SECONDS = 3600.0
#: The store keeps a challenge this long past its ``expires_at`` before dropping it for good.
CHALLENGE_GRACE = 60.0
#: Registrations listed per call at most.
MAX_PAGE = 1000
#: Longest TTL a lease, an order slot or a beat may ask for (seconds): one day.
MAX_TTL = 86_400.0

_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}\Z")
_THUMBPRINT = re.compile(r"[A-Za-z0-9_-]{16,128}\Z")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}\Z")
_PRINTABLE = re.compile(r"[\x21-\x7e]{1,2048}\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_KINDS = ("http-01", "tls-alpn-01")
_MAX_ERROR = 500


# --- checks --------------------------------------------------------------------------------


def check_name(name: str) -> str:
    """``name`` lowercased if it is a hostname or a ``*.`` pattern; InvalidHostname otherwise."""
    return hostname.normalise_pattern(name)


def check_node(node: str) -> str:
    """``node`` if it can name a node: 1-128 letters, digits and ``_.:@-``; ValueError otherwise."""
    if not isinstance(node, str) or not _NODE.match(node):
        raise ValueError(f"not a node name: {node[:40]!r} (letters, digits and _.:@- only)")
    return node


def check_token(token: str) -> str:
    """``token`` if it is an ACME challenge token (base64url, 16-256 characters); ValueError."""
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise ValueError(f"not an ACME challenge token: {token[:40]!r}")
    return token


def check_ttl(ttl: float) -> float:
    """``ttl`` if it is a duration a lease, slot or beat may last: > 0 s, at most a day."""
    if not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or not 0 < ttl <= MAX_TTL:
        raise ValueError(f"a TTL must be between 0 and {MAX_TTL:.0f} seconds, not {ttl!r}")
    return float(ttl)


def check_time(moment: float, what: str) -> float:
    """``moment`` (Unix seconds) if it is a finite number; ValueError naming ``what``."""
    if not isinstance(moment, (int, float)) or not math.isfinite(moment):
        raise ValueError(f"{what} must be a time in Unix seconds, not {moment!r}")
    return float(moment)


def check_challenge(challenge: PublishedChallenge) -> PublishedChallenge:
    """``challenge`` with its name lowercased, if every field is valid; ValueError otherwise.

    The key authorization must be ``token.thumbprint`` (RFC 8555 §8.1).
    """
    if challenge.kind not in _KINDS:
        raise ValueError(f"not a challenge kind this agent answers: {challenge.kind!r}")
    token = check_token(challenge.token)
    head, dot, thumbprint = challenge.key_authorization.partition(".")
    if head != token or not dot or not _THUMBPRINT.match(thumbprint):
        raise ValueError(f"challenge {token}: the key authorization is not '<token>.<thumbprint>'")
    return PublishedChallenge(
        challenge.kind,
        check_name(challenge.name),
        token,
        challenge.key_authorization,
        check_time(challenge.expires_at, f"challenge {token}: expires_at"),
    )


def check_account(account: AcmeAccount) -> None:
    """ValueError unless the account's directory, URL and contacts are printable ASCII."""
    if not _PRINTABLE.match(account.directory):
        raise ValueError("the ACME directory URL must be printable ASCII without spaces")
    if account.url is not None and not _PRINTABLE.match(account.url):
        raise ValueError("the ACME account URL must be printable ASCII without spaces")
    if len(account.contact) > 20 or not all(
        isinstance(c, str) and _PRINTABLE.match(c) for c in account.contact
    ):
        raise ValueError("ACME contacts must be at most 20 printable ASCII URIs")
    if not account.key_pem.startswith(b"-----BEGIN "):
        raise ValueError("the ACME account key must be a PEM private key")


def clean_error(error: str) -> str:
    """``error`` on one line, control characters replaced, at most 500 characters."""
    return _CONTROL.sub(" ", error).strip()[:_MAX_ERROR]


# --- encodings -----------------------------------------------------------------------------


def account_aad(directory: str) -> bytes:
    """What an account key's encryption is bound to: its CA's directory URL."""
    return b"acme-account " + directory.encode("ascii")


def lease_value(lease: Lease) -> str:
    """A lease as the store keeps it: ``<token> <node>``."""
    return f"{lease.token} {lease.node}"


def parse_lease_value(raw: bytes | str | None) -> tuple[int, str] | None:
    """(token, node) of a stored lease value; None if there is none or it is not one."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    token, _, node = text.partition(" ")
    return (int(token), node) if token.isdigit() and node else None


def lease_lost(lease: Lease, holder: bytes | str | None) -> LeaseLost:
    """The error of a write whose lease is gone; ``holder`` the lease's stored value now."""
    now = parse_lease_value(holder)
    where = (
        "it lapsed and no node holds it now"
        if now is None
        else f"it lapsed and node {now[1]} holds it now (token {now[0]})"
    )
    return LeaseLost(
        f"the lease of node {lease.node} on {lease.name} (token {lease.token}) is no longer"
        f" held: {where}; nothing was stored (that node's order counts)"
    )


def encode_challenge(challenge: PublishedChallenge) -> bytes:
    """A checked challenge as the store keeps it: compact JSON."""
    return json.dumps(
        {
            "kind": challenge.kind,
            "name": challenge.name,
            "token": challenge.token,
            "key_authorization": challenge.key_authorization,
            "expires_at": challenge.expires_at,
        },
        separators=(",", ":"),
    ).encode("ascii")


def decode_challenge(raw: bytes | str) -> PublishedChallenge:
    """A challenge from :func:`encode_challenge`, checked again; ValueError if it is not one."""
    try:
        data = json.loads(raw)
        challenge = PublishedChallenge(
            kind=data["kind"],
            name=data["name"],
            token=data["token"],
            key_authorization=data["key_authorization"],
            expires_at=float(data["expires_at"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a stored challenge: {exc}") from exc
    return check_challenge(challenge)


def encode_registration(added_at: float, issue: bool) -> str:
    """A registration's value: ``<added_at Unix seconds> <0|1>``."""
    return f"{added_at:.0f} {int(issue)}"


def decode_registration(name: str, raw: bytes | str) -> Registration:
    """A registration of ``name`` from :func:`encode_registration`; ValueError if malformed."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    added, _, issue = text.partition(" ")
    if issue not in ("0", "1"):
        raise ValueError(f"registration of {name}: not '<time> <0|1>': {text[:40]!r}")
    return Registration(name, datetime.fromtimestamp(float(added), UTC), issue == "1")
