"""The OpenAPI document: FastAPI's, with problem responses typed as `application/problem+json`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from bullpen.api.problems import MEDIA_TYPE

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}

DESCRIPTION = """\
Bullpen's HTTP API. Authenticate with an API key (`Authorization: Bearer bp_…`) or, from the
web UI, the session cookie; cookie-authenticated writes also need the session's CSRF token in
`X-CSRF-Token`. Every caller acts in one workspace; another workspace's objects are 404.
Every error is RFC 9457 problem+json with a stable `type`. POSTs that create accept an
`Idempotency-Key`. Each operation's `x-bullpen-access` names the permission it needs.
"""


def install(app: FastAPI) -> None:
    """Serve the document built by `build` (once, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build(app: FastAPI) -> dict[str, Any]:
    """Generate the document and give every 4xx/5xx response the problem media type."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=DESCRIPTION,
        routes=app.routes,
    )
    for path in doc.get("paths", {}).values():
        for operation in path.values():
            for status, response in operation.get("responses", {}).items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = {MEDIA_TYPE: {"schema": _PROBLEM_REF}}
    return doc
