"""The load client against a fake Bullpen speaking the task + SSE contract over real sockets.

This tests the load generator, not the server, so the server is the true external edge and a
small aiohttp app stands in for it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
import pytest
from aiohttp import web

from bullpen.bench.loadgen import SSEParser, make_prompt, parse_gauges, run_load
from bullpen.bench.report import Snapshot, to_json
from bullpen.bench.stages import Stage

API_KEY = "bp_test_key"
AGENT_ID = str(uuid.uuid4())


@dataclass
class Fake:
    """Behaviour switches and what the fake saw."""

    mode: str = "ok"  # ok | gap | failed | create500 | truncated | linger
    texts: dict[str, str] = field(default_factory=dict)
    connections: set[tuple[str, int]] = field(default_factory=set)
    prompts: set[str] = field(default_factory=set)
    streaming: int = 0
    streaming_max: int = 0
    creates: int = 0


def _event(seq: int, kind: str, data: object, crlf: bool = False) -> bytes:
    nl = "\r\n" if crlf else "\n"
    return (
        f"id: 1.{seq}{nl}event: {kind}{nl}data: ".encode() + orjson.dumps(data) + (nl * 2).encode()
    )


def _app(fake: Fake) -> web.Application:
    async def create(request: web.Request) -> web.Response:
        fake.connections.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"status": 401}, status=401)
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not 10 <= len(prompt) <= 2000:
            return web.json_response({"status": 422, "detail": "prompt"}, status=422)
        if body.get("agent_id") != AGENT_ID:
            return web.json_response({"status": 422, "detail": "agent_id"}, status=422)
        fake.creates += 1
        if fake.mode == "create500":
            return web.json_response(
                {"type": "about:blank", "title": "boom", "status": 500, "detail": "boom"},
                status=500,
                content_type="application/problem+json",
            )
        fake.prompts.add(prompt)
        task_id = str(uuid.uuid4())
        # Deltas that differ per task, with characters that need JSON escaping.
        fake.texts[task_id] = f'Metrics for {task_id[:8]}: total=42, "trend" ↑\nok'
        return web.json_response(
            {
                "id": task_id,
                "number": f"BP-{fake.creates}",
                "status": "queued",
                "prompt": prompt,
                "agent_id": AGENT_ID,
                "run": {"id": str(uuid.uuid4()), "status": "queued"},
            },
            status=201,
        )

    async def events(request: web.Request) -> web.StreamResponse:
        fake.connections.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"status": 401}, status=401)
        task_id = request.match_info["id"]
        text = fake.texts[task_id]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        fake.streaming += 1
        fake.streaming_max = max(fake.streaming_max, fake.streaming)
        try:
            seq = 1
            marker = b'event: run\ndata: {"number": 1}\n\n'
            await resp.write(
                b": keep-alive\n\n" + marker + _event(seq, "status", {"status": "running"})
            )
            deltas = [text[i : i + 7] for i in range(0, len(text), 7)]
            for i, delta in enumerate(deltas):
                await asyncio.sleep(0.01)
                seq += 1
                if fake.mode == "gap" and i == 2:
                    seq += 1
                frame = _event(seq, "text", {"text": delta}, crlf=i % 2 == 1)
                # Split frames across writes so the parser must buffer partial events.
                await resp.write(frame[:5])
                await resp.write(frame[5:])
            if fake.mode == "truncated":
                await resp.write_eof()
                return resp
            seq += 1
            await resp.write(_event(seq, "usage", {"input_tokens": 10, "output_tokens": 9}))
            status = "failed" if fake.mode == "failed" else "done"
            if status == "failed":
                seq += 1
                await resp.write(_event(seq, "error", {"message": "provider exploded"}))
            seq += 1
            await resp.write(_event(seq, "end", {"status": status}))
            await resp.write(b'event: close\ndata: {"reason": "task-ended"}\n\n')
            # The close comes a moment after `end`: a client that stops reading at `end` drops
            # the connection instead of returning it to the pool.
            await asyncio.sleep(3.0 if fake.mode == "linger" else 0.02)
            await resp.write_eof()
            return resp
        finally:
            fake.streaming -= 1

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            text=(
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                "# TYPE process_resident_memory_bytes gauge\n"
                "process_resident_memory_bytes 5.24288e+07\n"
                'bullpen_db_pool_in_use{pool="api"} 3.0\n'
                'bullpen_db_pool_in_use{pool="worker"} 1.0\n'
                "bullpen_db_pool_size 10.0\n"
            ),
            content_type="text/plain",
        )

    async def listing(request: web.Request) -> web.Response:
        # Small pages so the client has to follow next_cursor; the provider TTFT is 10 ms.
        ids = list(fake.texts)
        start = int(request.query.get("cursor", "0"))
        page = ids[start : start + 3]
        more = start + 3 < len(ids)
        return web.json_response(
            {
                "items": [{"id": i, "run": {"ttft_ms": 10.0}} for i in page],
                "next_cursor": str(start + 3) if more else None,
            }
        )

    app = web.Application()
    app.router.add_get("/api/v1/tasks", listing)
    app.router.add_post("/api/v1/tasks", create)
    app.router.add_get("/api/v1/tasks/{id}/events", events)
    app.router.add_get("/metrics", metrics)
    return app


@pytest.fixture
async def fake_server() -> AsyncIterator[tuple[str, Fake]]:
    fake = Fake()
    runner = web.AppRunner(_app(fake), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/", fake
    finally:
        await runner.cleanup()


SCHEDULE = [Stage(1.0, 4, "ramp-4"), Stage(1.5, 4, "hold-4"), Stage(0.5, 0, "ramp-down")]


async def test_happy_path_streams_everything_and_reuses_connections(
    fake_server: tuple[str, Fake],
) -> None:
    base_url, fake = fake_server
    ticks: list[Snapshot] = []
    result = await run_load(
        base_url, API_KEY, AGENT_ID, SCHEDULE, think_s=0.05, on_tick=ticks.append, keep_texts=True
    )
    total = result.total
    assert total.errors == {}, result.error_examples
    assert total.created > 10
    assert total.created == fake.creates
    # Retired VUs finish their iteration: nothing created is left unfinished.
    assert total.completed == total.created
    assert result.texts == fake.texts
    assert len(fake.prompts) == total.created  # prompts vary
    assert fake.streaming_max <= 4
    # Keep-alive: a handful of connections carried every request.
    assert len(fake.connections) <= 8
    assert total.ttft_ms.count == total.completed
    # Every run was joined with the server's provider TTFT across several list pages.
    assert total.provider_ttft_ms.count == total.completed > 3
    assert total.provider_ttft_ms.mean == pytest.approx(10.0)
    assert total.overhead_ms.count == total.completed
    assert total.overhead_ms.mean == pytest.approx(total.ttft_ms.mean - 10.0)
    assert total.completion_ms.p99 is not None and total.ttft_ms.p99 is not None
    assert total.create_ms.mean is not None
    assert 0 < total.ttft_ms.mean <= total.completion_ms.mean
    hold = result.rows[1]
    assert hold.vus_max == 4
    assert hold.created > 0
    assert hold.rss_max_bytes == pytest.approx(52428800.0)
    assert hold.pool_in_use_max == 4.0
    assert hold.pool_saturation_max == pytest.approx(0.4)
    assert result.metrics_errors == 0
    assert ticks[-1].finished and ticks[-1].completed == total.completed
    assert max(t.target_vus for t in ticks) == 4
    assert 3.0 <= result.wall_s < 6.0
    assert to_json(result)["total"]["errors_total"] == 0


@pytest.mark.parametrize(
    ("mode", "kind", "created"),
    [
        ("gap", "seq_gap", True),
        ("failed", "end_failed", True),
        ("truncated", "truncated", True),
        ("create500", "create_http_500", False),
    ],
)
async def test_failures_are_counted_by_kind(
    fake_server: tuple[str, Fake], mode: str, kind: str, created: bool
) -> None:
    base_url, fake = fake_server
    fake.mode = mode
    stages = [Stage(0.2, 2, "ramp"), Stage(0.8, 2, "hold")]
    result = await run_load(base_url, API_KEY, AGENT_ID, stages, think_s=0.02, keep_texts=True)
    total = result.total
    assert set(total.errors) == {kind}, result.error_examples
    assert total.errors[kind] == fake.creates > 0
    assert total.completed == 0
    assert total.completion_ms.count == 0
    assert (total.created > 0) is created
    assert kind in result.error_examples
    assert result.error_kinds == [kind]
    if mode == "failed":
        # A failed run's text still reached `end`, so it is kept for comparison with the store.
        assert result.texts == fake.texts


async def test_a_stream_left_open_after_end_is_flagged_but_the_run_counts(
    fake_server: tuple[str, Fake],
) -> None:
    base_url, fake = fake_server
    fake.mode = "linger"
    result = await run_load(
        base_url, API_KEY, AGENT_ID, [Stage(0, 1, "up"), Stage(0.3, 1, "one")], think_s=0.0
    )
    total = result.total
    assert total.created == total.completed == 1
    assert total.errors == {"stream_not_closed": 1}
    # Completion is taken at `end`, not when the client gave up waiting for the close.
    assert total.completion_ms.max is not None and total.completion_ms.max < 1000
    assert 2.0 <= result.wall_s < 3.0


async def test_unreachable_server_is_counted_not_raised() -> None:
    stages = [Stage(0.5, 2, "hold")]
    result = await run_load(
        "http://127.0.0.1:9", API_KEY, AGENT_ID, stages, think_s=0.05, request_timeout_s=2.0
    )
    assert set(result.total.errors) == {"create_connection"}
    assert result.metrics_errors > 0
    assert result.total.created == 0


def test_sse_parser_handles_any_split_and_line_ending() -> None:
    stream = (
        b": hello\r\n\r\n"
        + b'id: 1\r\nevent: status\r\ndata: {"status":"running"}\r\n\r\n'
        + b'id:2\nevent:text\ndata:{"text":"a"}\n\n'
        + b'id: 3\revent: text\rdata: {"text":"b"}\r\r'
        + b'id: 4\nevent: end\ndata: {"status":\n'
        + b'data: "done"}\n\n'
    )
    expected = [
        (b"1", "status", b'{"status":"running"}'),
        (b"2", "text", b'{"text":"a"}'),
        (b"3", "text", b'{"text":"b"}'),
        (b"4", "end", b'{"status":\n"done"}'),
    ]
    for size in (1, 2, 3, 7, len(stream)):
        parser = SSEParser()
        events = []
        for i in range(0, len(stream), size):
            events += parser.feed(stream[i : i + size])
        assert events == expected, size


def test_parse_gauges_sums_label_sets_and_ignores_others() -> None:
    text = (
        "# TYPE process_resident_memory_bytes gauge\n"
        "process_resident_memory_bytes 1.5e+08\n"
        "process_resident_memory_bytes_total 99\n"
        'bullpen_db_pool_in_use{pool="a b",x="}"} 2\n'
        'bullpen_db_pool_in_use{pool="c"} 3 1700000000000\n'
        "bullpen_db_pool_size 20\n"
        "garbage\n"
    )
    assert parse_gauges(text) == {
        "process_resident_memory_bytes": 1.5e8,
        "bullpen_db_pool_in_use": 5.0,
        "bullpen_db_pool_size": 20.0,
    }


def test_prompts_vary_and_fit_the_contract() -> None:
    prompts = [make_prompt(n) for n in range(1000)]
    assert len(set(prompts)) == 1000
    assert all(p.startswith("Analyze this dataset and extract key metrics") for p in prompts)
    assert all(10 <= len(p) <= 2000 for p in prompts)
