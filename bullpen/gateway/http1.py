"""A lean HTTP/1.1 client for the gateway's one kind of request: POST a JSON body, read the
answer as it streams.

aiohttp, which the gateway used before, spent more CPU per relayed chunk than everything else
the relay does with it (its request set-up, its stream reader, a future and a timer context
per read). This client is an asyncio protocol over httptools' parser (the one uvicorn serves
with): bytes are parsed where they arrive, the body is buffered as it comes, and the reader
waits on a future only when the buffer is empty.

- One keep-alive pool per origin (scheme, host, port); a connection goes back to it only after
  a complete response that allows keep-alive, and idle ones are dropped after `IDLE_S`.
- A reused connection that fails before the first byte of its answer (the server closed it
  while it was idle) is retried once on a new connection; any other failure is the caller's.
- TLS for `https` with the system's trust store; no proxies, cookies, redirects or
  compression (`Accept-Encoding: identity`; a compressed answer is refused).
- Reading stops (the socket is paused) while more than `BUFFER_LIMIT` bytes wait unread.
- With a `guard` (`bullpen.security.outbound`), a new connection goes only to an address the
  guard resolved and allowed, never to the name itself; what it learnt of the address
  (public or not) is told to the caller through `Peer`.

Connection failures raise `ConnectionError` (`UpstreamClosed` once the answer has begun),
refused TLS `ssl.SSLError`, malformed answers `MalformedResponse`: all `OSError`s.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 15.0  # idle pooled connections older than this are closed, not reused
BUFFER_LIMIT = 256 * 1024
FINISH_S = 2.0  # how long a released connection may take to receive the rest of its answer
_USER_AGENT = b"bullpen-gateway"


class MalformedResponse(ConnectionError):
    """The server's answer was not valid HTTP/1.1."""


class UpstreamClosed(ConnectionError):
    """The connection closed before the answer was complete."""


class Checked(Protocol):
    """What a guard allows for a host: addresses to connect to, and whether all are public."""

    @property
    def addresses(self) -> tuple[tuple[socket.AddressFamily, str], ...]: ...

    @property
    def public(self) -> bool: ...


class Guard(Protocol):
    """Resolves a host and checks its addresses before any connect (raises to refuse)."""

    async def check(self, host: str, port: int) -> Checked:
        """The addresses the host may be connected to."""
        ...


@dataclass(slots=True)
class Peer:
    """What `Http1Pool.post` learnt of where the request went, as soon as it knew.

    `public` is None without a guard (or before the address was known).
    """

    public: bool | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL sends requests: its origin and the request line's path."""

    scheme: str
    host: str
    port: int
    path: bytes
    host_header: bytes

    @property
    def origin(self) -> tuple[str, str, int]:
        """What a pooled connection can serve."""
        return (self.scheme, self.host, self.port)


def target_of(url: str) -> Target:
    """Split an `http(s)://` URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    if port != default:
        shown += f":{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, path.encode(), shown.encode("idna"))


class Response:
    """An answer whose body is read as it arrives."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: _Connection, status: int, headers: dict[str, str]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers  # names lower-cased

    async def read_some(self) -> bytes:
        """What arrived since the last read (waiting for something); b"" once it is over."""
        return await self._conn.read_some()

    async def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (less if it ends first)."""
        out = bytearray()
        while len(out) < limit:
            data = await self._conn.read_some()
            if not data:
                break
            out += data
        return bytes(out[:limit])

    def fail(self, exc: BaseException) -> None:
        """Make the waiting read (or the next one) raise `exc`."""
        self._conn.fail(exc)

    def release(self) -> None:
        """Done with it: a fully read answer's connection goes back to the pool."""
        self._conn.done()

    def close(self) -> None:
        """Done with it, unfinished or not: the connection is closed."""
        self._conn.close()


