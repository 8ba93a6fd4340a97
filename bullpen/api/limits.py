"""Request body checks made before any handler reads the body (pure ASGI): its size, and
that a JSON body holds only valid Unicode."""

from __future__ import annotations

import re

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bullpen.api.problems import MEDIA_TYPE, PROBLEM_BASE, problem

# A JSON escape of a UTF-16 surrogate (\uD800 to \uDFFF): half of a pair, or alone.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class BodyTooLarge(Exception):
    """Raised inside `receive` when a streamed body passes the limit."""


class LoneSurrogate(Exception):
    """Raised inside `receive` when a JSON body escapes half of a UTF-16 surrogate pair alone."""


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
        refusal: Response | None = None  # set when the body is refused while being read
        replaced = False
        started = False
        checked_receive = limited(receive, limit)
        if _is_json(scope):
            checked_receive = valid_unicode(checked_receive, scope["path"])

        async def guarded_receive() -> Message:
            nonlocal refusal
            try:
                return await checked_receive()
            except BodyTooLarge:
                refusal = too_large(limit)
                raise
            except LoneSurrogate:
                refusal = not_unicode(scope["path"])
                raise

        async def guarded_send(message: Message) -> None:
            # Frameworks may turn a failed body read into their own error: answer ours instead.
            nonlocal replaced, started
            if replaced:
                return
            if refusal is not None and message["type"] == "http.response.start":
                replaced = True
                await refusal(scope, receive, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except (BodyTooLarge, LoneSurrogate):
            if refusal is not None and not replaced and not started:
                await refusal(scope, receive, send)


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


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI would read the request's body as JSON: a JSON media type, or none."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media: bytes = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (
                media.startswith(b"application/") and media.endswith(b"+json")
            )
    return True


def valid_unicode(receive: Receive, path: str) -> Receive:
    """`receive`, raising LoneSurrogate once the whole body has been read if it is JSON text
    that escapes a lone UTF-16 surrogate (`"\\ud800"`). Python's JSON parser, which FastAPI
    uses, takes one into a `str` that no UTF-8 encoder accepts, so it would fail far from the
    request, at a database write or a secret's encryption: a 500 instead of a 422."""
    chunks: list[bytes] = []

    async def checked_receive() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                if _escapes_lone_surrogate(body):
                    raise LoneSurrogate(path)
        return message

    return checked_receive


def _escapes_lone_surrogate(body: bytes) -> bool:
    if _SURROGATE_ESCAPE.search(body) is None:
        return False
    try:
        orjson.loads(body)  # strict: a surrogate pair decodes, half of one does not
    except orjson.JSONDecodeError as err:
        return "surrogate" in str(err)
    return False


def not_unicode(path: str) -> Response:
    """The 422 for a JSON body that escapes a lone UTF-16 surrogate."""
    return problem(
        422,
        "validation",
        "Invalid request",
        "One or more fields are invalid; see `errors`.",
        instance=path,
        errors=[
            {
                "location": "body",
                "field": None,
                "message": "JSON decode error: a string escapes half of a UTF-16 surrogate "
                "pair alone (\\uD800 to \\uDFFF), which is not Unicode text",
                "code": "json_invalid",
            }
        ],
    )


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
