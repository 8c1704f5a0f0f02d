"""GET /v1/domains: the page size the OpenAPI document allows is the one the API accepts."""

from __future__ import annotations

from certagent.api.query import MAX_LIMIT
from tests.apihelp import openapi


def test_the_domains_page_size_is_documented_as_the_api_checks_it() -> None:
    """The API refuses limit 0 or 501 (api/domains.py): the document says the same.

    Schemathesis found ``limit=0`` refused though the document allowed it, once the
    stores had issuance roles and the route stopped answering "not available".
    """
    params = openapi()["paths"]["/v1/domains"]["get"]["parameters"]
    [limit] = [p["schema"] for p in params if p["name"] == "limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, MAX_LIMIT)
