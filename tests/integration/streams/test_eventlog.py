"""The event log on both backends: coalescing, gap-free seq, the urgent first text, final commit."""

from __future__ import annotations

import asyncio
import uuid

import sqlalchemy as sa

from bullpen.domain.events import EventKind
from bullpen.store import events as event_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import run_events
from bullpen.streams.bus.memory import MemoryBus
from bullpen.streams.eventlog import EventLog
from tests.support.seed import NOW, new_task, workspace_with_agent


async def _run(store: Store, slug: str = "w") -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    ws, agent = await workspace_with_agent(store, slug)
    task_id, run_id = await new_task(store, ws, agent)
    return ws, task_id, run_id


async def test_deltas_coalesce_into_gap_free_events(store: Store) -> None:
    ws, task_id, run_id = await _run(store)
    bus = MemoryBus()
    with bus.open(task_id, ws) as live:
        async with EventLog(store, bus, coalesce_s=0.05, clock=lambda: NOW) as log:
            writer = log.writer(run_id, task_id, ws, last_seq=0)
            writer.emit(EventKind.STATUS, {"status": "running"})
            for word in ["a", "b", "c", "d"]:
                writer.text(word)
            writer.emit(EventKind.USAGE, {"output_tokens": 4})
            writer.text("e")
            await log.flush(writer)
            got = [await live.get(1.0) for _ in range(4)]
    async with store.read() as conn:
        stored = await event_store.after(conn, run_id=run_id, after_seq=0, limit=100)
    assert [(e.seq, e.kind, e.data) for e in stored] == [
        (1, EventKind.STATUS, {"status": "running"}),
        (2, EventKind.TEXT, {"text": "abcd"}),
        (3, EventKind.USAGE, {"output_tokens": 4}),
        (4, EventKind.TEXT, {"text": "e"}),
    ]
    assert [e.seq for e in got if e is not None] == [1, 2, 3, 4]


async def test_a_first_text_does_not_wait_out_another_runs_window(store: Store) -> None:
    ws, task_a, run_a = await _run(store, "a")
    _, task_b, run_b = await _run(store, "b")
    bus = MemoryBus()
    window = 5.0  # far longer than the test may take
    with bus.open(task_b, ws) as live:
        async with EventLog(store, bus, coalesce_s=window, clock=lambda: NOW) as log:
            a = log.writer(run_a, task_a, ws, last_seq=0)
            a.emit(EventKind.STATUS, {"status": "running"})  # opens a coalescing window
            await asyncio.sleep(0.05)
            b = log.writer(run_b, task_b, ws, last_seq=0)
            b.text("first")
            started = asyncio.get_running_loop().time()
            event = await live.get(window / 2)
            waited = asyncio.get_running_loop().time() - started
    assert event is not None and event.data == {"text": "first"}
    assert waited < window / 2


async def test_final_event_commits_only_with_its_state_change(store: Store) -> None:
    ws, task_id, run_id = await _run(store)
    bus = MemoryBus()

    async def refused(conn: Connection) -> bool:
        return False

    async def accepted(conn: Connection) -> bool:
        return True

    async with EventLog(store, bus, coalesce_s=0.0, clock=lambda: NOW) as log:
        writer = log.writer(run_id, task_id, ws, last_seq=0)
        writer.text("partial")
        assert not await log.commit_final(writer, EventKind.END, {"status": "done"}, refused)
        second = log.writer(run_id, task_id, ws, last_seq=1)
        assert await log.commit_final(second, EventKind.END, {"status": "done"}, accepted)
    async with store.read() as conn:
        kinds = [
            row.kind
            for row in await conn.execute(sa.select(run_events.c.kind).order_by(run_events.c.seq))
        ]
    assert kinds == ["text", "end"]
