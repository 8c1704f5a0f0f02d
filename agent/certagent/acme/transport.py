"""HTTP for the ACME client: one aiohttp session, and the one place its exceptions are mapped.

:class:`Transport` is what :class:`~certagent.acme.client.AcmeClient` needs from
HTTP (one request, one bounded response); :class:`AiohttpTransport` is the real
one, tests pass a scripted fake.  Every request has a timeout, never follows a
redirect, and reads at most :data:`~certagent.acme._doc.MAX_BODY` bytes.
Connection errors, TLS failures and timeouts become
:class:`~certagent.acme.errors.CaUnavailable` (``raise ... from exc``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from certagent.acme._doc import MAX_BODY
from certagent.acme.errors import AcmeProtocolError, CaUnavailable
from certagent.errors import ConfigError

log = logging.getLogger(__name__)


def _user_agent() -> str:
    """RFC 8555 §6.1: name and version of the client, e.g. ``certagent/0.1.0 aiohttp/3.14.5``."""
    try:
        ours = importlib.metadata.version("certagent")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        ours = "unknown"
    return f"certagent/{ours} aiohttp/{aiohttp.__version__}"


USER_AGENT = _user_agent()


@dataclass(frozen=True)
class HttpResponse:
    """Status, headers (names lowercased) and body of one response."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class Transport(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
    ) -> HttpResponse:
        """One request; CaUnavailable if the CA cannot be reached or does not answer in time."""
        ...

    async def close(self) -> None: ...


def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """Verify the CA's TLS certificate with the system store, or only ``ca_file`` if given."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot read the ACME CA trust bundle {ca_file}: {exc}") from exc


class AiohttpTransport:
    """The real transport: one :class:`aiohttp.ClientSession`, made on first use.

    ``ca_file``: a PEM bundle trusted instead of the system store (a private or test
    CA).  Proxies from the environment are not used (``trust_env=False``).
    """

    def __init__(
        self,
        *,
        ca_file: str | None = None,
        user_agent: str = USER_AGENT,
        max_body: int = MAX_BODY,
    ) -> None:
        self._ssl = ssl_context(ca_file)
        self._ca_file = ca_file
        self._user_agent = user_agent
        self._max_body = max_body
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl),
                headers={"User-Agent": self._user_agent},
                trust_env=False,
            )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
    ) -> HttpResponse:
        try:
            return await self._request(method, url, body, headers, timeout)
        except aiohttp.ServerDisconnectedError:
            # A kept-alive connection the CA closed while it sat in the pool (a restart,
            # an idle timeout): once more on a new connection.  A POST the CA did process
            # comes back as badNonce, since its nonce is spent.
            log.debug("ACME CA %s closed a kept-alive connection; sending again", url)
        try:
            return await self._request(method, url, body, headers, timeout)
        except aiohttp.ServerDisconnectedError as exc:
            raise CaUnavailable(
                f"the ACME CA at {url} closed the connection without answering; it is retried later"
            ) from exc

    async def _request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> HttpResponse:
        session = self._get_session()
        try:
            async with session.request(
                method,
                url,
                data=body,
                headers=dict(headers or {}),
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as response:
                data = await self._read(response, url)
                return HttpResponse(
                    response.status,
                    {k.lower(): v for k, v in response.headers.items()},
                    data,
                )
        except aiohttp.ClientConnectorCertificateError as exc:
            trust = self._ca_file or "the system trust store"
            raise CaUnavailable(
                f"the ACME CA at {url} presented a certificate {trust} does not trust"
                f" ({exc.certificate_error}); check the directory URL and the CA file setting"
            ) from exc
        except TimeoutError as exc:
            raise CaUnavailable(
                f"the ACME CA at {url} did not answer within {timeout:g} s; it is retried later"
            ) from exc
        except aiohttp.ServerDisconnectedError:
            raise
        except (aiohttp.ClientError, OSError) as exc:
            raise CaUnavailable(
                f"cannot reach the ACME CA at {url}: {exc or type(exc).__name__};"
                " it is retried later"
            ) from exc

    async def _read(self, response: aiohttp.ClientResponse, url: str) -> bytes:
        length = response.content_length
        if length is not None and length > self._max_body:
            raise AcmeProtocolError(
                f"the ACME CA's answer from {url} is {length} bytes, more than {self._max_body}"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(65536):
            size += len(chunk)
            if size > self._max_body:
                raise AcmeProtocolError(
                    f"the ACME CA's answer from {url} is larger than {self._max_body} bytes"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
