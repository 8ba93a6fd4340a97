"""A SERVER span for each HTTP request, when tracing is on (docs/tracing.md).

Hand-written rather than opentelemetry-instrumentation-asgi: that package wraps `receive` and
`send` in spans of their own (a span per streamed chunk of an SSE or relay stream unless told
otherwise), records headers and query strings it is configured to, and brings three more
packages (instrumentation-fastapi adds more on top of it). FastAPI's own native telemetry is
turned off too (`create_app`): it never sees the direct endpoints, adds spans for dependencies
and serialisation, and logs exception messages. This one makes one span per request and
reads the response's status from the one `http.response.start` message. It runs ahead of
everything else, the relay's direct endpoint included (`BullpenApp.__call__`), and with
tracing off it is not called at all.

An incoming W3C `traceparent` (and `tracestate`) is honoured: the request's span is its child,
and so is every run the request enqueues (the trace context is stored with the run). The span
names the route's template, never the query string or a header; the caller appears as ids
(`bullpen.api_key.id` or `bullpen.user.id`, and `bullpen.workspace.id`), never a credential.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bullpen.domain.principal import Principal

if TYPE_CHECKING:
    from bullpen.telemetry.spans import Tracing

_CARRIED = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
_CARRIED_MAX = 1024  # bytes of a traceparent or tracestate read; a longer one is ignored


async def traced(
    tracing: Tracing, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Serve one HTTP request through `app` inside its span."""
    carrier: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = _CARRIED.get(name)
        if key is not None and len(value) <= _CARRIED_MAX:
            carrier[key] = value.decode("latin-1")
    method = scope["method"]
    span = tracing.tracer.start_span(
        method,
        context=tracing.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": method,
            "url.path": scope["path"],
            "url.scheme": scope.get("scheme", "http"),
        },
    )
    status = 0
    # Shared with every copy of the scope made below: where the principal is kept.
    state = scope.setdefault("state", {})

    async def send_traced(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        await send(message)

    try:
        with tracing.current(span):
            await app(scope, receive, send_traced)
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
        raise
    finally:
        route = _route(scope)
        span.update_name(f"{method} {route}" if route else method)
        if route:
            span.set_attribute("http.route", route)
        if status:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(_caller(state))
        span.end()


def _route(scope: Scope) -> str | None:
    """The matched route's template (`/api/v1/tasks/{task_id}`); a direct endpoint's path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    if scope.get("bullpen.direct"):
        return str(scope["path"])
    return None


def _caller(state: dict[str, Any]) -> dict[str, Any]:
    """The authenticated caller's ids (`deps.authenticate` keeps the principal in the state)."""
    principal = state.get("principal")
    if not isinstance(principal, Principal):
        return {}
    ids: dict[str, Any] = {"bullpen.workspace.id": str(principal.workspace_id)}
    if principal.api_key_id is not None:
        ids["bullpen.api_key.id"] = str(principal.api_key_id)
    elif principal.user_id is not None:
        ids["bullpen.user.id"] = str(principal.user_id)
    return ids
