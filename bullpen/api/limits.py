"""Request body limit, enforced before any handler reads the body (pure ASGI)."""

from __future__ import annotations

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bullpen.api.problems import MEDIA_TYPE, PROBLEM_BASE


class BodyTooLarge(Exception):
    """Raised inside `receive` when a streamed body passes the limit."""


class BodyLimit:
    """Answer 413 problem+json for bodies over `max_bytes` (by header, or while streaming)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, prefixed: tuple[tuple[str, int], ...] = ()
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.prefixed = prefixed  # (path prefix, its own limit), e.g. the relay's larger one

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for prefix, own in self.prefixed:
            if scope["path"].startswith(prefix):
                limit = own
                break
        declared = declared_length(scope)
        if declared is not None and (declared < 0 or declared > limit):
            await too_large(limit)(scope, receive, send)
            return
        exceeded = False
        replaced = False
        started = False
        limited_receive = limited(receive, limit)

        async def guarded_receive() -> Message:
            nonlocal exceeded
            try:
                return await limited_receive()
            except BodyTooLarge:
                exceeded = True
                raise

        async def guarded_send(message: Message) -> None:
            # Frameworks may turn a failed body read into their own error: answer 413 instead.
            nonlocal replaced, started
            if replaced:
                return
            if exceeded and message["type"] == "http.response.start":
                replaced = True
                await too_large(limit)(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except BodyTooLarge:
            if not replaced and not started:
                await too_large(limit)(scope, receive, send)


def declared_length(scope: Scope) -> int | None:
    """The request's `Content-Length` (-1 if malformed), or None without one."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return -1
    return None


def limited(receive: Receive, limit: int) -> Receive:
    """`receive`, raising BodyTooLarge once the body read so far passes `limit` bytes."""
    received = 0

    async def limited_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge
        return message

    return limited_receive


def too_large(limit: int) -> Response:
    """The 413 problem+json for a body over `limit` bytes; the connection is closed after it."""
    return Response(
        orjson.dumps(
            {
                "type": PROBLEM_BASE + "payload-too-large",
                "title": "Payload too large",
                "status": 413,
                "detail": f"The request body is over the limit of {limit} bytes.",
            }
        ),
        status_code=413,
        media_type=MEDIA_TYPE,
        headers={"Connection": "close"},
    )
