"""Every error as RFC 9457 problem+json with a stable `type`; the one place errors meet HTTP."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match

from bullpen.api.deps import audit_denial
from bullpen.errors import BudgetExceeded, BullpenError

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://bullpen.dev/problems/"
MEDIA_TYPE = "application/problem+json"
RELAY_PREFIX = "/v1/"
Handler = Callable[[Request, Exception], Awaitable[Response]]

_HTTP_SLUGS = {
    400: ("bad-request", "Bad request"),
    401: ("unauthenticated", "Authentication required"),
    403: ("forbidden", "Forbidden"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    406: ("not-acceptable", "Not acceptable"),
    413: ("payload-too-large", "Payload too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    422: ("validation", "Invalid request"),
    429: ("rate-limited", "Too many requests"),
    503: ("unavailable", "Service unavailable"),
}


def problem(
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    openai: tuple[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
) -> Response:
    """A problem+json response (on the relay with OpenAI's `error` member too: its `type` and
    `code` are the slug unless `openai` gives them); `extensions` are further members."""
    body: dict[str, Any] = {
        **(extensions or {}),
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if errors is not None:
        body["errors"] = errors
    if instance is not None and instance.startswith(RELAY_PREFIX):
        # OpenAI clients read `error.message`; the problem members stay the contract.
        kind, code = openai or (slug, slug)
        body["error"] = {"message": detail, "type": kind, "code": code, "param": None}
    return Response(orjson.dumps(body), status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _retry_headers(retry_after: float | None) -> dict[str, str] | None:
    return {"Retry-After": str(max(1, round(retry_after)))} if retry_after is not None else None


def from_error(
    exc: BullpenError, instance: str, extensions: dict[str, Any] | None = None
) -> Response:
    """The problem+json response for one of Bullpen's errors (`extensions`: more members)."""
    headers = _retry_headers(exc.retry_after) or {}
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, BudgetExceeded):
        # Asking again will not help until someone raises the budget: OpenAI's SDKs obey this
        # header rather than retrying a 429.
        headers["x-should-retry"] = "false"
    return problem(
        exc.status,
        exc.slug,
        exc.title,
        exc.detail,
        instance=instance,
        errors=exc.errors,
        headers=headers or None,
        openai=exc.openai_error,
        extensions=extensions,
    )


async def _bullpen_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BullpenError)
    if exc.status >= 500:
        log.warning("%s %s -> %s: %s", request.method, request.url.path, exc.status, exc.detail)
    if exc.status == 403:
        try:
            await audit_denial(request, exc.detail)
        except BullpenError as err:  # the refusal stands even if it could not be recorded
            log.warning("could not audit a refusal: %s", err.detail)
    return from_error(exc, request.url.path)


def _field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        out.append(
            {
                "location": loc[0] if loc else "body",
                "field": ".".join(loc[1:]) or None,
                "message": err.get("msg", "invalid"),
                "code": err.get("type", "invalid"),
            }
        )
    return out


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return problem(
        422,
        "validation",
        "Invalid request",
        "One or more fields are invalid; see `errors`.",
        instance=request.url.path,
        errors=_field_errors(exc),
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    slug, title = _HTTP_SLUGS.get(exc.status_code, ("http-error", "HTTP error"))
    detail = exc.detail if isinstance(exc.detail, str) else title
    if exc.status_code == 404 and detail == "Not Found":
        detail = "No such route."
    headers = dict(exc.headers) if exc.headers else {}
    if exc.status_code == 405:
        detail = f"{request.method} is not allowed on this route."
        headers["Allow"] = ", ".join(_allowed_methods(request))
    return problem(
        exc.status_code, slug, title, detail, instance=request.url.path, headers=headers or None
    )


def _flat(routes: list[BaseRoute]) -> list[BaseRoute]:
    """Routes with included routers opened up (FastAPI keeps those as one route each)."""
    out: list[BaseRoute] = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out.extend(_flat(inner.routes) if inner is not None else [route])
    return out


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette reports only the first route).

    A path some route names literally (`/agents/tree`) is that route's only, not also a value
    of another route's parameter (`/agents/{agent_id}`).
    """
    serving: list[tuple[str, bool]] = []  # (method, whether the route names the path literally)
    routes = _flat(request.app.router.routes)
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        for route in routes:
            match, child = route.matches({**request.scope, "method": method, "path_params": {}})
            if match is Match.FULL:
                serving.append((method, not child.get("path_params")))
    literal = [method for method, named in serving if named]
    allowed = set(literal or [method for method, _ in serving])
    if "GET" in allowed:
        allowed.add("HEAD")
    return sorted(allowed)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem(
        500,
        "internal",
        "Internal error",
        "Something went wrong on our side; it has been logged.",
        instance=request.url.path,
    )


class Replayed(Exception):
    """A stored outcome that answers in place of the handler's own: an `Idempotency-Key`'s
    replay (`IdempotentWrite.begin`)."""

    def __init__(self, response: Response) -> None:
        super().__init__("replayed")
        self.response = response


async def _replayed(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Replayed)
    return exc.response


_HANDLERS: tuple[tuple[type[Exception], Handler], ...] = (
    (Replayed, _replayed),
    (BullpenError, _bullpen_error),
    (RequestValidationError, _validation_error),
    (StarletteHTTPException, _http_error),
    (Exception, _unexpected),
)


def install(app: FastAPI) -> None:
    """Route every error through problem+json."""
    for cls, handler in _HANDLERS:
        app.add_exception_handler(cls, handler)


async def answer(request: Request, exc: Exception) -> Response:
    """What the installed handlers answer to `exc`, for code running outside them."""
    for cls, handler in _HANDLERS:
        if isinstance(exc, cls):
            return await handler(request, exc)
    raise exc  # unreachable: every Exception has a handler
