"""A small client for the REST API, as ``certagent cert --api URL`` uses it.

Answers are the API's JSON; a problem answer raises :class:`ApiProblem`
(status and ``code`` kept), a connection failure :class:`ApiUnreachable`.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp

from certagent.errors import AgentError

__all__ = ["ApiBackend", "ApiProblem", "ApiUnreachable"]

Record = dict[str, Any]


class ApiProblem(AgentError):
    """The REST API answered with a problem (RFC 9457)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{detail} ({status} {code})")
        self.status = status
        self.code = code


class ApiUnreachable(AgentError):
    """The REST API cannot be reached."""


@dataclass
class ApiBackend:
    url: str
    #: "" when a client certificate stands for the token (mutual TLS)
    token: str
    timeout: float = 30.0
    #: for https URLs: the CA to trust and the client certificate to present
    tls: ssl.SSLContext | None = None
    _session: aiohttp.ClientSession | None = field(default=None, init=False)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.token}"} if self.token else {},
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=self.tls if self.tls is not None else True),
            )
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: object = None,
        params: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        url = self.url.rstrip("/") + path
        try:
            async with self._client().request(
                method, url, json=json_body, params=params, data=data, headers=headers
            ) as resp:
                if resp.status == 204:
                    return None
                text = await resp.text()
                if resp.status < 400:
                    return json.loads(text)
                raise _problem(resp.status, resp.content_type, text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ApiUnreachable(f"REST API at {self.url}: {type(exc).__name__}: {exc}") from exc

    async def add(self, chain: bytes, key: bytes | None) -> Record:
        result: Record = await self._call(
            "POST", "/v1/certificates", json_body=_upload_json(chain, key)
        )
        return result

    async def replace(self, cert_id: str, chain: bytes, key: bytes | None) -> Record:
        result: Record = await self._call(
            "PUT", f"/v1/certificates/{_quote(cert_id)}", json_body=_upload_json(chain, key)
        )
        return result

    async def get(self, cert_id: str) -> Record:
        result: Record = await self._call("GET", f"/v1/certificates/{_quote(cert_id)}")
        return result

    async def page(
        self,
        name: str | None,
        expiring_before: datetime | None,
        cursor: str | None,
        limit: int = 500,
    ) -> tuple[list[Record], str | None]:
        params = {"limit": str(limit)}
        if name:
            params["name"] = name
        if expiring_before:
            params["expiring_before"] = expiring_before.astimezone(UTC).isoformat()
        if cursor:
            params["cursor"] = cursor
        body = await self._call("GET", "/v1/certificates", params=params)
        return list(body["items"]), body["next_cursor"]

    async def delete(self, cert_id: str) -> None:
        await self._call("DELETE", f"/v1/certificates/{_quote(cert_id)}")

    async def put_ocsp(self, cert_id: str, der: bytes) -> Record:
        result: Record = await self._call(
            "PUT",
            f"/v1/certificates/{_quote(cert_id)}/ocsp",
            data=der,
            headers={"Content-Type": "application/ocsp-response"},
        )
        return result

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _upload_json(chain: bytes, key: bytes | None) -> dict[str, str]:
    # Surrogate escapes keep any byte through JSON; the server's PEM parser refuses them.
    body = {"chain": chain.decode("utf-8", "surrogateescape")}
    if key is not None:
        body["key"] = key.decode("utf-8", "surrogateescape")
    return body


def _quote(cert_id: str) -> str:
    return quote(cert_id, safe="")  # directory store ids hold slashes: live/NAME/fullchain.pem


def _problem(status: int, content_type: str, text: str) -> ApiProblem:
    if content_type in ("application/problem+json", "application/json"):
        try:
            body = json.loads(text)
            return ApiProblem(status, str(body.get("code", "")), str(body.get("detail", "")))
        except (ValueError, AttributeError):
            pass
    return ApiProblem(status, "http-error", text[:200] or f"HTTP {status}")
