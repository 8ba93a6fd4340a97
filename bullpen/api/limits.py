"""Request body limit, enforced before any handler reads the body (pure ASGI)."""

from __future__ import annotations

import orjson
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
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    await self._reject(send, limit)
                    return
        received = 0
        exceeded = False
        replaced = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # Frameworks may turn a failed body read into their own error: answer 413 instead.
            nonlocal replaced, started
            if replaced:
                return
            if exceeded and message["type"] == "http.response.start":
                replaced = True
                await self._reject(send, limit)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLarge:
            if not replaced and not started:
                await self._reject(send, limit)

    async def _reject(self, send: Send, limit: int) -> None:
        body = orjson.dumps(
            {
                "type": PROBLEM_BASE + "payload-too-large",
                "title": "Payload too large",
                "status": 413,
                "detail": f"The request body is over the limit of {limit} bytes.",
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
