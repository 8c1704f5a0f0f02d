"""Reading an upload (chain + key) from a request, and the upload policy from the settings.

Three body formats, all validated the same way afterwards:

* ``application/json``: ``{"chain": "<PEM>", "key": "<PEM>"}``; ``key`` may be
  left out (or null) when ``chain`` is a combined PEM holding the key;
* ``multipart/form-data`` (or ``application/x-www-form-urlencoded``): fields or
  files named ``chain`` and ``key`` (``curl -F chain=@fullchain.pem -F key=@privkey.pem``);
* ``application/x-pem-file``, ``application/pem-certificate-chain`` or
  ``text/plain``: one combined PEM (``curl --data-binary @combined.pem``).

The body size is checked from ``Content-Length`` before anything is read, and
aiohttp's ``client_max_size`` bounds bodies sent without one.  What aiohttp
raises while it reads or parses a body the client got wrong (broken chunked
framing or Content-Encoding, malformed multipart, an unknown charset, a
connection closed halfway) becomes :class:`BadRequest` here, at the boundary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from certagent.certs.ocsp import MAX_BYTES as MAX_OCSP
from certagent.certs.validate import UploadPolicy
from certagent.config import Settings
from certagent.errors import BundleTooLarge

from .problems import BadRequest, UnsupportedMediaType

__all__ = [
    "NOT_BLANK",
    "PEM_TYPES",
    "Upload",
    "http_body_limit",
    "read_upload",
    "upload_policy",
]

PEM_TYPES = frozenset({"application/x-pem-file", "application/pem-certificate-chain", "text/plain"})
_FIELDS = ("chain", "key")
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
#: A chain (or a combined PEM) must hold something besides ASCII whitespace; the
#: OpenAPI document's ``pattern`` for it is this regex too (ECMA 262 reads it alike).
NOT_BLANK = "[^ \\t\\n\\r\\f\\v]"
_NOT_BLANK = re.compile(NOT_BLANK)
_TOO_LARGE = (
    "(max_upload_bytes plus encoding overhead): send only the leaf certificate,"
    " its intermediates and its key"
)


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
    held to ``max_bytes`` by :func:`~certagent.certs.validate.validate_upload`.
    """
    return max_bytes + max_bytes // 8 + 16 * 1024


async def read_upload(request: web.Request, limit: int) -> Upload:
    """The chain and key of ``request``'s body; at most ``limit`` bytes are read."""
    size = request.content_length
    if size is not None and size > limit:
        raise BundleTooLarge(f"the request body is {size} bytes; the limit is {limit} {_TOO_LARGE}")
    ctype = request.content_type
    with _reading(limit):
        if ctype == "application/json":
            return _from_json(await request.read())
        if ctype in _FORM_TYPES:
            return await _from_form(request)
        if ctype in PEM_TYPES:  # an empty one is refused by validation: bad-pem
            return Upload(await request.read(), None)
    raise UnsupportedMediaType(
        f"cannot read a {ctype[:80]} body: send application/json"
        ' ({"chain": "<PEM>", "key": "<PEM>"}), multipart/form-data (fields chain and key)'
        " or one combined PEM as application/x-pem-file"
    )


#: OCSP responses: DER, as RFC 6960 names the media type (octet-stream also taken).
OCSP_TYPES = frozenset({"application/ocsp-response", "application/octet-stream"})


async def read_ocsp(request: web.Request) -> bytes:
    """A DER OCSP response body; at most :data:`certagent.certs.ocsp.MAX_BYTES`."""
    size = request.content_length
    if size is not None and size > MAX_OCSP:
        raise BundleTooLarge(
            f"the request body is {size} bytes; an OCSP response is at most {MAX_OCSP}"
        )
    if request.content_type not in OCSP_TYPES:
        raise UnsupportedMediaType(
            f"cannot read a {request.content_type[:80]} body: send the DER OCSP response as"
            " application/ocsp-response"
        )
    with _reading(MAX_OCSP):
        body = await request.content.read(MAX_OCSP + 1)
    if len(body) > MAX_OCSP:
        raise BundleTooLarge(f"the request body is over {MAX_OCSP} bytes: not an OCSP response")
    return body


@contextmanager
def _reading(limit: int) -> Iterator[None]:
    """aiohttp's errors while the body is read, as certagent's."""
    try:
        yield
    except web.HTTPRequestEntityTooLarge as exc:
        raise BundleTooLarge(f"the request body is over {limit} bytes {_TOO_LARGE}") from exc
    except (RequestPayloadError, HttpProcessingError) as exc:
        raise BadRequest(
            "the request body cannot be read: its chunked framing or its Content-Encoding is broken"
        ) from exc
    except ConnectionResetError as exc:  # aiohttp's "Connection lost" while reading
        raise BadRequest("the connection closed before the whole body arrived") from exc


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
    if not isinstance(chain, str) or not _NOT_BLANK.search(chain):
        raise BadRequest('"chain" must be a string holding the PEM certificate chain')
    if key is not None and not isinstance(key, str):
        raise BadRequest('"key" must be a string holding the PEM private key, or absent')
    try:
        return Upload(chain.encode("utf-8"), None if key is None else key.encode("utf-8"))
    except UnicodeEncodeError as exc:  # "\ud800": a lone surrogate is not text
        raise BadRequest("the JSON body holds a string that is not valid Unicode") from exc


def _json_error(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return "not UTF-8"


async def _from_form(request: web.Request) -> Upload:
    try:
        form = await request.post()
    except (ValueError, LookupError, RuntimeError, HttpProcessingError) as exc:
        # What aiohttp's form and multipart readers raise for a body the client got
        # wrong: ValueError (boundaries, part framing, undecodable text: UnicodeDecodeError,
        # binascii.Error), LookupError (an unknown charset), RuntimeError (an unknown
        # Content-Transfer-Encoding), HttpProcessingError (a malformed part header).
        raise BadRequest(f"the form body cannot be parsed: {_form_reason(exc)}") from exc
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
    if not _NOT_BLANK.search(parts.get("chain", b"").decode("latin-1")):
        raise BadRequest("the form has no chain field (or file): send the PEM certificate chain")
    return Upload(parts["chain"], parts.get("key"))


def _form_reason(exc: Exception) -> str:
    """What is wrong with a form body, without quoting the body (it may hold a key)."""
    if isinstance(exc, UnicodeError):
        return "a field is not valid text in its charset"
    if isinstance(exc, LookupError):
        return "a part names an unknown charset"
    if isinstance(exc, HttpProcessingError):
        return "a part's headers are malformed"
    if isinstance(exc, RuntimeError):
        return "a part has an unknown Content-Transfer-Encoding"
    text = str(exc)
    if any(quote in text for quote in ("b'", 'b"', "bytearray(")):
        return "check the boundary and each part's headers"
    return text[:200]
