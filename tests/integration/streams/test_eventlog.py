"""The event log on both backends: coalescing, gap-free seq, the urgent first text, final commit."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import sqlalchemy as sa

from bullpen.domain.events import EventKind
from bullpen.store import claims as claim_store
from bullpen.store import events as event_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import run_events, runs
from bullpen.streams.bus.memory import MemoryBus
from bullpen.streams.eventlog import EventLog, RunWriter
from tests.support.seed import NOW, new_task, workspace_with_agent

LEASE = timedelta(seconds=60)


async def _run(store: Store, slug: str = "w") -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    ws, agent = await workspace_with_agent(store, slug)
    task_id, run_id = await new_task(store, ws, agent)
    return ws, task_id, run_id


async def _stored_kinds(store: Store, run_id: uuid.UUID) -> list[tuple[int, EventKind]]:
    """(seq, kind) of the run's stored events, in order."""
    async with store.read() as conn:
        events = await event_store.after(conn, run_id=run_id, after_seq=0, limit=20)
    return [(e.seq, e.kind) for e in events]


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


async def test_a_group_commit_stores_only_the_writers_whose_attempt_holds_its_run(
    store: Store,
) -> None:
    """Fencing within one group commit (one statement on PostgreSQL): the attempt that holds
    its run has its events stored; a stale attempt of another run is refused and told so, and
    nothing of it is stored; an unfenced writer is stored whatever the runs' state."""
    ws, task_a, run_a = await _run(store, "a")
    _, task_b, run_b = await _run(store, "b")
    _, task_c, run_c = await _run(store, "c")
    async with store.write() as conn:
        claimed = (await claim_store.claim(conn, owner="w", limit=3, now=NOW, lease=LEASE)).runs
    attempts = {run.id: run.attempt for run in claimed}
    assert set(attempts) == {run_a, run_b, run_c}
    lost: list[str] = []
    bus = MemoryBus()
    async with EventLog(store, bus, coalesce_s=0.05, clock=lambda: NOW) as log:
        holder = log.writer(run_a, task_a, ws, 0, attempt=attempts[run_a])
        stale = log.writer(
            run_b, task_b, ws, 0, attempt=attempts[run_b] + 1, on_lost=lambda: lost.append("b")
        )
        unfenced = log.writer(run_c, task_c, ws, 0)
        for writer, text in ((holder, "kept"), (stale, "refused"), (unfenced, "free")):
            writer.text(text)
        await log.flush(holder)
        await log.flush(unfenced)
    async with store.read() as conn:
        stored = {
            run: [e.data for e in await event_store.after(conn, run_id=run, after_seq=0, limit=9)]
            for run in (run_a, run_b, run_c)
        }
    assert stored == {run_a: [{"text": "kept"}], run_b: [], run_c: [{"text": "free"}]}
    assert lost == ["b"] and stale.lost and not holder.lost


class HeldEnd:
    """A run's end whose transaction, once open, stays open until `release` is set."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def change(self, conn: Connection) -> bool:
        self.entered.set()
        await self.release.wait()
        return True

    def commit(self, log: EventLog, writer: RunWriter) -> asyncio.Task[bool]:
        """Ask for the writer's end, in a task (`entered` is set once its transaction is open)."""
        return asyncio.create_task(
            log.commit_final(writer, EventKind.END, {"status": "done"}, self.change, urgent=True)
        )


