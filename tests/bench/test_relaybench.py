"""The relay bench's parts on real sockets: the pass-through hop it measures as the floor,
its clients' staggered starts, and the whole scenario, briefly, against a real server."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator

import pytest

from bullpen.bench.hop import hop_server
from bullpen.bench.relaybench import SIDES, Side, _round, _stream, run_relay_bench
from bullpen.gateway.http1 import Http1Pool, target_of
from tests.support.postgres import PG_ADMIN_URL

BIG = 3 * 1024 * 1024  # past the sockets' buffers: the pipe's back-pressure must hold
SSE = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'


def port_of(server: asyncio.Server) -> int:
    port: int = server.sockets[0].getsockname()[1]
    return port


@pytest.fixture
async def target() -> AsyncIterator[tuple[asyncio.Server, list[bytes]]]:
    """Answers each connection with what it read, reversed, until the client's EOF."""
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        received.append(data)
        writer.write(data[::-1])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server, received


async def test_the_hop_pipes_bytes_both_ways_and_passes_each_end_on(
    target: tuple[asyncio.Server, list[bytes]],
) -> None:
    server, received = target
    hop = await hop_server(0, port_of(server))
    async with hop:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(hop))
        payload = os.urandom(BIG)
        writer.write(payload)  # before the hop has reached the target, most likely
        await writer.drain()
        writer.write_eof()  # the client's end reaches the target: it answers, then closes
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert received == [payload]
    assert answer == payload[::-1]  # every byte, in order, and then the target's end


async def test_the_hop_closes_a_client_whose_target_is_not_listening() -> None:
    hop = await hop_server(0, await _closed_port())
    async with hop:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(hop))
        writer.write(b"anyone there?")
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


async def _closed_port() -> int:
    """A port something listened on a moment ago, and nothing does now."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = port_of(server)
    server.close()
    await server.wait_closed()
    return port


async def test_a_rounds_clients_start_spread_over_the_warm_up_not_together() -> None:
    started: list[float] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            started.append(time.perf_counter())
            await asyncio.sleep(0.5)  # each client's next request comes after the first 0.35 s
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(SSE) + SSE)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    pool = Http1Pool()
    async with server:
        began = time.perf_counter()
        try:
            side = await _round(
                pool,
                [f"http://127.0.0.1:{port_of(server)}/chat/completions"],
                {"Content-Type": "application/json"},
                b"{}",
                4,
                0.4,
                0.2,
            )
        finally:
            pool.close()
    assert side.errors == 0 and side.ttft_ms and side.total_ms
    # The first request of each of the 4 clients: 0.1 s apart (0.4 s / 4), not together.
    firsts = sorted(t - began for t in started)[:4]
    gaps = [b - a for a, b in itertools.pairwise(firsts)]
    assert all(gap > 0.03 for gap in gaps) and 0.25 < firsts[-1] - firsts[0] < 0.6, firsts


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
WORD = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("status", "pieces", "content_piece"),
    [
        # The opening chunk's empty content is not the first token; what follows it in the
        # same read is. Markers split over two reads are still found.
        (200, [ROLE + WORD[:30], WORD[30:] + DONE[:7], DONE[7:]], 1),
        (200, [ROLE, WORD[:44], WORD[44:], DONE], 2),
        (200, [ROLE, WORD], None),  # no [DONE]: a broken stream
        (200, [ROLE, DONE], None),  # no content at all
        (503, [b'{"error":{"message":"busy"}}'], None),
    ],
)
async def test_the_load_client_times_the_first_content_and_counts_broken_streams(
    status: int, pieces: list[bytes], content_piece: int | None
) -> None:
    """Each piece is written on its own, 20 ms apart; the first content's time is when the
    piece that completes it (`content_piece`) arrived; None: the stream counts as an error."""
    arrived: list[float] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
        for piece in pieces:
            await asyncio.sleep(0.02)
            arrived.append(time.perf_counter())
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    pool = Http1Pool()
    side = Side()
    async with server:
        began = time.perf_counter()
        try:
            target = target_of(f"http://127.0.0.1:{port_of(server)}/chat/completions")
            await _stream(pool, target, {}, b"{}", side)
        finally:
            pool.close()
    if content_piece is None:
        assert side.errors == 1 and not side.ttft_ms and not side.total_ms
        return
    assert side.errors == 0 and len(side.ttft_ms) == len(side.total_ms) == 1
    content_at = (arrived[content_piece] - began) * 1000
    # The client's clock starts a few microseconds after `began` (it parses the target first),
    # so it may read up to that much less; a timestamp taken at the piece before is 20 ms early.
    assert content_at - 1 <= side.ttft_ms[0] < content_at + 15, (side.ttft_ms, content_at)
    assert side.total_ms[0] >= (arrived[-1] - began) * 1000


@pytest.mark.timeout(180)
async def test_the_relay_scenario_measures_direct_hop_and_relayed_streams() -> None:
    """On PostgreSQL with two API processes: each of the two clients calls its own; with a
    fourth side relaying under a budget."""
    steps: list[str] = []
    (level,) = await run_relay_bench(
        "postgres",
        pg_admin_url=PG_ADMIN_URL,
        api_processes=2,
        budgets=True,
        concurrencies=[2],
        rounds=1,
        duration_s=2.5,  # a stream takes 1.33 s: room for each client's second on a slow day
        warmup_s=0.3,
        on_step=steps.append,
    )
    sides = (*SIDES, "budgeted")
    assert [line.split(":")[0] for line in steps] == [f"C=2 round 1/1 {s}" for s in sides]
    for name in sides:
        (side,) = getattr(level, name)
        assert isinstance(side, Side) and side.errors == 0 and side.total_ms, name
    summary = level.summary()
    # Every stream of the simulator takes over a second: each side finished some, none failed.
    assert summary["errors"] == 0
    assert summary["requests_direct"] >= 2 and summary["requests_hop"] >= 2
    assert summary["requests_budgeted"] >= 2 and summary["budgeted_cpu_ratio"] > 0
    assert summary["requests_relay"] >= 2
    for key in ("ttft_p50_added_ms", "ttft_p50_hop_added_ms", "total_p99_hop_added_ms"):
        assert isinstance(summary[key], float), key
    assert summary["server_cpu_ms_per_relay_request"] is not None
    assert summary["hop_cpu_ms_per_request"] is not None
