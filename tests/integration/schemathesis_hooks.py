"""schemathesis hooks for tests/integration/test_api_schemathesis.py (loaded by file path).

The PEM media types the upload routes take are sent as text, like text/plain
(schemathesis knows no serializer for them).

One extra check, ``refusals_are_semantic``: a request generated to match the
OpenAPI document (positive mode) may be refused only for what it means -- not a
certificate, a certificate the policy refuses, an unknown id or cursor -- never
for how it is written.  schemathesis's own ``positive_data_acceptance`` can only
allow or forbid whole statuses (400 is both ``bad-pem`` and ``bad-request``);
this check looks at the problem's ``code``.
"""

from __future__ import annotations

from typing import Any

import schemathesis

from certagent.certs.validate import UPLOAD_CODES

schemathesis.serializer.alias(
    ["application/x-pem-file", "application/pem-certificate-chain"], "text/plain"
)

SEMANTIC: dict[int, frozenset[str]] = {
    400: frozenset({"bad-pem", "invalid-cursor"}),
    404: frozenset({"not-found"}),
    409: frozenset({"duplicate-certificate", "read-only-record", "renewal-off"}),
    413: frozenset({"too-large"}),
    422: frozenset({*UPLOAD_CODES, "bad-ocsp"}),
}


@schemathesis.check
def refusals_are_semantic(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 4xx for an allowed request must carry a code about its meaning."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if not 400 <= status < 500 or status in (401, 403):  # auth: ignored_auth's business
        return None
    try:
        code = response.json().get("code")
    except ValueError:
        code = None
    if code not in SEMANTIC.get(status, frozenset()):
        raise AssertionError(
            f"a request the OpenAPI document allows was refused with {status} {code}:"
            f" {response.text[:300]}"
        )
    return None
