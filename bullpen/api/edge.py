"""The HTTP edge: uvicorn's httptools protocol with bounds on what a client can hold before any
app code runs, and the one uvicorn config every Bullpen server is built from.

httptools keeps a header it is still reading in memory, with no limit, and uvicorn gives a
client as long as it likes to finish a request head. So, per connection:
- a request head (request line and headers) over `max_header_bytes` gets 431 and the
  connection is closed: counted from the parser's callbacks for what it has parsed, and from
  the bytes read while the head is still open for what it holds unparsed, so a client's
  unfinished header costs at most the limit plus one read;
- a head not complete within `header_timeout_s` of its first byte (or of the connection
  opening) gets 408, or, if nothing was sent at all, the connection is closed;
- beyond `max_connections` open connections (or requests in flight) a request gets 503 with
  `Retry-After` (uvicorn's `limit_concurrency`, answered as problem+json).
Each answer is problem+json with the security headers, like the app's own.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson
import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from bullpen.api.headers import secure
from bullpen.api.problems import MEDIA_TYPE, PROBLEM_BASE, problem
from bullpen.settings import Settings

# After a refusal the connection is half-closed and what the client still sends is read and
# dropped for this long before the close: closing with unread bytes would reset the connection
# and could cost the client the answer it was just sent (as nginx's lingering close).
LINGER_S = 2.0


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request head over the limit."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a size limit and a deadline on each request head."""

    max_head_bytes: ClassVar[int] = 64 * 1024
    head_timeout_s: ClassVar[float] = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # between a request's first byte and the end of its headers
        self._began = False  # a request began during the current read
        self._parsed = 0  # head bytes the parser has handed over (request target, headers)
        self._unparsed = 0  # bytes of reads that fell wholly inside the current head
        self._too_large = False
        self._refused = False  # answered on the raw transport: the rest is dropped
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._began = False
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if self._in_head and not self._began:
            self._unparsed += len(data)
            if self._unparsed > self.max_head_bytes:
                self._refuse_too_large()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers 400 to any error the parser raises, HeadTooLarge from a callback too.
        if self._too_large:
            self._answer(431, "headers-too-large", "Request headers too large", self._too_big())
            return
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._began = True
        self._parsed = self._unparsed = 0
        if self._deadline is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn's own 503 for `limit_concurrency` is bare text/plain.
        chosen: Any = too_busy if app is service_unavailable else app
        super()._start_asgi_task(cycle, chosen)

    def _count(self, size: int) -> None:
        self._parsed += size
        if self._parsed > self.max_head_bytes:
            self._too_large = True
            raise HeadTooLarge

    def _too_big(self) -> str:
        return f"The request line and headers are over the limit of {self.max_head_bytes} bytes."

    def _refuse_too_large(self) -> None:
        self._too_large = True
        self._answer(431, "headers-too-large", "Request headers too large", self._too_big())

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.head_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._refused:
            return
        if not self._in_head:
            # Opened and silent (a keep-alive connection's idle time is uvicorn's own timeout).
            if self.cycle is None:
                self.transport.close()
            return
        detail = f"The request headers did not arrive within {self.head_timeout_s:g} seconds."
        self._answer(408, "request-timeout", "Request timeout", detail)

    def _answer(self, status: int, slug: str, title: str, detail: str) -> None:
        """Answer problem+json on the raw transport and close the connection."""
        self._disarm()
        body = orjson.dumps(
            {"type": PROBLEM_BASE + slug, "title": title, "status": status, "detail": detail}
        )
        own = [
            (b"content-type", MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        scope = {"type": "http", "scheme": self.scheme, "path": ""}
        headers = [*self.server_state.default_headers, *secure(own, scope)]
        head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self.transport.write(STATUS_LINE[status] + head + b"\r\n" + body)
        self._refused = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._deadline = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


async def too_busy(scope: Scope, receive: Receive, send: Send) -> None:
    """503 for a request beyond the connection limit; the connection is closed after it."""
    response: Response = problem(
        503,
        "unavailable",
        "Service unavailable",
        "The server has as many connections open as it allows; try again shortly.",
        headers={"Retry-After": "1", "Connection": "close"},
    )
    response.raw_headers = secure(response.raw_headers, scope)
    await response(scope, receive, send)


def bounded_protocol(settings: Settings) -> type[BoundedHttpProtocol]:
    """The protocol class with `settings`' limits (uvicorn builds one per connection)."""

    class Configured(BoundedHttpProtocol):
        max_head_bytes = settings.max_header_bytes
        head_timeout_s = settings.header_timeout_s

    return Configured


def server_config(
    app: ASGIApp, settings: Settings, *, host: str, port: int, **options: Any
) -> uvicorn.Config:
    """The uvicorn config of a Bullpen server: its edge limits, proxies, no access log."""
    return uvicorn.Config(app, **server_options(settings, host=host, port=port, **options))


def server_options(settings: Settings, **options: Any) -> dict[str, Any]:
    """uvicorn.Config's keyword arguments for a Bullpen server, `options` added."""
    return {
        "http": bounded_protocol(settings),
        # uvicorn answers 503 once open connections reach `limit_concurrency`, counting the
        # connection asking: one more than the number Bullpen allows.
        "limit_concurrency": settings.max_connections + 1,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
        "access_log": False,
        "log_config": None,
        **options,
    }
