"""Reading an upload (chain + key) from a request, and the upload policy from the settings.

Three body formats, all validated the same way afterwards:

* ``application/json``: ``{"chain": "<PEM>", "key": "<PEM>"}``; ``key`` may be
  left out (or null) when ``chain`` is a combined PEM holding the key;
* ``multipart/form-data`` (or ``application/x-www-form-urlencoded``): fields or
  files named ``chain`` and ``key`` (``curl -F chain=@fullchain.pem -F key=@privkey.pem``);
* ``application/x-pem-file``, ``application/pem-certificate-chain`` or
  ``text/plain``: one combined PEM (``curl --data-binary @combined.pem``).

The body size is checked from ``Content-Length`` before anything is read, and
aiohttp's ``client_max_size`` bounds bodies sent without one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from aiohttp import web

from agent.config import Settings
from agent.errors import BundleTooLarge
from agent.validate import UploadPolicy

from .problems import BadRequest, UnsupportedMediaType

__all__ = ["PEM_TYPES", "Upload", "http_body_limit", "read_upload", "upload_policy"]

PEM_TYPES = frozenset({"application/x-pem-file", "application/pem-certificate-chain", "text/plain"})
_FIELDS = ("chain", "key")
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


@dataclass(frozen=True)
class Upload:
    chain: bytes = b""
    key: bytes | None = None  # None: the key is inside ``chain``


def upload_policy(settings: Settings) -> UploadPolicy:
    """The :class:`UploadPolicy` the settings describe (the API and the CLI use the same)."""
    return UploadPolicy(
        max_bytes=settings.max_upload_bytes,
        max_chain=settings.max_chain,
        min_rsa_bits=settings.min_rsa_bits,
        not_before_grace=timedelta(seconds=settings.not_before_grace),
        expiry_grace=timedelta(seconds=settings.expiry_grace),
    )


def http_body_limit(max_bytes: int) -> int:
    """The largest HTTP body taken for a ``max_bytes`` upload.

    JSON escaping (``\\n`` for every 64-character line: about 3 %) and multipart
    framing make the body larger than the PEM inside it; the PEM itself is then
    held to ``max_bytes`` by :func:`~agent.validate.validate_upload`.
    """
    return max_bytes + max_bytes // 8 + 16 * 1024


async def read_upload(request: web.Request, limit: int) -> Upload:
    """The chain and key of ``request``'s body; at most ``limit`` bytes are read."""
    size = request.content_length
    if size is not None and size > limit:
        raise BundleTooLarge(
            f"the request body is {size} bytes; the limit is {limit} (max_upload_bytes plus"
            " encoding overhead): send only the leaf certificate, its intermediates and its key"
        )
    ctype = request.content_type
    try:
        if ctype == "application/json":
            return _from_json(await request.read())
        if ctype in _FORM_TYPES:
            return await _from_form(request)
        if ctype in PEM_TYPES:
            return Upload(await request.read(), None)
    except web.HTTPRequestEntityTooLarge as exc:
        raise BundleTooLarge(
            f"the request body is over {limit} bytes (max_upload_bytes plus encoding"
            " overhead): send only the leaf certificate, its intermediates and its key"
        ) from exc
    raise UnsupportedMediaType(
        f"cannot read a {ctype[:80]} body: send application/json"
        ' ({"chain": "<PEM>", "key": "<PEM>"}), multipart/form-data (fields chain and key)'
        " or one combined PEM as application/x-pem-file"
    )


def _from_json(body: bytes) -> Upload:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {_json_error(exc)}") from exc
    if not isinstance(data, dict):
        raise BadRequest('the JSON body must be an object: {"chain": "<PEM>", "key": "<PEM>"}')
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise BadRequest(
            f"unknown field {', '.join(repr(k[:40]) for k in unknown[:5])};"
            ' the body takes "chain" (PEM certificates) and "key" (PEM private key)'
        )
    chain, key = data.get("chain"), data.get("key")
    if not isinstance(chain, str) or not chain.strip():
        raise BadRequest('"chain" must be a string holding the PEM certificate chain')
    if key is not None and not isinstance(key, str):
        raise BadRequest('"key" must be a string holding the PEM private key, or absent')
    return Upload(chain.encode("utf-8"), None if key is None else key.encode("utf-8"))


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "not UTF-8"


async def _from_form(request: web.Request) -> Upload:
    try:
        form = await request.post()
    except ValueError as exc:  # malformed multipart (aiohttp raises ValueError subclasses)
        raise BadRequest(f"the multipart body cannot be parsed: {str(exc)[:200]}") from exc
    unknown = sorted(set(form) - set(_FIELDS))
    if any(name.lstrip().startswith("-----BEGIN") for name in unknown):
        # curl --data-binary @file.pem sends a PEM as application/x-www-form-urlencoded
        raise UnsupportedMediaType(
            "the body is a PEM file sent as a form: send it with"
            " Content-Type: application/x-pem-file"
        )
    if unknown:
        raise BadRequest(
            f"unknown form field {', '.join(repr(k[:40]) for k in unknown[:5])};"
            " send fields (or files) named chain and key"
        )
    parts: dict[str, bytes] = {}
    for name in _FIELDS:
        values = form.getall(name, [])
        if len(values) > 1:
            raise BadRequest(f"the form has {len(values)} {name!r} fields; send one")
        if not values:
            continue
        value = values[0]
        if isinstance(value, web.FileField):
            parts[name] = value.file.read()
        elif isinstance(value, str):
            parts[name] = value.encode("utf-8")
        else:
            parts[name] = bytes(value)
    if not parts.get("chain", b"").strip():
        raise BadRequest("the form has no chain field (or file): send the PEM certificate chain")
    return Upload(parts["chain"], parts.get("key"))
