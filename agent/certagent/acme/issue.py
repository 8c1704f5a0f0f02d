"""One certificate from order to PEM: :func:`obtain_certificate` and the solver it drives.

The flow of RFC 8555 §7.4 with a deadline over all of it: newOrder; for every
pending authorization, the solver publishes the key authorization, the CA is told
to validate, the authorization is polled, the solver removes it again (always);
then a fresh key and CSR, finalize, poll, download.  The chain is checked against
the key and the names before it is returned.  Where challenges are published
(HAProxy map, crt-list slot, the store for a fleet) is the solver's business.

An RSA key is made in a thread (≈50 ms of CPU); everything else is awaited I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from certagent.acme.client import AcmeClient
from certagent.acme.csr import CertKeyType, key_pem, make_csr, new_key, order_names
from certagent.acme.errors import AcmeError, AcmeProtocolError, ChallengeFailed
from certagent.acme.resources import Authorization, Challenge
from certagent.certs.pem import parse_bundle
from certagent.errors import AgentError, CertificateError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


class ChallengeSolver(Protocol):
    """Publishes a challenge answer where the CA will look, and takes it down afterwards."""

    #: challenge types it can answer, most preferred first (e.g. ``("http-01",)``)
    challenge_types: Sequence[str]

    async def present(
        self, authorization: Authorization, challenge: Challenge, key_authorization: str
    ) -> None:
        """Make ``key_authorization`` answer ``challenge`` for ``authorization.identifier``."""
        ...

    async def cleanup(self, authorization: Authorization, challenge: Challenge) -> None:
        """Remove what :meth:`present` published (called even when validation failed)."""
        ...


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate the CA issued: chain (leaf first) and its new key, both PEM."""

    names: tuple[str, ...]
    key_type: CertKeyType
    chain_pem: bytes
    key_pem: bytes = field(repr=False)
    order_url: str = ""
    certificate_url: str = ""

    @property
    def pem(self) -> bytes:
        """Chain then key in one PEM (HAProxy's and the directory store's layout)."""
        return self.chain_pem + self.key_pem


def pick_challenge(authz: Authorization, types: Sequence[str]) -> Challenge:
    """The first challenge of ``types`` the CA offers for ``authz``; AcmeError if none."""
    for type_ in types:
        challenge = authz.challenge(type_)
        if challenge is not None:
            return challenge
    offered = ", ".join(c.type for c in authz.challenges) or "none"
    raise AcmeError(
        f"the ACME CA offers {offered} for {authz.name}; this agent answers {', '.join(types)} only"
    )


async def authorize(
    client: AcmeClient, url: str, solver: ChallengeSolver, *, deadline: float
) -> Authorization:
    """Get the authorization at ``url`` to ``valid`` (a no-op if the CA reuses a valid one)."""
    authz = await client.authorization(url)
    if authz.status == "valid":
        return authz
    if authz.status != "pending":
        raise ChallengeFailed(authz.identifier, None, url=url, status=authz.status)
    challenge = pick_challenge(authz, solver.challenge_types)
    await solver.present(authz, challenge, client.key_authorization(challenge))
    try:
        if challenge.status == "pending":
            await client.answer_challenge(challenge)
        return await client.poll_authorization(url, deadline=deadline)
    finally:
        try:
            await solver.cleanup(authz, challenge)
        except AgentError as exc:
            log.warning(
                "could not remove the %s answer for %s: %s", challenge.type, authz.name, exc
            )


async def _authorize_all(
    client: AcmeClient, urls: Sequence[str], solver: ChallengeSolver, deadline: float
) -> None:
    tasks = [asyncio.create_task(authorize(client, u, solver, deadline=deadline)) for u in urls]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def obtain_certificate(
    client: AcmeClient,
    names: Sequence[str],
    solver: ChallengeSolver,
    *,
    key_type: CertKeyType = "ecdsa",
    profile: str | None = None,
    replaces: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> IssuedCertificate:
    """Order, validate, finalize and download one certificate for ``names``.

    A new ``key_type`` key is made for it ("both" key types: call this once per
    type).  Raises the errors of :mod:`certagent.acme.errors`:
    :class:`~certagent.acme.errors.ChallengeFailed` when the CA could not validate
    a name, :class:`~certagent.acme.errors.AcmeDeadline` past ``timeout`` seconds,
    :class:`~certagent.acme.errors.RateLimited`, ``CaUnavailable`` ...
    """
    wanted = order_names(names)
    deadline = client.deadline(timeout)
    order = await client.new_order(wanted, profile=profile, replaces=replaces)
    log.debug("ACME order %s for %s: %s", order.url, ", ".join(wanted), order.status)
    if order.status == "pending":
        await _authorize_all(client, order.authorizations, solver, deadline)
        order = await client.poll_order(order.url, deadline=deadline)
    if order.status != "ready":
        raise AcmeProtocolError(
            f"the ACME CA's new order {order.url} is {order.status}, not ready to finalize"
        )
    key = await asyncio.to_thread(new_key, key_type) if key_type == "rsa" else new_key(key_type)
    order = await client.finalize(order, make_csr(wanted, key))
    if order.status != "valid":
        order = await client.poll_order(order.url, deadline=deadline)
    if order.status != "valid" or order.certificate is None:
        raise AcmeProtocolError(f"the ACME CA's order {order.url} is valid but has no certificate")
    chain = await client.certificate(order.certificate)
    issued = IssuedCertificate(wanted, key_type, chain, key_pem(key), order.url, order.certificate)
    _check(issued)
    log.debug("ACME order %s: certificate for %s", order.url, ", ".join(wanted))
    return issued


def _check(issued: IssuedCertificate) -> None:
    """The chain's leaf holds our key and every name we asked for."""
    try:
        bundle = parse_bundle(issued.chain_pem, issued.key_pem, rsa_key_check="match")
    except CertificateError as exc:
        raise AcmeProtocolError(
            f"the certificate from {issued.certificate_url} does not fit our key: {exc}"
        ) from exc
    missing = set(issued.names) - set(bundle.names)
    if missing:
        raise AcmeProtocolError(
            f"the certificate from {issued.certificate_url} lacks {', '.join(sorted(missing))}"
        )