async def test_a_writers_events_and_its_end_commit_in_order_behind_another_runs_end(
    store: Store,
) -> None:
    """A run's events and its end asked for while another run's end is committing: they wait
    for it, and the log and the bus hold them in seq order, the end last."""
    ws, task_a, run_a = await _run(store, "a")
    _, task_b, run_b = await _run(store, "b")
    held = HeldEnd()

    async def accepted(conn: Connection) -> bool:
        return True

    bus = MemoryBus()
    with bus.open(task_b, ws) as live:
        async with EventLog(store, bus, coalesce_s=0.0, clock=lambda: NOW) as log:
            holding = held.commit(log, log.writer(run_a, task_a, ws, last_seq=0))
            await asyncio.wait_for(held.entered.wait(), 5)
            b = log.writer(run_b, task_b, ws, last_seq=0)
            for word in ("one", "two", "three"):
                b.text(word)
                b.emit(EventKind.USAGE, {"word": word})
            ended = asyncio.create_task(
                log.commit_final(b, EventKind.END, {"status": "done"}, accepted)
            )
            await asyncio.sleep(0.1)
            held.release.set()
            assert await holding and await ended
            await log.flush(b)
            got = []
            while (event := await live.get(0.5)) is not None:
                got.append(event)
    stored = await _stored_kinds(store, run_b)
    assert stored == [
        *((n, EventKind.TEXT if n % 2 else EventKind.USAGE) for n in range(1, 7)),
        (7, EventKind.END),
    ]
    assert [(e.seq, e.kind) for e in got] == stored


class _ReplyLost:
    """The store, except that the first `autocommit()` fails after its statement committed:
    the database has the rows, the event log only an error (a reply lost on the wire)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.lost = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    @contextlib.asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Connection]:
        async with self._store.write() as conn:
            yield conn
        if not self.lost:
            self.lost += 1
            raise ConnectionResetError("the reply to COMMIT was lost")


async def test_a_commit_whose_reply_was_lost_is_not_stored_twice(store: Store) -> None:
    """The first commit of a fenced writer's events lands but its caller hears an error. The
    next commits send only what is not stored: the run's later events and its end commit, and
    the log and the bus hold each seq once, in order."""
    ws, task_id, run_id = await _run(store)
    async with store.write() as conn:
        (claimed,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
    flaky = _ReplyLost(store)

    async def accepted(conn: Connection) -> bool:
        return True

    bus = MemoryBus()
    with bus.open(task_id, ws) as live:
        async with EventLog(flaky, bus, coalesce_s=0.0, clock=lambda: NOW) as log:  # type: ignore[arg-type]
            writer = log.writer(run_id, task_id, ws, last_seq=0, attempt=claimed.attempt)
            writer.emit(EventKind.STATUS, {"status": "running"})
            writer.text("stored once")
            await log.flush(writer)
            writer.emit(EventKind.USAGE, {"output_tokens": 2})
            async with asyncio.timeout(10):
                assert await log.commit_final(writer, EventKind.END, {"status": "done"}, accepted)
            got = []
            while (event := await live.get(0.5)) is not None:
                got.append(event)
    assert flaky.lost == 1 and not writer.lost
    stored = await _stored_kinds(store, run_id)
    assert stored == [
        (1, EventKind.STATUS),
        (2, EventKind.TEXT),
        (3, EventKind.USAGE),
        (4, EventKind.END),
    ]
    assert [(e.seq, e.kind) for e in got] == stored


async def test_after_a_lost_reply_a_writer_whose_attempt_lost_the_run_is_told(
    store: Store,
) -> None:
    """What the lost commit stored is not sent again, and a writer whose run another attempt
    took meanwhile is refused rather than published as if its events were stored now."""
    ws, task_id, run_id = await _run(store)
    async with store.write() as conn:
        (claimed,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
    flaky = _ReplyLost(store)
    lost: list[bool] = []
    bus = MemoryBus()
    async with EventLog(flaky, bus, coalesce_s=0.0, clock=lambda: NOW) as log:  # type: ignore[arg-type]
        writer = log.writer(
            run_id, task_id, ws, 0, attempt=claimed.attempt, on_lost=lambda: lost.append(True)
        )
        writer.text("stored by the lost commit")
        # Another attempt takes the run before the log sends again (it waits 0.5 s).
        await asyncio.sleep(0.1)
        async with store.write() as conn:
            await conn.execute(
                runs.update().where(runs.c.id == run_id).values(attempt=runs.c.attempt + 1)
            )
        await log.flush(writer)
    assert flaky.lost == 1 and lost == [True] and writer.lost
    async with store.read() as conn:
        stored = await event_store.after(conn, run_id=run_id, after_seq=0, limit=20)
    assert [(e.seq, e.data) for e in stored] == [(1, {"text": "stored by the lost commit"})]
