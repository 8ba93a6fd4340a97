"""The gateway's HTTP/1.1 client against small servers on real sockets that answer exactly
what each test scripts: keep-alive reuse, a stale idle connection, bodies ended by the
connection, answers cut short or malformed, compression refused, a connect timeout."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from bullpen.gateway.http1 import (
    BUFFER_LIMIT,
    Http1Pool,
    MalformedResponse,
    UpstreamClosed,
    target_of,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body); b"" if the client closed first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


class Server:
    """A TCP server running `handler` per connection, counting connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


@pytest.fixture
async def pool() -> AsyncIterator[Http1Pool]:
    opened = Http1Pool()
    try:
        yield opened
    finally:
        opened.close()


async def body_of(pool: Http1Pool, url: str) -> tuple[int, bytes]:
    """POST to `url`; the status and the whole body."""
    response = await pool.post(target_of(url), {"X-Test": "1"}, b"{}", connect_timeout_s=2)
    out = b""
    try:
        while data := await response.read_some():
            out += data
    finally:
        response.release()
    return response.status, out


async def test_a_complete_answer_leaves_its_connection_for_the_next_request(
    pool: Http1Pool,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            server.requests.append(request)
            writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n"))
            await writer.drain()
            writer.write(b"0\r\n\r\n")

    async with Server(handler) as server:
        for _ in range(3):
            assert await body_of(pool, server.url) == (200, b"data: 1\n\ndata: 2\n\n")
        assert server.connections == 1
    head = server.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:" in head and b"\r\nContent-Length: 2\r\n" in head
    assert b"\r\nAccept-Encoding: identity\r\n" in head and head.endswith(b"\r\n\r\n{}")


async def test_a_connection_released_before_the_terminator_is_reused_once_it_arrives(
    pool: Http1Pool,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            writer.write(CHUNKED_HEAD + chunk(b"data: [DONE]\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")

    async with Server(handler) as server:
        for _ in range(2):
            response = await pool.post(target_of(server.url), {}, b"{}", connect_timeout_s=2)
            assert await response.read_some() == b"data: [DONE]\n\n"
            response.release()  # the caller stops at [DONE], before the body's end
            await asyncio.sleep(0.1)
        assert server.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced_once(
    pool: Http1Pool,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if server.connections == 1:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            # Closes only once the next request came: the client cannot know it beforehand.
            await read_request(reader)
            return
        while await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnew")

    async with Server(handler) as server:
        assert await body_of(pool, server.url) == (200, b"ok")
        assert await body_of(pool, server.url) == (200, b"new")
        assert server.connections == 2


async def test_an_answer_without_a_length_ends_with_its_connection(pool: Http1Pool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

    async with Server(handler) as server:
        assert await body_of(pool, server.url) == (200, b"all of it")
        assert await body_of(pool, server.url) == (200, b"all of it")
        assert server.connections == 2  # not kept: the server said close


async def test_answers_cut_short_or_malformed_or_compressed_raise(pool: Http1Pool) -> None:
    answers = [
        CHUNKED_HEAD + chunk(b"data: 1\n\n"),  # then the connection closes mid-body
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 2x0 What\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 0\r\n\r\n",
        b"",  # closed before any answer, on a new connection: not retried
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answers[server.connections - 1])
        await writer.drain()

    async with Server(handler) as server:
        with pytest.raises(UpstreamClosed):
            await body_of(pool, server.url)
        with pytest.raises(UpstreamClosed):
            await body_of(pool, server.url)
        with pytest.raises(MalformedResponse):
            await body_of(pool, server.url)
        with pytest.raises(MalformedResponse, match="gzip"):
            await body_of(pool, server.url)
        with pytest.raises(ConnectionResetError):
            await body_of(pool, server.url)
        assert server.connections == 5


async def test_a_reader_falling_behind_pauses_the_socket_and_loses_nothing(
    pool: Http1Pool,
) -> None:
    piece = b"x" * 65_536
    pieces = 256 * BUFFER_LIMIT // len(piece)  # 64 MiB: more than the kernel buffers hold

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (pieces * len(piece)))
        for _ in range(pieces):
            writer.write(piece)
            await writer.drain()
        server.requests.append(b"all written")

    async with Server(handler) as server:
        response = await pool.post(target_of(server.url), {}, b"{}", connect_timeout_s=2)
        await asyncio.sleep(0.3)  # the server writes while nobody reads
        assert server.requests == []  # held back: the client stopped reading
        total = 0
        while data := await response.read_some():
            total += len(data)
        response.release()
        assert total == pieces * len(piece) and server.requests == [b"all written"]


async def test_a_connect_that_takes_too_long_is_a_connection_error(pool: Http1Pool) -> None:
    # A listener that never accepts, its queue filled: further SYNs go unanswered.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        started = asyncio.get_running_loop().time()
        with pytest.raises(ConnectionError, match=r"no connection within 0\.2 s"):
            await pool.post(
                target_of(f"http://127.0.0.1:{port}/v1"), {}, b"{}", connect_timeout_s=0.2
            )
        assert asyncio.get_running_loop().time() - started < 2
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    pool: Http1Pool,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with Server(handler) as server:
        with pytest.raises(ValueError, match="line break"):
            await pool.post(
                target_of(server.url), {"X-Key": "a\r\nInjected: 1"}, b"{}", connect_timeout_s=2
            )
        assert server.connections == 0


def test_urls_and_headers_are_checked() -> None:
    assert target_of("https://api.example.com/v1/chat/completions").host_header == (
        b"api.example.com"
    )
    assert target_of("http://[::1]:8080/x").host_header == b"[::1]:8080"
    with pytest.raises(ValueError, match="http"):
        target_of("ftp://example.com/")
