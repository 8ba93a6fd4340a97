"""Security headers on every response: by middleware for the app, by `secure` where a
response bypasses the middleware stack (the direct endpoints)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
]


def secure(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` with each security header it does not set already."""
    present = {name.lower() for name, _ in headers}
    return [*headers, *((n, v) for n, v in SECURITY_HEADERS if n not in present)]


class SecurityHeaders:
    """Add security headers to every response (pure ASGI: streams pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": secure(list(message.get("headers", [])))}
            await send(message)

        await self.app(scope, receive, with_headers)
