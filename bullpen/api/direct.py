"""Direct endpoints: a route's handler served ahead of the middleware stack.

The stack (Starlette's error and exception middlewares, FastAPI's own, ours, the router, the
route's request wrapper) costs CPU on every request and, as each layer wraps `send`, on every
streamed chunk: for the relay, whose whole point is to add next to nothing, more than the rest
of its set-up. A direct endpoint does for its handler what the stack would:
- the body limit: 413 by `Content-Length` or while the body is read;
- errors: the problem+json the exception handlers give (a 403 audited, a crash logged);
- the security headers.
Requests the direct path does not take (another method, a path with a root path in front)
still reach the same handler through the stack.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from bullpen.api import problems
from bullpen.api.headers import secure
from bullpen.api.limits import BodyTooLarge, declared_length, limited, too_large

Handler = Callable[[Request], Coroutine[Any, Any, Response]]
M = TypeVar("M", bound=BaseModel)


def served_by(handler: Handler) -> type[APIRoute]:
    """A route class whose requests go to `handler`, which resolves the route's parameters
    itself. FastAPI still documents the route (and `access_of` reads its `require`) from the
    endpoint's signature; solving its dependencies generically costs more CPU than the rest of
    a hot route's work. `handler` must answer as the endpoint would, in FastAPI's order: 415,
    then the caller (401, 429, 403), then the headers (400), then the body (422)."""

    class Served(APIRoute):
        def get_route_handler(self) -> Handler:
            return handler

    return Served


def body_as(model: type[M], raw: bytes) -> M:
    """The JSON body `raw` as `model`, or the 422 FastAPI gives for it (`loc` under `body`)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in err.errors(include_url=False)]
        ) from None


class DirectEndpoint:
    """Serve `handler` with a body limit of `max_body_bytes`."""

    def __init__(self, handler: Handler, max_body_bytes: int) -> None:
        self._handler = handler
        self._limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self._limit
        declared = declared_length(scope)
        if declared is not None and (declared < 0 or declared > limit):
            response = too_large(limit)
        else:
            request = Request(scope, limited(receive, limit))
            try:
                response = await self._handler(request)
            except BodyTooLarge:
                response = too_large(limit)
            except Exception as exc:
                response = await problems.answer(request, exc)
        response.raw_headers = secure(response.raw_headers, scope)
        await response(scope, receive, send)
