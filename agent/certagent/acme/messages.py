"""Parsing the CA's JSON documents into :mod:`~certagent.acme.resources`, strictly.

Every function takes the raw response body (and the URL it belongs to), and
returns a frozen dataclass or raises
:class:`~certagent.acme.errors.AcmeProtocolError`.  ``https_only`` refuses ``http``
URLs inside a document; the client sets it from its directory URL's scheme, so a
CA served over TLS cannot point requests at plaintext URLs.  Costs are linear in
the document, which is at most 1 MiB.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from certagent.acme._doc import MAX_BODY, MAX_TEXT, Doc, clean_text, load_object
from certagent.acme.errors import AcmeProtocolError
from certagent.acme.resources import (
    ACCOUNT_STATUSES,
    AUTHORIZATION_STATUSES,
    CHALLENGE_STATUSES,
    ORDER_STATUSES,
    Account,
    Authorization,
    Challenge,
    Directory,
    DirectoryMeta,
    Identifier,
    Order,
    Problem,
)
from certagent.certs.hostname import normalise_pattern
from certagent.errors import InvalidHostname

#: RFC 8555 §8: a token has at least 128 bits of entropy in base64url (22 characters).
_TOKEN = re.compile(r"[A-Za-z0-9_-]{22,256}\Z")
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MAX_PROFILES = 50


def validate_token(token: object) -> str:
    """A challenge token fit for a URL path and a map key (base64url, 22-256 characters).

    Raises :class:`AcmeProtocolError` otherwise: a token comes from the network.
    """
    if not isinstance(token, str) or not _TOKEN.match(token):
        shown = clean_text(token, 40) if isinstance(token, str) else type(token).__name__
        raise AcmeProtocolError(f"the CA sent a challenge token that is not base64url: {shown!r}")
    return token


def read_identifier(value: Any, what: str) -> Identifier:
    """``{"type": "dns", "value": ...}``: a valid hostname (``*.`` allowed), or an IP address."""
    if not isinstance(value, dict):
        raise AcmeProtocolError(f"the CA's {what} is not an object")
    doc = Doc(value, what)
    kind = doc.required_text("type", limit=16)
    raw = doc.required_text("value", limit=260)
    try:
        if kind == "dns":
            return Identifier("dns", normalise_pattern(raw))
        if kind == "ip":
            return Identifier("ip", str(ipaddress.ip_address(raw)))
    except (InvalidHostname, ValueError) as exc:
        raise doc.fail("value", f"is not a valid {kind} identifier ({exc})") from exc
    raise doc.fail("type", f"is {clean_text(kind, 16)!r}: only dns and ip identifiers are known")


def read_problem(value: Any, what: str, *, nested: bool = False) -> Problem:
    """A problem document; one level of ``subproblems`` is read, deeper ones are dropped."""
    if not isinstance(value, dict):
        raise AcmeProtocolError(f"the CA's {what} is not an object")
    doc = Doc(value, what)
    kind = doc.text("type", required=False, limit=256) or "about:blank"
    detail = doc.text("detail", required=False, limit=MAX_BODY) or ""
    status = doc.integer("status")
    if status is not None and not 100 <= status <= 599:
        status = None
    identifier = (
        read_identifier(value["identifier"], f"{what} identifier")
        if doc.has("identifier")
        else None
    )
    subproblems: tuple[Problem, ...] = ()
    if not nested:
        subproblems = doc.items(
            "subproblems", lambda item, label: read_problem(item, label, nested=True), limit=100
        )
    return Problem(clean_text(kind, 256), clean_text(detail), status, identifier, subproblems)


def parse_problem(body: bytes, status: int) -> Problem:
    """The problem document of an error response; a stand-in if the body is not one.

    Never raises: a CA (or a proxy in front of it) answering an error with HTML
    still gives a :class:`Problem` that says what came back.
    """
    try:
        problem = read_problem(load_object(body, "error document").value, "error document")
    except AcmeProtocolError:
        text = clean_text(body[:MAX_TEXT].decode("utf-8", "replace"), 200)
        detail = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        return Problem("about:blank", detail, status)
    if problem.status is None:
        problem = Problem(
            problem.type, problem.detail, status, problem.identifier, problem.subproblems
        )
    return problem


def _read_profiles(meta: Doc) -> tuple[tuple[str, str], ...]:
    profiles = meta.doc("profiles")
    if profiles is None:
        return ()
    if len(profiles.value) > MAX_PROFILES:
        raise profiles.fail("profiles", f"lists more than {MAX_PROFILES} profiles")
    out = []
    for name in profiles.value:
        if not _PROFILE.match(name):
            raise meta.fail("profiles", f"has a profile name that is not a token: {name[:40]!r}")
        description = profiles.text(name, required=False, limit=MAX_TEXT) or ""
        out.append((name, clean_text(description)))
    return tuple(out)


def parse_directory(body: bytes, url: str, *, https_only: bool = True) -> Directory:
    """The directory object (RFC 8555 §7.1.1; ``renewalInfo`` from RFC 9773)."""
    doc = load_object(body, f"directory ({url})")
    meta = doc.doc("meta")
    directory_meta = DirectoryMeta()
    if meta is not None:
        directory_meta = DirectoryMeta(
            terms_of_service=meta.text("termsOfService", required=False),
            website=meta.text("website", required=False),
            caa_identities=meta.items(
                "caaIdentities", lambda v, w: _short_text(v, w, 253), limit=100
            ),
            external_account_required=bool(meta.flag("externalAccountRequired")),
            profiles=_read_profiles(meta),
        )

    def optional(key: str) -> str | None:
        return doc.url(key, https_only=https_only, required=False)

    return Directory(
        url=url,
        new_nonce=doc.required_url("newNonce", https_only=https_only),
        new_account=doc.required_url("newAccount", https_only=https_only),
        new_order=doc.required_url("newOrder", https_only=https_only),
        revoke_cert=optional("revokeCert"),
        key_change=optional("keyChange"),
        new_authz=optional("newAuthz"),
        renewal_info=optional("renewalInfo"),
        meta=directory_meta,
    )


def _short_text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise AcmeProtocolError(f"the CA's {what} is not a string of at most {limit} characters")
    return value


def parse_account(body: bytes, url: str, *, created: bool, https_only: bool = True) -> Account:
    """The account object; ``url`` is the ``Location`` the CA gave for it."""
    doc = load_object(body, f"account ({url})")
    return Account(
        url=url,
        status=doc.choice("status", ACCOUNT_STATUSES),
        contact=doc.items("contact", lambda v, w: _short_text(v, w, 1024), limit=100),
        orders=doc.url("orders", https_only=https_only, required=False),
        terms_of_service_agreed=doc.flag("termsOfServiceAgreed"),
        created=created,
    )


def _read_url(https_only: bool) -> Any:
    def read(value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise AcmeProtocolError(f"the CA's {what} is not a string")
        try:
            return Doc({"url": value}, what).required_url("url", https_only=https_only)
        except AcmeProtocolError as exc:
            raise AcmeProtocolError(f"the CA's {what} is not a valid URL") from exc

    return read


def parse_order(body: bytes, url: str, *, https_only: bool = True) -> Order:
    """The order object at ``url`` (RFC 8555 §7.1.3, ``replaces`` from RFC 9773)."""
    doc = load_object(body, f"order ({url})")
    identifiers = doc.items("identifiers", read_identifier, required=True)
    if not identifiers:
        raise doc.fail("identifiers", "is empty")
    profile = doc.text("profile", required=False, limit=64)
    return Order(
        url=url,
        status=doc.choice("status", ORDER_STATUSES),
        identifiers=identifiers,
        authorizations=doc.items("authorizations", _read_url(https_only), required=True),
        finalize=doc.required_url("finalize", https_only=https_only),
        certificate=doc.url("certificate", https_only=https_only, required=False),
        expires=doc.time("expires"),
        not_before=doc.time("notBefore"),
        not_after=doc.time("notAfter"),
        error=read_problem(doc.value["error"], f"{doc.what} error") if doc.has("error") else None,
        profile=clean_text(profile, 64) if profile is not None else None,
        replaces=doc.text("replaces", required=False, limit=512),
    )


def read_challenge(value: Any, what: str, *, https_only: bool = True) -> Challenge:
    if not isinstance(value, dict):
        raise AcmeProtocolError(f"the CA's {what} is not an object")
    doc = Doc(value, what)
    return Challenge(
        type=clean_text(doc.required_text("type", limit=64), 64),
        url=doc.required_url("url", https_only=https_only),
        status=doc.choice("status", CHALLENGE_STATUSES),
        token=validate_token(value["token"]) if doc.has("token") else None,
        validated=doc.time("validated"),
        error=read_problem(value["error"], f"{what} error") if doc.has("error") else None,
    )


def parse_challenge(body: bytes, url: str, *, https_only: bool = True) -> Challenge:
    """The challenge object the CA answers a challenge POST with (RFC 8555 §7.5.1)."""
    doc = load_object(body, f"challenge ({url})")
    return read_challenge(doc.value, doc.what, https_only=https_only)


def parse_authorization(body: bytes, url: str, *, https_only: bool = True) -> Authorization:
    """The authorization object at ``url`` (RFC 8555 §7.1.4)."""
    doc = load_object(body, f"authorization ({url})")
    identifier_doc = doc.value.get("identifier")
    if identifier_doc is None:
        raise doc.fail("identifier", "is missing")
    return Authorization(
        url=url,
        identifier=read_identifier(identifier_doc, f"{doc.what} identifier"),
        status=doc.choice("status", AUTHORIZATION_STATUSES),
        challenges=doc.items(
            "challenges",
            lambda v, w: read_challenge(v, w, https_only=https_only),
            required=True,
            limit=20,
        ),
        expires=doc.time("expires"),
        wildcard=bool(doc.flag("wildcard")),
    )
