"""Security headers on every response: by `SecurityHeaders` around the whole app (its error
middleware included), by `secure` where a response bypasses it (the direct endpoints, the
answers the HTTP protocol gives before any app runs)."""

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
# Sent only on answers to https requests (RFC 6797 has browsers ignore it over http). No
# includeSubDomains: Bullpen cannot know that every sibling host serves https.
HSTS = (b"strict-transport-security", b"max-age=31536000")
# Every dynamic answer may carry a caller's data (a page, a task, a stream): no cache keeps it.
# Static assets, the same for everyone, stay cacheable.
NO_STORE = (b"cache-control", b"no-store")
STATIC_PREFIX = "/static/"


def secure(headers: list[tuple[bytes, bytes]], scope: Scope | None) -> list[tuple[bytes, bytes]]:
    """`headers` with each security header it does not set already; for a request's `scope`,
    HSTS when it came over https and `Cache-Control: no-store` unless it is a static asset.
    Without a scope (answers given before a request was read), `no-store` and no HSTS."""
    present = {name.lower() for name, _ in headers}
    added = [(n, v) for n, v in SECURITY_HEADERS if n not in present]
    if scope is not None and scope.get("scheme") == "https" and HSTS[0] not in present:
        added.append(HSTS)
    if scope is None or not str(scope.get("path", "")).startswith(STATIC_PREFIX):
        # A handler's own `no-cache` (the streams) would still let a cache keep the body.
        headers = [(n, v) for n, v in headers if n.lower() != NO_STORE[0]]
        added.append(NO_STORE)
    return [*headers, *added]


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
                headers = secure(list(message.get("headers", [])), scope)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
