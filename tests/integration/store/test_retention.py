"""The cleanup job on both backends: expired run events of ended runs go, in bounded batches;
a run still going keeps its events however old, and newer events stay. Old audit events, usage
ledger rows and ended tasks (with their runs and events) go too; live tasks and the trees
around them stay (issue 19, finding 11a)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from bullpen import app as app_module
from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.status import TERMINAL_TASK, RunStatus, TaskStatus
from bullpen.services.housekeeping import Retention, sweep
from bullpen.settings import Settings
from bullpen.store import audit as audit_store
from bullpen.store import events as event_store
from bullpen.store import gateway as gateway_store
from bullpen.store import retention as retention_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import (
    audit_events,
    cost_events,
    run_events,
    runs,
    task_blockers,
    task_comments,
    tasks,
)
from tests.support.seed import NOW, new_task, workspace_with_agent

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


# Finding 11a: audit events, usage ledger rows and ended tasks (with their runs and events).

DAY = timedelta(days=1)
TASKS = Retention(events=timedelta(days=30), tasks=timedelta(days=90), batch=10)
RUN_OF = {  # the run a task in each status has, as the queue leaves it
    TaskStatus.BACKLOG: RunStatus.CANCELLED,
    TaskStatus.QUEUED: RunStatus.QUEUED,
    TaskStatus.RUNNING: RunStatus.RUNNING,
    TaskStatus.BLOCKED: RunStatus.DONE,
    TaskStatus.AWAITING_APPROVAL: RunStatus.CANCELLED,
    TaskStatus.DONE: RunStatus.DONE,
    TaskStatus.FAILED: RunStatus.FAILED,
    TaskStatus.CANCELLED: RunStatus.CANCELLED,
}


async def audit_at(store: Store, ws: uuid.UUID | None, when: datetime, n: int = 1) -> None:
    async with store.write() as conn:
        for _ in range(n):
            await audit_store.record(
                conn,
                workspace_id=ws,
                actor_type="system",
                actor_id=None,
                action="test.thing",
                target_type="workspace",
                target_id=ws,
                now=when,
            )


async def usage_at(
    store: Store, ws: uuid.UUID, when: datetime, n: int = 1, run_id: uuid.UUID | None = None
) -> None:
    row = {
        "workspace_id": ws,
        "run_id": run_id,
        "agent_id": None,
        "user_id": None,
        "api_key_id": None,
        "provider": "simulated",
        "model": "sim-1",
        "input_tokens": 1,
        "cached_input_tokens": 0,
        "output_tokens": 2,
        "cost_usd": 0.001,
        "created_at": when,
    }
    async with store.write() as conn:
        await gateway_store.record_costs(conn, [row] * n)


async def task_at(
    store: Store,
    ws: uuid.UUID,
    agent: uuid.UUID,
    status: TaskStatus,
    created: datetime,
    ended: datetime | None = None,
    parent: uuid.UUID | None = None,
    run_status: RunStatus | None = None,
) -> tuple[uuid.UUID, uuid.UUID]:
    """A task created at `created`, last changed at `ended` (default: then), in `status`,
    with one run of the matching status; returns (task id, run id)."""
    task_id, run_id = await new_task(store, ws, agent, created)
    async with store.write() as conn:
        await conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(status=(run_status or RUN_OF[status]).value)
        )
        await conn.execute(
            tasks.update()
            .where(tasks.c.id == task_id)
            .values(status=status.value, updated_at=ended or created, parent_id=parent)
        )
    return task_id, run_id


async def count(store: Store, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    async with store.read() as conn:
        query = sa.select(sa.func.count()).select_from(table).where(*where)
        return int((await conn.execute(query)).scalar_one())


async def task_ids(store: Store) -> set[uuid.UUID]:
    async with store.read() as conn:
        return set((await conn.execute(sa.select(tasks.c.id))).scalars())


async def test_by_default_old_audit_usage_and_ended_tasks_go_and_recent_ones_stay(
    store: Store,
) -> None:
    ws, agent = await workspace_with_agent(store)
    await audit_at(store, ws, NOW - 400 * DAY, 2)
    await audit_at(store, None, NOW - 366 * DAY)  # instance-level rows age out too
    await audit_at(store, ws, NOW - 300 * DAY)
    await usage_at(store, ws, NOW - 400 * DAY, 3)
    await usage_at(store, ws, NOW - 300 * DAY)
    old_done, old_run = await task_at(store, ws, agent, TaskStatus.DONE, NOW - 100 * DAY)
    await write_events(
        store, ws, RunEvent(old_run, old_done, 0, EventKind.TEXT, {}), range(1, 4), NOW - 100 * DAY
    )
    async with store.write() as conn:
        await task_store.add_comment(
            conn,
            workspace_id=ws,
            task_id=old_done,
            author_type="system",
            author_id=None,
            body="old",
            now=NOW - 100 * DAY,
        )
    recent_done, _ = await task_at(store, ws, agent, TaskStatus.DONE, NOW - 80 * DAY)
    old_running, _ = await task_at(store, ws, agent, TaskStatus.RUNNING, NOW - 100 * DAY)

    swept = await sweep(store, NOW)  # the documented defaults: 365, 365 and 90 days

    assert swept["audit_events"] == 3 and swept["cost_events"] == 3 and swept["tasks"] == 1
    assert await count(store, audit_events) == 1
    assert await count(store, cost_events) == 1
    assert await task_ids(store) == {recent_done, old_running}
    assert await count(store, runs, runs.c.task_id == old_done) == 0
    assert await count(store, run_events, run_events.c.task_id == old_done) == 0
    assert await count(store, task_comments) == 0
    assert await sweep(store, NOW) == dict.fromkeys(swept, 0)  # nothing more has expired


async def test_zero_keeps_audit_usage_and_tasks_forever(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await audit_at(store, ws, NOW - 4000 * DAY)
    await usage_at(store, ws, NOW - 4000 * DAY)
    done, _ = await task_at(store, ws, agent, TaskStatus.DONE, NOW - 4000 * DAY)
    forever = Retention(audit=None, usage=None, tasks=None)

    swept = await sweep(store, NOW, forever)

    assert not {"audit_events", "cost_events", "tasks"} & swept.keys()
    assert await count(store, audit_events) == await count(store, cost_events) == 1
    assert await task_ids(store) == {done}
    # The settings' 0 is this "forever", and a negative period is refused.
    assert app_module._days(0) is None and app_module._days(2.5) == 2.5 * DAY
    with pytest.raises(ValidationError):
        Settings(task_retention_days=-1)


async def test_only_ended_tasks_go_and_never_from_under_a_live_one(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    old, ancient = NOW - 100 * DAY, NOW - 120 * DAY
    by_status = {s: (await task_at(store, ws, agent, s, old))[0] for s in TaskStatus}
    # Created long ago but ended within the period: kept until its end is old enough.
    ended_lately, _ = await task_at(store, ws, agent, TaskStatus.DONE, old, NOW - 10 * DAY)
    # An ended tree goes whole, bottom up, in one sweep.
    root, _ = await task_at(store, ws, agent, TaskStatus.DONE, ancient)
    child, _ = await task_at(store, ws, agent, TaskStatus.DONE, old, parent=root)
    grandchild, _ = await task_at(store, ws, agent, TaskStatus.FAILED, old, parent=child)
    # A tree with a live subtask: the subtask and its parent stay, the ended sibling goes.
    root2, _ = await task_at(store, ws, agent, TaskStatus.DONE, ancient)
    ended_sibling, _ = await task_at(store, ws, agent, TaskStatus.DONE, old, parent=root2)
    live_child, _ = await task_at(store, ws, agent, TaskStatus.RUNNING, old, parent=root2)
    # A live parent, or one that ended lately, keeps its ended subtasks.
    live_parent, _ = await task_at(store, ws, agent, TaskStatus.BLOCKED, ancient)
    under_live, _ = await task_at(store, ws, agent, TaskStatus.DONE, old, parent=live_parent)
    late_parent, _ = await task_at(store, ws, agent, TaskStatus.DONE, ancient, NOW - DAY)
    under_late, _ = await task_at(store, ws, agent, TaskStatus.DONE, old, parent=late_parent)
    # A blocker of a live task stays; a blocker of an ended one goes with it.
    blocker, _ = await task_at(store, ws, agent, TaskStatus.DONE, old)
    waiting, _ = await task_at(store, ws, agent, TaskStatus.BLOCKED, old)
    blocker2, _ = await task_at(store, ws, agent, TaskStatus.DONE, old)
    ended_dependent, _ = await task_at(store, ws, agent, TaskStatus.CANCELLED, old)
    # An ended task whose run is somehow still going stays until the run ends.
    still_running, _ = await task_at(
        store, ws, agent, TaskStatus.CANCELLED, old, run_status=RunStatus.RUNNING
    )
    async with store.write() as conn:
        await conn.execute(
            task_blockers.insert(),
            [
                {"task_id": waiting, "blocker_id": blocker, "workspace_id": ws, "created_at": old},
                {
                    "task_id": ended_dependent,
                    "blocker_id": blocker2,
                    "workspace_id": ws,
                    "created_at": old,
                },
            ],
        )
    # Usage of a deleted run stays in the ledger (for its own retention), unlinked.
    done_run = await runs_of(store, by_status[TaskStatus.DONE])
    await usage_at(store, ws, NOW - DAY, run_id=done_run[0])

    swept = await sweep(store, NOW, TASKS)

    gone = {
        *(by_status[s] for s in (TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED)),
        *(root, child, grandchild, ended_sibling, blocker2, ended_dependent),
    }
    kept = {
        *(by_status[s] for s in TaskStatus if s not in TERMINAL_TASK),
        *(ended_lately, root2, live_child, live_parent, under_live, late_parent, under_late),
        *(blocker, waiting, still_running),
    }
    assert await task_ids(store) == kept
    assert swept["tasks"] == len(gone)
    assert await count(store, runs, runs.c.task_id.in_(gone)) == 0
    assert await count(store, runs, runs.c.task_id.in_(kept)) == len(kept)
    ledger = await count(store, cost_events, cost_events.c.run_id.is_(None))
    assert ledger == await count(store, cost_events) == 1
    # Once the live tasks end, and a period has passed, the rest goes too.
    async with store.write() as conn:
        await conn.execute(
            runs.update().where(runs.c.task_id.in_(kept)).values(status=RunStatus.DONE.value)
        )
        await conn.execute(
            tasks.update()
            .where(tasks.c.id.in_(kept))
            .values(status=TaskStatus.DONE.value, updated_at=NOW)
        )
    assert (await sweep(store, NOW + 91 * DAY, TASKS))["tasks"] == len(kept)
    assert await task_ids(store) == set()


async def runs_of(store: Store, task_id: uuid.UUID) -> list[uuid.UUID]:
    async with store.read() as conn:
        return list(
            (await conn.execute(sa.select(runs.c.id).where(runs.c.task_id == task_id))).scalars()
        )


@pytest.mark.parametrize(
    ("kind", "function"),
    [
        ("audit_events", "delete_old_audit"),
        ("cost_events", "delete_old_usage"),
        ("tasks", "delete_ended_tasks"),
    ],
)
async def test_retention_deletes_in_bounded_batches(
    store: Store, monkeypatch: pytest.MonkeyPatch, kind: str, function: str
) -> None:
    ws, agent = await workspace_with_agent(store)
    old = NOW - 400 * DAY
    if kind == "audit_events":
        await audit_at(store, ws, old, 25)
        await audit_at(store, ws, NOW, 3)
    elif kind == "cost_events":
        await usage_at(store, ws, old, 25)
        await usage_at(store, ws, NOW, 3)
    else:
        for _ in range(25):
            await task_at(store, ws, agent, TaskStatus.DONE, old)
        for _ in range(3):
            await task_at(store, ws, agent, TaskStatus.DONE, NOW)
    table = {"audit_events": audit_events, "cost_events": cost_events, "tasks": tasks}[kind]

    batches: list[int] = []
    delete = getattr(retention_store, function)

    async def counted(conn: Connection, cutoff: datetime, limit: int) -> int:
        deleted: int = await delete(conn, cutoff, limit)
        batches.append(deleted)
        return deleted

    transactions = 0
    write: Callable[[], AbstractAsyncContextManager[Connection]] = store.write

    def counted_write() -> AbstractAsyncContextManager[Connection]:
        nonlocal transactions
        transactions += 1
        return write()

    monkeypatch.setattr(retention_store, function, counted)
    monkeypatch.setattr(store, "write", counted_write)
    retention = Retention(audit=365 * DAY, usage=365 * DAY, tasks=90 * DAY, batch=10)
    assert (await sweep(store, NOW, retention))[kind] == 25
    monkeypatch.undo()

    # Never more than a batch in one transaction; tasks look once more after a short batch
    # (it may have made parents into leaves).
    assert batches == ([10, 10, 5, 0] if kind == "tasks" else [10, 10, 5])
    assert transactions >= len(batches)
    assert await count(store, table) == 3