class _Connection(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self, pool: Http1Pool, origin: tuple[str, str, int]) -> None:
        self._pool = pool
        self.origin = origin
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._head_done = False
        self._until_eof = False
        self._complete = False
        self._keep_alive = False
        self._received = False
        self._finishing: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.public: bool | None = None  # what the guard found of its address

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, though they behave as one.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._set_error(MalformedResponse(f"malformed HTTP answer ({err})"))
            self._abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._complete and exc is None and self._head_done and self._until_eof:
            self._complete = True  # an answer with no length ends where the connection does
            self._wake()
        if not self._complete:
            if self._head_done:
                self._set_error(UpstreamClosed("the connection closed mid-answer"))
            else:
                self._set_error(ConnectionResetError("the connection closed before an answer"))
        self._pool.forget(self)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._head_done = True
        self._until_eof = (
            "content-length" not in self._headers
            and "chunked" not in self._headers.get("transfer-encoding", "").lower()
        )
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._finishing is not None:
            self.close()  # the caller is gone and the body goes on: not worth waiting for
            return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > BUFFER_LIMIT and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        # The parser knows this only while the message is its current one.
        self._keep_alive = self._parser.should_keep_alive()
        if self._finishing is not None:
            self._reuse()
        self._wake()

    # -- the request
    def send(self, head: bytes, body: bytes) -> None:
        """Write a request (the connection must be idle)."""
        assert self._transport is not None
        self._status = 0
        self._headers = {}
        self._head_done = self._complete = self._received = False
        self._chunks.clear()
        self._buffered = 0
        self._error = None
        self._transport.write(head + body)

    async def response(self) -> Response:
        """Wait for the answer's status line and headers."""
        while not self._head_done:
            await self._wait()
        encoding = self._headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise MalformedResponse(f"a {encoding!r}-encoded answer, though none was accepted")
        return Response(self, self._status, self._headers)

    async def read_some(self) -> bytes:
        while not self._chunks:
            if self._complete:
                return b""
            await self._wait()
        data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _set_error(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def fail(self, exc: BaseException) -> None:
        self._set_error(exc)

    @property
    def answered_nothing(self) -> bool:
        """No byte of an answer arrived (a stale keep-alive connection looks like this)."""
        return not self._received

    def done(self) -> None:
        if self._error is not None or self._transport is None or self._chunks:
            self.close()
        elif self._complete:
            self._reuse()
        else:
            # The caller has all it wanted (an SSE stream's `[DONE]`), but the body's last
            # bytes (a chunked body's terminator) are still on their way: reuse the
            # connection once they are in, unless more comes or they take too long.
            self._finishing = asyncio.get_running_loop().call_later(FINISH_S, self.close)

    def _reuse(self) -> None:
        if self._finishing is not None:
            self._finishing.cancel()
            self._finishing = None
        if self._transport is not None and self._keep_alive:
            self._pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        if self._finishing is not None:
            self._finishing.cancel()
            self._finishing = None
        self._abort()
        self._pool.forget(self)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    @property
    def usable(self) -> bool:
        """Open and not shutting down."""
        return self._transport is not None and not self._transport.is_closing()


class Http1Pool:
    """Keep-alive connections by origin; `close()` ends them all.

    With a `guard`, every new connection is checked by it first (see the module's notes).
    """

    def __init__(self, guard: Guard | None = None) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None
        self._guard = guard

    async def post(
        self,
        target: Target,
        headers: Mapping[str, str],
        body: bytes,
        *,
        connect_timeout_s: float,
        peer: Peer | None = None,
    ) -> Response:
        """Send a POST; return once the answer's headers arrived. `peer` is told what the
        guard found of the address (before anything is sent)."""
        head = _request_head(target, headers, len(body))
        conn = self._take_idle(target.origin)
        if conn is not None:
            if peer is not None:
                peer.public = conn.public
            conn.send(head, body)
            try:
                return await conn.response()
            except ConnectionResetError:
                if not conn.answered_nothing:
                    raise
                conn.close()  # closed by the server while idle: once more, on a new one
        conn = await self._connect(target, connect_timeout_s, peer)
        conn.send(head, body)
        try:
            return await conn.response()
        except BaseException:
            conn.close()
            raise

    def _take_idle(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable and now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def _connect(self, target: Target, timeout_s: float, peer: Peer | None) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if target.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        conn = _Connection(self, target.origin)
        server_hostname = target.host if tls is not None else None
        try:
            async with asyncio.timeout(timeout_s):
                if self._guard is None:
                    await loop.create_connection(
                        lambda: conn,
                        target.host,
                        target.port,
                        ssl=tls,
                        server_hostname=server_hostname,
                    )
                else:
                    # Checked first (a refusal raises before any connect), then connected to
                    # by number: the address checked is the address connected to.
                    checked = await self._guard.check(target.host, target.port)
                    conn.public = checked.public
                    if peer is not None:
                        peer.public = checked.public
                    failure: OSError | None = None
                    for family, address in checked.addresses:
                        try:
                            await loop.create_connection(
                                lambda: conn,
                                address,
                                target.port,
                                family=family,
                                ssl=tls,
                                server_hostname=server_hostname,
                            )
                        except OSError as err:
                            failure = err
                            continue
                        break
                    else:
                        assert failure is not None  # a guard answers with an address or raises
                        raise failure
        except TimeoutError:
            # Only this timeout's own expiry arrives here as TimeoutError (an enclosing
            # one's arrives as cancellation): a connect failure, not the caller's deadline.
            raise ConnectionError(f"no connection within {timeout_s:g} s") from None
        self._open.add(conn)
        return conn

    def put_back(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin, []).append(conn)

    def forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle is not None and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        """Close every connection."""
        for conn in list(self._open):
            conn.close()
        self._idle.clear()


def _request_head(target: Target, headers: Mapping[str, str], length: int) -> bytes:
    lines = [
        b"POST " + target.path + b" HTTP/1.1",
        b"Host: " + target.host_header,
        b"User-Agent: " + _USER_AGENT,
        b"Accept-Encoding: identity",
        b"Content-Length: " + str(length).encode(),
    ]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(name.encode("latin-1") + b": " + value.encode("latin-1"))
    return b"\r\n".join(lines) + b"\r\n\r\n"
