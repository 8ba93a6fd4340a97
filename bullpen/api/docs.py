"""OpenAPI pieces shared by the routes: problem responses and links."""

from __future__ import annotations

from typing import Any

from fastapi import Path

from bullpen.api.schemas.common import Problem

_DESCRIPTIONS = {
    400: "Malformed header or parameter (e.g. an invalid `Idempotency-Key`)",
    401: "Missing, unknown, expired or revoked credentials",
    403: "Authenticated, but the role or the key's scopes do not allow this",
    404: "No such object in the caller's workspace",
    409: "The object's state does not allow this, or the same `Idempotency-Key` is in flight",
    413: "Request body over the limit",
    415: "Body is not `application/json`",
    422: "A field is invalid (see `errors`), or an `Idempotency-Key` reused with another body",
    429: "Rate limited; retry after `Retry-After` seconds",
    502: "An outside server (an MCP server) could not be reached or answered wrongly",
    503: "The database is unreachable; retry after `Retry-After` seconds",
}

_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "integer"}}
}

READ = (401, 403, 404, 422, 429, 503)
WRITE = (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these problem statuses."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {
            "model": Problem,
            "description": _DESCRIPTIONS[code],
            "content": {"application/problem+json": {}},
        }
        if code in (409, 429, 503):
            entry["headers"] = _RETRY_AFTER
        out[code] = entry
    return out


def created(
    model: type[Any], description: str, links: dict[str, dict[str, Any]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """The 201 response of a create, with OpenAPI links to what can be done next."""
    entry: dict[str, Any] = {
        "model": model,
        "description": description,
        "headers": {
            "Location": {"description": "URL of the new object", "schema": {"type": "string"}},
            "Idempotent-Replayed": {
                "description": "`true` when this is a stored response to a repeated key",
                "schema": {"type": "string", "enum": ["true"]},
            },
        },
    }
    if links:
        entry["links"] = links
    return {201: entry}


def link(operation_id: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to `operation_id`, filling parameters from the response body."""
    return {"operationId": operation_id, "parameters": parameters}


def path_id(noun: str) -> Any:
    """The `{…_id}` path parameter of a `noun`."""
    return Path(description=f"The {noun}'s id (another workspace's is 404)")


EVENT_STREAM = {
    "description": "Server-sent events",
    "content": {
        "text/event-stream": {
            "schema": {
                "description": "One server-sent event (`data` is JSON; markers have no `id`)",
                "type": "object",
                "properties": {
                    "event": {"type": "string"},
                    "data": {"type": "string"},
                    "id": {"type": "string"},
                },
                "required": ["event", "data"],
            }
        }
    },
}
"""The 200 of an SSE route, as schemathesis checks each event against it."""
