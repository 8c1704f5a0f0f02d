"""The REST upload API: ``/v1/certificates``, ``/v1/loaded``, ``/healthz``, ``/readyz``.

:func:`start_api` serves it next to the agent; docs/api.md describes it and
``certagent/api/openapi.json`` (served at ``/v1/openapi.json``) specifies it.
"""

from __future__ import annotations

from .app import ApiServer, make_app, openapi_document, start_api
from .auth import TokenFile, add_token
from .body import upload_policy
from .loaded import LoadedSlot, loaded_slots
from .problems import AlreadyStored, Problem, problem_for

__all__ = [
    "AlreadyStored",
    "ApiServer",
    "LoadedSlot",
    "Problem",
    "TokenFile",
    "add_token",
    "loaded_slots",
    "make_app",
    "openapi_document",
    "problem_for",
    "start_api",
    "upload_policy",
]
