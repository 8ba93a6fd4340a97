"""The cleanup job on both backends: expired run events of ended runs go, in bounded batches;
a run still going keeps its events however old, and newer events stay."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.status import RunStatus
from bullpen.services.housekeeping import Retention, sweep
from bullpen.store import events as event_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import run_events, runs
from tests.integration.seed import NOW, new_task, workspace_with_agent

EVENTS = "run_events"  # what `sweep` counts them as
KEEP = Retention(events=timedelta(days=30), event_batch=100)
OLD = NOW - timedelta(days=40)
RECENT = NOW - timedelta(days=1)


async def run_in(store: Store, ws: uuid.UUID, agent: uuid.UUID, status: RunStatus) -> RunEvent:
    """A new task's run put in `status`; returns a template event of it (seq 0)."""
    task_id, run_id = await new_task(store, ws, agent, OLD - timedelta(days=1))
    async with store.write() as conn:
        await conn.execute(runs.update().where(runs.c.id == run_id).values(status=status.value))
    return RunEvent(run_id, task_id, 0, EventKind.TEXT, {})


async def write_events(
    store: Store, ws: uuid.UUID, run: RunEvent, seqs: range, when: datetime
) -> None:
    """Events of `run` with these seqs, stored as of `when`."""
    events = [RunEvent(run.run_id, run.task_id, s, EventKind.TEXT, {"text": f"t{s}"}) for s in seqs]
    async with store.write() as conn:
        await event_store.append(conn, events, [ws] * len(events), when)


async def seqs_of(store: Store, run: RunEvent) -> list[int]:
    async with store.read() as conn:
        result = await conn.execute(
            sa.select(run_events.c.seq)
            .where(run_events.c.run_id == run.run_id)
            .order_by(run_events.c.seq)
        )
        return list(result.scalars())


async def test_expired_events_of_ended_runs_go_and_the_rest_stay(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    made = {status: await run_in(store, ws, agent, status) for status in RunStatus}
    cutoff = NOW - KEEP.events
    for run in made.values():
        await write_events(store, ws, run, range(1, 4), OLD)
        await write_events(store, ws, run, range(4, 5), cutoff)  # exactly at the cutoff: kept
        await write_events(store, ws, run, range(5, 7), RECENT)

    swept = await sweep(store, NOW, KEEP)
    assert swept[EVENTS] == 3 * 3  # done, failed, cancelled: 3 old events each

    for status, run in made.items():
        kept = await seqs_of(store, run)
        if status in (RunStatus.QUEUED, RunStatus.RUNNING):  # still going: its seq goes on
            assert kept == [1, 2, 3, 4, 5, 6], status
        else:
            assert kept == [4, 5, 6], status
    assert (await sweep(store, NOW, KEEP))[EVENTS] == 0  # nothing more has expired
    # A month on, the rest of the ended runs' events go too; the live runs keep theirs.
    assert (await sweep(store, NOW + timedelta(days=31), KEEP))[EVENTS] == 3 * 3
    assert [await seqs_of(store, run) for run in made.values()] == [
        [1, 2, 3, 4, 5, 6] if s in (RunStatus.QUEUED, RunStatus.RUNNING) else [] for s in made
    ]


async def test_a_large_backlog_is_deleted_in_bounded_transactions(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, agent = await workspace_with_agent(store)
    done = await run_in(store, ws, agent, RunStatus.DONE)
    running = await run_in(store, ws, agent, RunStatus.RUNNING)
    await write_events(store, ws, done, range(1, 251), OLD)
    await write_events(store, ws, done, range(251, 256), RECENT)
    await write_events(store, ws, running, range(1, 31), OLD)

    batches: list[int] = []
    delete = event_store.delete_expired

    async def counted_delete(conn: Connection, cutoff: datetime, limit: int) -> int:
        deleted = await delete(conn, cutoff, limit)
        batches.append(deleted)
        return deleted

    transactions = 0
    write: Callable[[], AbstractAsyncContextManager[Connection]] = store.write

    def counted_write() -> AbstractAsyncContextManager[Connection]:
        nonlocal transactions
        transactions += 1
        return write()

    monkeypatch.setattr(event_store, "delete_expired", counted_delete)
    monkeypatch.setattr(store, "write", counted_write)
    assert (await sweep(store, NOW, KEEP))[EVENTS] == 250
    assert batches == [100, 100, 50]  # never more than a batch in one transaction
    assert transactions >= len(batches)
    monkeypatch.undo()

    assert await seqs_of(store, done) == list(range(251, 256))
    assert await seqs_of(store, running) == list(range(1, 31))
