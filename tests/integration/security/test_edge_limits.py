"""The HTTP edge bounds what a client holds before authentication (issue 19, finding 3).

A real server on a loopback socket, spoken to over raw TCP: a request head over the size limit
gets 431 without the server buffering it, a head that never finishes gets 408 (or, if nothing
was ever sent, a close) after the header timeout, and connections beyond the cap get 503. Each
answer is problem+json with the security headers. No store behaviour: SQLite only.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from tests.support.servers import RunningServer

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

PROBLEM = "application/problem+json"
HEAD = b"GET /healthz HTTP/1.1\r\nHost: bullpen.test\r\n"
CHUNK = b"a" * 65536
# Generous: the machine is shared and noisy; the point is "closed", not "how fast".
ANSWER_WITHIN_S = 15.0


@asynccontextmanager
async def raw(
    server: RunningServer,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A plain TCP connection to the server."""
    parts = urlsplit(server.base_url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass  # already reset by the server


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read until the server closes; the status, headers and body of what it answered."""
    data = await asyncio.wait_for(reader.read(), ANSWER_WITHIN_S)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def assert_problem(headers: dict[str, str], body: bytes, status: int) -> None:
    """A problem+json answer of `status`, with the security headers, closing the connection."""
    assert headers["content-type"] == PROBLEM
    assert orjson.loads(body)["status"] == status
    assert headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["cache-control"] == "no-store"
    assert headers["connection"] == "close"


async def test_a_head_over_the_limit_gets_431(server: RunningServer) -> None:
    limit = server.settings.max_header_bytes
    async with raw(server) as (reader, writer):
        writer.write(HEAD + b"X-Big: " + b"a" * (limit + 1024) + b"\r\n\r\n")
        await writer.drain()
        status, headers, body = await read_answer(reader)
    assert status == 431, (status, body[:200])
    assert_problem(headers, body, 431)
    assert orjson.loads(body)["type"].endswith("/headers-too-large")


async def test_many_small_headers_over_the_limit_get_431(server: RunningServer) -> None:
    count = server.settings.max_header_bytes // 20 + 10
    headers_block = b"".join(b"X-H%06d: 12345678\r\n" % i for i in range(count))
    async with raw(server) as (reader, writer):
        writer.write(HEAD + headers_block + b"\r\n")
        await writer.drain()
        status, _, body = await read_answer(reader)
    assert status == 431, (status, body[:200])


async def test_a_head_just_under_the_limit_is_served(server: RunningServer) -> None:
    value = b"a" * (server.settings.max_header_bytes - 1024)
    async with raw(server) as (reader, writer):
        writer.write(HEAD + b"Cookie: x=" + value + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status, _, body = await read_answer(reader)
    assert status == 200, (status, body[:200])


async def test_an_endless_header_is_refused_without_being_buffered(
    server: RunningServer,
) -> None:
    """32 MiB of one header value, never finished: the server stops taking it near the limit.

    Before, httptools held the whole unfinished value (8 connections x 32 MiB took the
    server from 140 to 531 MB); here the allocation peak stays a small multiple of the limit.
    """
    total = 32 * 1024 * 1024
    sent = 0
    answer: tuple[int, dict[str, str], bytes] | None = None
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        async with raw(server) as (reader, writer):
            writer.write(HEAD + b"X-Big: ")
            try:
                while sent < total:
                    writer.write(CHUNK)
                    await writer.drain()
                    sent += len(CHUNK)
                    if reader.at_eof() or len(reader._buffer) > 0:
                        break  # answered already
            except (ConnectionResetError, BrokenPipeError):
                pass  # closed on us: refused
            _, peak = tracemalloc.get_traced_memory()
            try:
                answer = await read_answer(reader)
            except ConnectionResetError:
                answer = None  # the reset came first; the close is the refusal
    finally:
        tracemalloc.stop()
    assert sent < total, "the server took the whole 32 MiB header"
    assert peak < 4 * 1024 * 1024, f"allocation peak {peak} bytes while refusing"
    if answer is not None:
        assert answer[0] == 431


@pytest.mark.with_settings(header_timeout_s=1.0)
async def test_a_slow_loris_head_gets_408_after_the_timeout(server: RunningServer) -> None:
    """A head sent one header line at a time, never finished, is cut off at the timeout."""
    async with raw(server) as (reader, writer):
        writer.write(HEAD)
        started = time.monotonic()
        closed_after: float | None = None
        for i in range(100):  # 20 s of drip, well past the 1 s timeout
            if reader.at_eof() or len(reader._buffer) > 0:
                closed_after = time.monotonic() - started
                break
            try:
                writer.write(b"X-Drip-%d: x\r\n" % i)
                await writer.drain()
            except (ConnectionResetError, BrokenPipeError):
                closed_after = time.monotonic() - started
                break
            await asyncio.sleep(0.2)
        assert closed_after is not None, "the unfinished head was kept open for 20 s"
        status, headers, body = await read_answer(reader)
    assert status == 408, (status, body[:200])
    assert_problem(headers, body, 408)
    assert closed_after >= 0.9  # not before the timeout


@pytest.mark.with_settings(header_timeout_s=1.0)
async def test_a_silent_connection_is_closed_after_the_timeout(server: RunningServer) -> None:
    async with raw(server) as (reader, _):
        assert await asyncio.wait_for(reader.read(), ANSWER_WITHIN_S) == b""


@pytest.mark.with_settings(header_timeout_s=1.0)
async def test_a_keep_alive_connection_gets_a_fresh_head_timeout_per_request(
    server: RunningServer,
) -> None:
    """The timeout covers each head, not the connection's life: a client that sends whole
    requests promptly keeps its connection past the timeout."""
    async with raw(server) as (reader, writer):
        for _ in range(3):
            writer.write(HEAD + b"\r\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), ANSWER_WITHIN_S)
            assert line.startswith(b"HTTP/1.1 200"), line
            length = 0
            while (header := await reader.readline()) != b"\r\n":
                name, _, value = header.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            await asyncio.sleep(0.6)


@pytest.mark.with_settings(max_connections=2)
async def test_connections_beyond_the_cap_get_503(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with raw(server), raw(server):
        await asyncio.sleep(0.2)  # both accepted
        async with http.get(f"{server.base_url}/healthz") as resp:
            body = await resp.read()
            assert resp.status == 503, (resp.status, body[:200])
            assert resp.headers["Content-Type"] == PROBLEM
            assert resp.headers["Retry-After"] == "1"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            assert orjson.loads(body)["type"].endswith("/unavailable")
    # Once they are gone, requests are served again.
    deadline = time.monotonic() + ANSWER_WITHIN_S
    while True:
        async with http.get(f"{server.base_url}/healthz") as resp:
            if resp.status == 200:
                break
        assert time.monotonic() < deadline, "still refused after the connections closed"
        await asyncio.sleep(0.1)
