"""The asynchronous ACME client (RFC 8555, with RFC 9773 renewal information).

One :class:`AcmeClient` per CA directory and account key, shared by every issuance
of the process.  How it talks (nonces, ``badNonce``, errors, timeouts) is
:class:`~certagent.acme._connection.AcmeConnection`; this module says what to ask:
accounts, orders, authorizations, challenges, finalization, the certificate,
renewal information and revocation.  Polling starts 0.1 s after the first look,
backs off to 2 s, honours ``Retry-After`` and stops at a deadline.

Cost: one HTTP request per call (plus a HEAD for a nonce when the pool is empty);
a poll adds one request per 0.1 .. 2 s while the CA works.  Nothing grows with
the number of certificates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from certagent.acme._connection import AcmeConnection
from certagent.acme.ari import RenewalInfo, cert_id, parse_renewal_info
from certagent.acme.challenges import key_authorization
from certagent.acme.csr import order_names
from certagent.acme.errors import (
    AcmeDeadline,
    AcmeError,
    AcmeProtocolError,
    ChallengeFailed,
    ExternalAccountRequired,
    OrderFailed,
    ProfileNotOffered,
)
from certagent.acme.jws import ExternalAccountBinding, b64url, eab_jws
from certagent.acme.messages import (
    parse_account,
    parse_authorization,
    parse_challenge,
    parse_order,
)
from certagent.acme.resources import (
    PROBLEM_PREFIX,
    Account,
    Authorization,
    Challenge,
    Order,
    Problem,
)
from certagent.acme.timing import parse_retry_after, poll_delays
from certagent.acme.transport import HttpResponse
from certagent.certs.pem import split_blocks
from certagent.errors import PemError

log = logging.getLogger(__name__)

PEM_CHAIN = "application/pem-certificate-chain"


class AcmeClient(AcmeConnection):
    """Talks to one ACME CA with one account key (constructor: :class:`AcmeConnection`).

    Use as ``async with AcmeClient(url, key, ca_file=...) as client:`` or call
    :meth:`close`.  Safe to share between concurrent tasks of one event loop.
    """

    async def __aenter__(self) -> AcmeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- account -----------------------------------------------------------------------

    async def register(
        self,
        *,
        contact: Sequence[str] = (),
        terms_agreed: bool = False,
        eab: ExternalAccountBinding | None = None,
    ) -> Account:
        """newAccount: create the account of this key, or get it if the CA knows the key.

        ``contact``: addresses (``a@example.com`` or ``mailto:a@example.com``).  Raises
        :class:`ExternalAccountRequired` before sending anything when the directory
        says EAB is required and ``eab`` is None.
        """
        directory = await self.directory()
        url = directory.new_account
        if directory.meta.external_account_required and eab is None:
            raise ExternalAccountRequired(
                Problem(
                    PROBLEM_PREFIX + "externalAccountRequired",
                    "the directory says meta.externalAccountRequired",
                ),
                url,
            )
        payload: dict[str, Any] = {"termsOfServiceAgreed": terms_agreed}
        if contact:
            payload["contact"] = [c if c.startswith("mailto:") else f"mailto:{c}" for c in contact]
        if eab is not None:
            payload["externalAccountBinding"] = eab_jws(eab, self.account_key.jwk, url)
        return await self._account(url, payload)

    async def find_account(self) -> Account:
        """newAccount with ``onlyReturnExisting``; AccountDoesNotExist if the CA has none."""
        url = (await self.directory()).new_account
        return await self._account(url, {"onlyReturnExisting": True})

    async def _account(self, url: str, payload: dict[str, Any]) -> Account:
        response = await self._post(url, payload, jwk=True)
        location = self._location(response, "newAccount")
        created = response.status == 201
        account = parse_account(
            response.body, location, created=created, https_only=self._https_only
        )
        self.account_url = location
        log.info("ACME account %s: %s", "registered" if created else "found", location)
        return account

    # --- orders ------------------------------------------------------------------------

    async def new_order(
        self,
        names: Sequence[str],
        *,
        profile: str | None = None,
        replaces: str | None = None,
    ) -> Order:
        """newOrder for ``names`` (validated hostnames, ``*.`` allowed).

        ``profile`` must be one the directory lists in ``meta.profiles``
        (:class:`ProfileNotOffered` otherwise, before anything is sent).
        ``replaces`` (an ARI certificate id) is sent only to a CA whose directory
        offers ``renewalInfo``, as RFC 9773 §5 asks.
        """
        identifiers = [{"type": "dns", "value": name} for name in order_names(names)]
        directory = await self.directory()
        payload: dict[str, Any] = {"identifiers": identifiers}
        if profile is not None:
            if profile not in directory.meta.profile_names:
                raise ProfileNotOffered(profile, directory.meta.profile_names, directory.url)
            payload["profile"] = profile
        if replaces is not None and directory.renewal_info is not None:
            payload["replaces"] = replaces
        response = await self._post(directory.new_order, payload)
        location = self._location(response, "newOrder")
        return parse_order(response.body, location, https_only=self._https_only)

    async def order(self, url: str) -> Order:
        return (await self._fetch(url, parse_order))[0]

    async def authorization(self, url: str) -> Authorization:
        return (await self._fetch(url, parse_authorization))[0]

    def key_authorization(self, challenge: Challenge) -> str:
        """``token.thumbprint`` for ``challenge`` (its token validated)."""
        if challenge.token is None:
            raise AcmeProtocolError(f"the CA's {challenge.type} challenge has no token")
        return key_authorization(challenge.token, self.account_key)

    async def answer_challenge(self, challenge: Challenge) -> Challenge:
        """Tell the CA to validate now: POST ``{}`` (an empty object, not POST-as-GET)."""
        response = await self._post(challenge.url, {})
        return parse_challenge(response.body, challenge.url, https_only=self._https_only)

    async def _wait(self, delay: float, response: HttpResponse, deadline: float) -> bool:
        """Sleep before the next poll (Retry-After if the CA sent one); False past the deadline."""
        now = self._clock.monotonic()
        if now >= deadline:
            return False
        retry_after = parse_retry_after(response.header("Retry-After"), self._clock.time())
        wait = retry_after if retry_after is not None else delay
        await self._clock.sleep(min(wait, deadline - now))
        return True

    async def poll_authorization(self, url: str, *, deadline: float) -> Authorization:
        """Fetch the authorization until it is no longer ``pending``.

        Returns it when ``valid``; raises :class:`ChallengeFailed` (with the CA's
        error) for ``invalid`` and the other final states, :class:`AcmeDeadline`
        when still pending at ``deadline`` (see :meth:`deadline`).
        """
        started = self._clock.monotonic()
        for delay in poll_delays():
            authz, response = await self._fetch(url, parse_authorization, deadline=deadline)
            if authz.status != "pending":
                break
            if not await self._wait(delay, response, deadline):
                raise AcmeDeadline(
                    "authorization", url, authz.status, self._clock.monotonic() - started
                )
        if authz.status == "valid":
            return authz
        failed = next((c for c in authz.challenges if c.status == "invalid"), None)
        failed = failed or next((c for c in authz.challenges if c.error is not None), None)
        raise ChallengeFailed(
            authz.identifier,
            failed.type if failed else None,
            url=url,
            status=authz.status,
            problem=failed.error if failed else None,
        )

    async def poll_order(self, url: str, *, deadline: float) -> Order:
        """Fetch the order while it is ``pending`` or ``processing``.

        Returns it when ``ready`` or ``valid``; :class:`OrderFailed` for ``invalid``,
        :class:`AcmeDeadline` at ``deadline``.
        """
        started = self._clock.monotonic()
        for delay in poll_delays():
            order, response = await self._fetch(url, parse_order, deadline=deadline)
            if order.status not in ("pending", "processing"):
                break
            if not await self._wait(delay, response, deadline):
                raise AcmeDeadline("order", url, order.status, self._clock.monotonic() - started)
        if order.status == "invalid":
            said = order.error.describe() if order.error else "no error given"
            raise OrderFailed(
                f"the ACME CA marked the order {url} invalid: {said}", url=url, problem=order.error
            )
        return order

    async def finalize(self, order: Order, csr_der: bytes) -> Order:
        """Send the CSR to the order's finalize URL; the order comes back processing or valid."""
        response = await self._post(order.finalize, {"csr": b64url(csr_der)})
        return parse_order(response.body, order.url, https_only=self._https_only)

    async def certificate(self, url: str) -> bytes:
        """Download the certificate chain (PEM, the CA's default chain), leaf first."""
        response = await self._post(url, None, accept=PEM_CHAIN)
        try:
            blocks = split_blocks(response.body)
        except PemError as exc:
            raise AcmeProtocolError(f"the certificate at {url} is not valid PEM: {exc}") from exc
        if not blocks or any(label != "CERTIFICATE" for label, _ in blocks):
            raise AcmeProtocolError(f"the answer from {url} is not a PEM certificate chain")
        for _, text in blocks:
            try:
                x509.load_pem_x509_certificate(text)
            except ValueError as exc:
                raise AcmeProtocolError(f"the chain from {url} holds a bad certificate") from exc
        return b"".join(text for _, text in blocks)

    # --- ARI and revocation ------------------------------------------------------------

    async def renewal_info(self, cert: x509.Certificate | str) -> RenewalInfo | None:
        """The CA's suggested renewal window for ``cert`` (or its ARI id), None without ARI.

        An unauthenticated GET of ``renewalInfo/<id>`` (RFC 9773 §4.1).
        """
        base = (await self.directory()).renewal_info
        if base is None:
            return None
        ident = cert if isinstance(cert, str) else cert_id(cert)
        url = f"{base.rstrip('/')}/{ident}"
        response = await self._send("GET", url, headers={"Accept": "application/json"})
        if response.status != 200:
            raise self._error(response, url)
        retry_after = parse_retry_after(response.header("Retry-After"), self._clock.time())
        return parse_renewal_info(response.body, url, retry_after=retry_after)

    async def revoke(self, cert: x509.Certificate, reason: int | None = None) -> None:
        """revokeCert signed by the account (RFC 8555 §7.6); ``reason`` an RFC 5280 code."""
        directory = await self.directory()
        if directory.revoke_cert is None:
            raise AcmeError(f"the ACME CA at {self.directory_url} offers no revokeCert")
        payload: dict[str, Any] = {
            "certificate": b64url(cert.public_bytes(serialization.Encoding.DER))
        }
        if reason is not None:
            payload["reason"] = reason
        await self._post(directory.revoke_cert, payload)
