"""The task stream on both backends: a lagging subscriber falls back to the store; keep-alives."""

from __future__ import annotations

import asyncio

from bullpen.domain.events import EventKind
from bullpen.store.base import Connection, Store
from bullpen.streams.bus.memory import Hub, MemoryBus
from bullpen.streams.eventlog import EventLog
from bullpen.streams.sse import KEEPALIVE, TaskCursor, task_stream
from tests.support.seed import NOW, new_task, workspace_with_agent


def _ids(frames: list[bytes]) -> list[str]:
    return [
        f.split(b"\n", 1)[0].removeprefix(b"id: ").decode() for f in frames if f.startswith(b"id: ")
    ]


async def test_a_subscriber_that_falls_behind_still_gets_every_event(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    bus = MemoryBus(Hub(buffer=2))  # tiny: the reader below will overflow it
    frames: list[bytes] = []

    async def accepted(conn: Connection) -> bool:
        return True

    async def slow_reader() -> None:
        with bus.open(task_id, ws) as live:
            stream = task_stream(store, live, task_id, TaskCursor(), keepalive_s=30.0)
            async for frame in stream:
                frames.append(frame)
                if len(frames) == 2:  # the run marker, then the first event
                    await asyncio.sleep(0.5)  # fall behind while the rest is published

    async with EventLog(store, bus, coalesce_s=0.0, clock=lambda: NOW) as log:
        reader = asyncio.create_task(slow_reader())
        await asyncio.sleep(0.05)  # subscribed
        writer = log.writer(run_id, task_id, ws, last_seq=0)
        writer.emit(EventKind.STATUS, {"i": 0})
        await log.flush(writer)
        while not frames:
            await asyncio.sleep(0.01)
        for i in range(1, 50):
            writer.emit(EventKind.STATUS, {"i": i})
            await log.flush(writer)  # each its own commit and publish: 49 > buffer
        await log.commit_final(writer, EventKind.END, {"status": "done"}, accepted)
        async with asyncio.timeout(10):
            while len(_ids(frames)) < 51:
                await asyncio.sleep(0.01)
        # The task itself is still queued (only its run was ended here), so its stream waits
        # for a next run: stop the reader by hand.
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    assert _ids(frames) == [f"1.{i}" for i in range(1, 52)]  # 50 status events, the end
    assert bus.subscriber_count == 0 and bus.hub.lagged_total >= 1


async def test_idle_streams_get_keep_alives(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, _ = await new_task(store, ws, agent)
    bus = MemoryBus()
    with bus.open(task_id, ws) as live:
        stream = task_stream(store, live, task_id, TaskCursor(), keepalive_s=0.05)
        marker = await asyncio.wait_for(anext(stream), 2)
        first = await asyncio.wait_for(anext(stream), 2)
        second = await asyncio.wait_for(anext(stream), 2)
        await stream.aclose()
        assert bus.subscriber_count == 1
    assert marker.startswith(b"event: run\n")
    assert first == second == KEEPALIVE
    assert bus.subscriber_count == 0
