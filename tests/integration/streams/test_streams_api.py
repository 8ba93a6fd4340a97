"""The live event streams over real sockets, on both backends: a run's stream and a task's
stream (replay, resume, every run in order), subscriber limits, and what a departed or stalled
client leaves behind (nothing)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from bullpen.domain.events import EventKind, RunEvent
from bullpen.store import agents as agent_store
from tests.support.http import bearer, call, problem_of
from tests.support.servers import RunningServer
from tests.support.sse import Event, read_events, text_of
from tests.support.streams import (
    SIMULATED,
    open_stream,
    other_workspace_task,
    subscribers_drop_to,
)
from tests.support.tasks import PROMPT, expected_text, new_task


def task_url(server: RunningServer, task: dict[str, Any]) -> str:
    return f"{server.base_url}/api/v1/tasks/{task['id']}/events"


def run_url(server: RunningServer, run_id: str) -> str:
    return f"{server.base_url}/api/v1/runs/{run_id}/events"


def triples(events: list[Event]) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [(e.id, e.event, e.data) for e in events]


async def raw_stream(
    server: RunningServer, path: str, *, rcvbuf: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A GET of a stream over a bare socket: nothing reads the answer unless the caller does."""
    parts = urlsplit(server.base_url)
    assert parts.hostname is not None and parts.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so the window offered stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (parts.hostname, parts.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {server.boot.api_key}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    return reader, writer


# --- a run's stream -------------------------------------------------------------------------


async def test_a_runs_stream_replays_the_run_and_resumes_after_any_event(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    url = run_url(server, task["run"]["id"])
    live = await read_events(http, url, server.auth, markers=True)  # follows the run live
    n = len(live)
    assert [e.id for e in live] == [str(i) for i in range(1, n + 1)]  # no markers on a run
    assert live[0].event == "status" and live[-1].event == "end"
    assert live[-1].data == {"status": "done"}
    assert text_of(live) == expected_text(server, PROMPT)

    replayed = await read_events(http, url, server.auth, markers=True)
    assert triples(replayed) == triples(live)
    for k in sorted({1, 2, n // 2, n - 1}):
        rest = await read_events(http, url, {**server.auth, "Last-Event-ID": str(k)})
        assert triples(rest) == triples(live[k:]), k
    # The task's stream carries the same events, numbered within run 1.
    of_task = await read_events(http, task_url(server, task), server.auth)
    assert [(e.id, e.event, e.data) for e in of_task] == [
        (f"1.{e.id}", e.event, e.data) for e in live
    ]
    await subscribers_drop_to(server, 0)


async def test_a_resume_at_or_past_a_runs_end_ends_at_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    url = run_url(server, task["run"]["id"])
    n = len(await read_events(http, url, server.auth))
    for after in (n, n + 1, 999_999_999):
        async with asyncio.timeout(5):  # not the 15 s keep-alive: nothing is waited for
            rest = await read_events(
                http, url, {**server.auth, "Last-Event-ID": str(after)}, markers=True
            )
        assert rest == [], after
    await subscribers_drop_to(server, 0)


async def test_bad_last_event_ids_unknown_and_foreign_runs(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    url = run_url(server, task["run"]["id"])
    await read_events(http, url, server.auth)  # the run has ended
    for bad in ("abc", "1.2", "1234567890", "-1", "1e3"):
        async with http.get(url, headers={**server.auth, "Last-Event-ID": bad}) as resp:
            body = await problem_of(resp, 422)
        assert any("last-event-id" in str(e).lower() for e in body["errors"]), body
    async with http.get(url, headers={**server.auth, "Last-Event-ID": "123456789"}) as resp:
        assert resp.status == 200  # nine digits are an id; past the end, so empty
        assert await resp.read() == b""
    their_task, their_run, their_key = await other_workspace_task(server)
    for path, headers in (
        (f"/api/v1/runs/{uuid.uuid4()}/events", server.auth),
        (f"/api/v1/runs/{their_run}/events", server.auth),
        (f"/api/v1/runs/{task['run']['id']}/events", bearer(their_key)),
        (f"/api/v1/tasks/{their_task}/events", server.auth),
    ):
        async with http.get(server.base_url + path, headers=headers) as resp:
            await problem_of(resp, 404)
    async with http.get(
        f"{server.base_url}/api/v1/runs/not-a-uuid/events", headers=server.auth
    ) as r:
        await problem_of(r, 422)
    # The owner of the other workspace's run does get its stream.
    async with http.get(run_url(server, their_run), headers=bearer(their_key)) as resp:
        assert resp.status == 200
        resp.close()
    await subscribers_drop_to(server, 0)  # refused requests never held a subscription


# --- a task's stream across runs ------------------------------------------------------------


@pytest.mark.with_settings(worker_enabled=False)
async def test_a_tasks_stream_follows_a_retried_run_live_and_closes(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    path = f"/api/v1/tasks/{task['id']}"
    assert (await call(http, server, "POST", f"{path}/cancel")).status == 200
    assert (await call(http, server, "POST", f"{path}/retry")).status == 201
    reader = asyncio.create_task(
        read_events(http, task_url(server, task), server.auth, markers=True)
    )
    await subscribers_drop_to(server, 1)
    await asyncio.sleep(0.3)  # let it reach run 2 and wait there (correct either way)
    assert not reader.done()  # run 2 is queued: the stream stays open
    assert (await call(http, server, "POST", f"{path}/cancel")).status == 200
    events = await asyncio.wait_for(reader, 10)
    runs = (await call(http, server, "GET", f"{path}/runs")).body["items"]
    assert triples(events) == [
        (None, "run", {"run_id": runs[0]["id"], "number": 1}),
        ("1.1", "end", {"status": "cancelled"}),
        (None, "run", {"run_id": runs[1]["id"], "number": 2}),
        ("2.1", "end", {"status": "cancelled"}),
        (None, "close", {"reason": "task-ended", "status": "cancelled"}),
    ]
    await subscribers_drop_to(server, 0)

    rest = await read_events(http, task_url(server, task), {**server.auth, "Last-Event-ID": "1.1"})
    assert triples(rest) == [("2.1", "end", {"status": "cancelled"})]
    after_all = await read_events(
        http, task_url(server, task), {**server.auth, "Last-Event-ID": "2.1"}, markers=True
    )
    assert [e.id for e in after_all if e.id] == []
    assert after_all[-1].event == "close" and after_all[-1].data["status"] == "cancelled"


async def test_a_tasks_stream_spans_a_failed_run_and_its_successful_retry(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    async with svc.store.write() as conn:
        agent = await agent_store.create_agent(
            conn,
            workspace_id=server.boot.workspace_id,
            name="broken",
            title="",
            adapter="llm",
            config={"provider": "nowhere", "model": "m"},
            now=svc.clock(),
        )
    task = await new_task(http, server, agent_id=str(agent))
    url = task_url(server, task)
    first = await read_events(http, url, server.auth, markers=True)  # closes: task failed
    assert [(e.id, e.event) for e in first] == [
        (None, "run"),
        ("1.1", "status"),
        ("1.2", "error"),
        ("1.3", "end"),
        (None, "close"),
    ]
    assert first[-2].data == {"status": "failed"}
    assert first[-1].data == {"reason": "task-ended", "status": "failed"}

    fixed = await call(http, server, "PATCH", f"/api/v1/agents/{agent}", body={"config": SIMULATED})
    assert fixed.status == 200, fixed.text
    assert (await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/retry")).status == 201
    whole = await read_events(http, url, server.auth, markers=True)  # run 2 live, then closes

    runs = (await call(http, server, "GET", f"/api/v1/tasks/{task['id']}/runs")).body["items"]
    assert [r["status"] for r in runs] == ["failed", "done"]
    run2 = (None, "run", {"run_id": runs[1]["id"], "number": 2})
    assert triples(whole[:5]) == [*triples(first[:4]), run2]
    second = whole[5:-1]
    assert [e.id for e in second] == [f"2.{i}" for i in range(1, len(second) + 1)]
    assert second[-1].event == "end" and second[-1].data == {"status": "done"}
    assert text_of(second) == expected_text(server, PROMPT)
    assert triples(whole[-1:]) == [(None, "close", {"reason": "task-ended", "status": "done"})]
    # The same run read on its own has the same events, numbered by seq alone.
    alone = await read_events(http, run_url(server, runs[1]["id"]), server.auth)
    assert [(f"2.{e.id}", e.event, e.data) for e in alone] == triples(second)

    resumed = await read_events(http, url, {**server.auth, "Last-Event-ID": "1.3"}, markers=True)
    assert triples([e for e in resumed if e.id]) == triples(second)  # starts at run 2
    first_id = next(i for i, e in enumerate(resumed) if e.id)
    assert resumed[first_id - 1].event == "run" and resumed[first_id - 1].data["number"] == 2
    assert resumed[-1].event == "close"
    mid = await read_events(http, url, {**server.auth, "Last-Event-ID": "2.2"})
    assert triples(mid) == triples(second[2:])
    await subscribers_drop_to(server, 0)


# --- subscriber limits ----------------------------------------------------------------------


@pytest.mark.with_settings(worker_enabled=False, sse_max_subscribers=1)
async def test_streams_beyond_the_servers_limit_get_503_until_one_closes(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    urls = (task_url(server, task), run_url(server, task["run"]["id"]))
    held = await open_stream(http, urls[0], server.auth)
    assert (await held.content.readline()).startswith(b"event: run")
    assert server.services.bus.subscriber_count == 1
    for url in urls:
        async with http.get(url, headers=server.auth) as resp:
            body = await problem_of(resp, 503)
            assert int(resp.headers["Retry-After"]) >= 1
        assert body["type"].endswith("/unavailable") and "live streams" in body["detail"]
    held.close()  # the client goes mid-stream
    await subscribers_drop_to(server, 0)
    again = await open_stream(http, urls[1], server.auth)
    assert server.services.bus.subscriber_count == 1
    again.close()
    await subscribers_drop_to(server, 0)


@pytest.mark.with_settings(worker_enabled=False, sse_max_subscribers_per_workspace=1)
async def test_streams_beyond_a_workspaces_limit_get_429_until_one_closes(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    held = await open_stream(http, task_url(server, task), server.auth)
    for url in (task_url(server, task), run_url(server, task["run"]["id"])):
        async with http.get(url, headers=server.auth) as resp:
            body = await problem_of(resp, 429)
            assert int(resp.headers["Retry-After"]) >= 1
        assert body["type"].endswith("/rate-limited") and "workspace" in body["detail"]
    # Another workspace has a share of its own.
    their_task, _, their_key = await other_workspace_task(server)
    theirs = await open_stream(
        http, f"{server.base_url}/api/v1/tasks/{their_task}/events", bearer(their_key)
    )
    assert server.services.bus.subscriber_count == 2
    held.close()
    await subscribers_drop_to(server, 1)
    again = await open_stream(http, run_url(server, task["run"]["id"]), server.auth)
    again.close()
    theirs.close()
    await subscribers_drop_to(server, 0)


# --- clients that stall or go ---------------------------------------------------------------


@pytest.mark.with_settings(worker_enabled=False, sse_write_timeout_s=1.0, sse_keepalive_s=0.05)
async def test_a_client_that_stops_reading_is_dropped(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    reader, writer = await raw_stream(server, f"/api/v1/tasks/{task['id']}/events", rcvbuf=4096)
    try:
        await subscribers_drop_to(server, 1)
        # Keep-alives alone would take hours to fill the socket buffers: publish large live
        # events, each the next seq of the task's queued run, so the stream forwards them all.
        run_id, task_id = uuid.UUID(task["run"]["id"]), uuid.UUID(task["id"])
        blob = "x" * (256 * 1024)
        bus = server.services.bus
        seq = 0
        deadline = time.monotonic() + 20
        while bus.subscriber_count:
            assert time.monotonic() < deadline, f"still subscribed after {seq} events"
            seq += 1
            bus.publish([RunEvent(run_id, task_id, seq, EventKind.TEXT, {"text": blob})])
            await asyncio.sleep(0.02)
        # What the client had not taken is gone with the stream; the connection ends.
        async with asyncio.timeout(10):
            while await reader.read(1 << 20):
                pass
    finally:
        writer.close()
    # The server is fine, and the client resumes from the store (nothing was stored).
    resumed = await open_stream(http, task_url(server, task), {**server.auth})
    assert (await resumed.content.readline()).startswith(b"event: run")
    resumed.close()
    await subscribers_drop_to(server, 0)


@pytest.mark.with_settings(worker_enabled=False)
async def test_clients_that_go_mid_stream_release_their_subscriptions(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    path = f"/api/v1/tasks/{task['id']}/events"
    urls = (task_url(server, task), run_url(server, task["run"]["id"]))

    async def polite(i: int) -> aiohttp.ClientResponse:
        resp = await open_stream(http, urls[i % 2], server.auth)
        if i % 2 == 0:
            assert (await resp.content.readline()).startswith(b"event: run")
        return resp

    held = await asyncio.gather(*(polite(i) for i in range(40)))
    raw = [await raw_stream(server, path) for _ in range(10)]
    for reader, _ in raw:
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    await subscribers_drop_to(server, 50)
    for resp in held:
        resp.close()
    for _, writer in raw:  # an abortive close: a reset, not a FIN
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    await subscribers_drop_to(server, 0)
    # Nothing is left half-open: the same number can be opened again.
    again = await asyncio.gather(*(polite(i) for i in range(50)))
    await subscribers_drop_to(server, 50)
    for resp in again:
        resp.close()
    await subscribers_drop_to(server, 0)
