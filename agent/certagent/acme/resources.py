"""ACME resources (RFC 8555 §7.1) as frozen dataclasses: what the CA told us, validated.

Objects here are built only by :mod:`certagent.acme.messages` from documents that
passed validation, so a field typed ``str`` holds a string of bounded length, a URL
is an absolute ``https`` (or, for a test CA, ``http``) URL, a ``dns`` identifier is
a valid hostname, and a token is base64url.  Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Literal

#: RFC 8555 §6.7: every ACME problem type starts with this.
PROBLEM_PREFIX = "urn:ietf:params:acme:error:"

OrderStatus = Literal["pending", "ready", "processing", "valid", "invalid"]
AuthorizationStatus = Literal["pending", "valid", "invalid", "deactivated", "expired", "revoked"]
ChallengeStatus = Literal["pending", "processing", "valid", "invalid"]
AccountStatus = Literal["valid", "deactivated", "revoked"]

ORDER_STATUSES: tuple[OrderStatus, ...] = ("pending", "ready", "processing", "valid", "invalid")
AUTHORIZATION_STATUSES: tuple[AuthorizationStatus, ...] = (
    "pending",
    "valid",
    "invalid",
    "deactivated",
    "expired",
    "revoked",
)
CHALLENGE_STATUSES: tuple[ChallengeStatus, ...] = ("pending", "processing", "valid", "invalid")
ACCOUNT_STATUSES: tuple[AccountStatus, ...] = ("valid", "deactivated", "revoked")

HTTP_01 = "http-01"
TLS_ALPN_01 = "tls-alpn-01"
DNS_01 = "dns-01"


@dataclass(frozen=True)
class Identifier:
    """``{"type": "dns", "value": "example.com"}``; ``dns`` values are lowercase hostnames."""

    type: str
    value: str

    def __str__(self) -> str:
        return self.value if self.type == "dns" else f"{self.type}:{self.value}"


@dataclass(frozen=True)
class Problem:
    """An RFC 7807 problem document as an ACME CA sends it (RFC 8555 §6.7).

    ``detail`` is the CA's text with control characters replaced and cut to a
    bounded length, so it can go into a log line as it is.
    """

    type: str
    detail: str = ""
    status: int | None = None
    identifier: Identifier | None = None
    subproblems: tuple[Problem, ...] = ()

    @property
    def code(self) -> str:
        """The ACME error name (``badNonce``, ``rateLimited`` ...), or the whole type."""
        if self.type.startswith(PROBLEM_PREFIX):
            return self.type[len(PROBLEM_PREFIX) :]
        return self.type

    def describe(self) -> str:
        """One line: ``rateLimited: too many certificates (for a.example: ...)``."""
        detail = self.detail.rstrip(". ")
        text = f"{self.code}: {detail}" if detail else self.code
        if self.identifier is not None:
            text = f"{text} [{self.identifier}]"
        if self.subproblems:
            parts = "; ".join(p.describe() for p in self.subproblems[:5])
            more = f"; and {len(self.subproblems) - 5} more" if len(self.subproblems) > 5 else ""
            text = f"{text} ({parts}{more})"
        return text


@dataclass(frozen=True)
class DirectoryMeta:
    terms_of_service: str | None = None
    website: str | None = None
    caa_identities: tuple[str, ...] = ()
    external_account_required: bool = False
    #: profile name -> the CA's description (``meta.profiles``), empty if none offered
    profiles: tuple[tuple[str, str], ...] = ()

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.profiles)


@dataclass(frozen=True)
class Directory:
    """The directory object (RFC 8555 §7.1.1), with ``renewalInfo`` (RFC 9773) if offered."""

    url: str
    new_nonce: str
    new_account: str
    new_order: str
    revoke_cert: str | None = None
    key_change: str | None = None
    new_authz: str | None = None
    renewal_info: str | None = None
    meta: DirectoryMeta = field(default_factory=DirectoryMeta)


@dataclass(frozen=True)
class Account:
    """An account object (§7.1.2); ``url`` is its ``Location``, the ``kid`` of later requests."""

    url: str
    status: AccountStatus
    contact: tuple[str, ...] = ()
    orders: str | None = None
    terms_of_service_agreed: bool | None = None
    #: True when newAccount answered 201 (a new account), False for 200 (an existing one)
    created: bool = False


@dataclass(frozen=True)
class Challenge:
    """A challenge object (§7.1.5, §8); ``token`` is validated base64url when present."""

    type: str
    url: str
    status: ChallengeStatus
    token: str | None = None
    validated: dt.datetime | None = None
    error: Problem | None = None


@dataclass(frozen=True)
class Authorization:
    """An authorization object (§7.1.4); ``url`` is where it was fetched."""

    url: str
    identifier: Identifier
    status: AuthorizationStatus
    challenges: tuple[Challenge, ...] = ()
    expires: dt.datetime | None = None
    wildcard: bool = False

    def challenge(self, type_: str) -> Challenge | None:
        """The first challenge of that type, or None if the CA offers none."""
        for challenge in self.challenges:
            if challenge.type == type_:
                return challenge
        return None

    @property
    def name(self) -> str:
        """The name this authorization is for, ``*.`` included for a wildcard."""
        return f"*.{self.identifier.value}" if self.wildcard else self.identifier.value


@dataclass(frozen=True)
class Order:
    """An order object (§7.1.3); ``url`` is its ``Location`` from newOrder."""

    url: str
    status: OrderStatus
    identifiers: tuple[Identifier, ...]
    authorizations: tuple[str, ...]
    finalize: str
    certificate: str | None = None
    expires: dt.datetime | None = None
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None
    error: Problem | None = None
    #: the profile the CA applies (echoed by CAs that offer profiles)
    profile: str | None = None
    #: the ARI certificate identifier this order replaces (RFC 9773 §5)
    replaces: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(i.value for i in self.identifiers)
