"""Run events: append in batches, read back after a sequence number."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import orjson
import sqlalchemy as sa

from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.status import TERMINAL_RUN, RunStatus
from bullpen.store.base import Connection
from bullpen.store.tables import UTCDateTime, run_events, runs, tasks

_INSERT = run_events.insert()
# A batch of events as arrays, one a column, unnested by the statements below.
_EVENT_ARRAYS = (
    sa.bindparam("runs", type_=sa.ARRAY(sa.Uuid)),
    sa.bindparam("seqs", type_=sa.ARRAY(sa.Integer)),
    sa.bindparam("workspaces", type_=sa.ARRAY(sa.Uuid)),
    sa.bindparam("tasks", type_=sa.ARRAY(sa.Uuid)),
    sa.bindparam("kinds", type_=sa.ARRAY(sa.String)),
    sa.bindparam("datas", type_=sa.ARRAY(sa.Text)),
    sa.bindparam("now", type_=UTCDateTime),
)
_PG_APPEND = sa.text(
    "INSERT INTO run_events (run_id, seq, workspace_id, task_id, kind, data, created_at) "
    "SELECT r, s, w, t, k, CAST(d AS jsonb), :now FROM unnest(:runs, :seqs, :workspaces, "
    ":tasks, :kinds, :datas) AS u(r, s, w, t, k, d)"
).bindparams(*_EVENT_ARRAYS)


def _arrays(
    events: Sequence[RunEvent], workspace_ids: Sequence[UUID], now: datetime
) -> dict[str, object]:
    return {
        "runs": [ev.run_id for ev in events],
        "seqs": [ev.seq for ev in events],
        "workspaces": list(workspace_ids),
        "tasks": [ev.task_id for ev in events],
        "kinds": [ev.kind.value for ev in events],
        "datas": [orjson.dumps(ev.data).decode() for ev in events],
        "now": now,
    }


async def append(
    conn: Connection, events: Sequence[RunEvent], workspace_ids: Sequence[UUID], now: datetime
) -> None:
    """Insert many events in one statement."""
    if not events:
        return
    if conn.dialect.name == "postgresql":
        # One statement of fixed text, whatever the batch size: prepared once, and a few
        # arrays to bind instead of seven parameters a row (a group commit carries hundreds).
        await conn.execute(
            _PG_APPEND,
            {
                **_arrays(events, workspace_ids, now),
            },
        )
        return
    await conn.execute(
        _INSERT,
        [
            {
                "run_id": ev.run_id,
                "seq": ev.seq,
                "workspace_id": ws,
                "task_id": ev.task_id,
                "kind": ev.kind.value,
                "data": ev.data,
                "created_at": now,
            }
            for ev, ws in zip(events, workspace_ids, strict=True)
        ],
    )


# The fence and the insert in one statement: the runs of fenced events that their attempt
# still holds are share-locked (in id order, so concurrent lockers cannot deadlock) for the
# statement's transaction, a fenced event is inserted only if its attempt holds its run, and
# the holders come back. Run alone it is one round trip for a whole group commit.
_PG_APPEND_FENCED = sa.text(
    "WITH held AS (SELECT id, attempt FROM runs WHERE id = ANY(:fenced) "
    "AND status = :running ORDER BY id FOR SHARE), "
    "ins AS (INSERT INTO run_events (run_id, seq, workspace_id, task_id, kind, data, created_at) "
    "SELECT r, s, w, t, k, CAST(d AS jsonb), :now FROM unnest(:runs, :seqs, :workspaces, "
    ":tasks, :kinds, :datas, :attempts) AS u(r, s, w, t, k, d, a) "
    "WHERE a IS NULL OR EXISTS (SELECT 1 FROM held WHERE held.id = u.r AND held.attempt = u.a)) "
    "SELECT id, attempt FROM held"
).bindparams(
    sa.bindparam("fenced", type_=sa.ARRAY(sa.Uuid)),
    sa.bindparam("running", value=RunStatus.RUNNING.value, type_=sa.String),
    sa.bindparam("attempts", type_=sa.ARRAY(sa.Integer)),
    *_EVENT_ARRAYS,
)


async def append_fenced(
    conn: Connection,
    events: Sequence[RunEvent],
    workspace_ids: Sequence[UUID],
    attempts: Sequence[int | None],
    now: datetime,
) -> dict[UUID, int]:
    """Insert the events whose attempt (None: not fenced) still holds its run; returns the
    attempt holding each running run among the fenced ones (`run_store.holders`).

    PostgreSQL: one statement, the held runs share-locked until the transaction ends, so no
    re-queue or claim slips in between the check and the insert (see `_PG_APPEND_FENCED`).
    SQLite: the check, then the insert of what passed it, in the caller's write transaction
    (one writer at a time).
    """
    fenced = list({ev.run_id for ev, a in zip(events, attempts, strict=True) if a is not None})
    if conn.dialect.name == "postgresql":
        if not events:
            return {}
        rows = await conn.execute(
            _PG_APPEND_FENCED,
            {
                "fenced": fenced,
                **_arrays(events, workspace_ids, now),
                "attempts": list(attempts),
            },
        )
        return {row.id: int(row.attempt) for row in rows}
    held: dict[UUID, int] = {}
    if fenced:
        query = sa.select(runs.c.id, runs.c.attempt).where(
            runs.c.id.in_(fenced), runs.c.status == RunStatus.RUNNING.value
        )
        held = {row.id: int(row.attempt) for row in await conn.execute(query)}
    kept = [
        (ev, ws)
        for ev, ws, a in zip(events, workspace_ids, attempts, strict=True)
        if a is None or held.get(ev.run_id) == a
    ]
    await append(conn, [ev for ev, _ in kept], [ws for _, ws in kept], now)
    return held


async def last_seq(conn: Connection, run_id: UUID) -> int:
    """The highest stored seq of a run (0 when it has none)."""
    value = (
        await conn.execute(
            sa.select(sa.func.max(run_events.c.seq)).where(run_events.c.run_id == run_id)
        )
    ).scalar_one_or_none()
    return int(value or 0)


async def last_seqs(conn: Connection, run_ids: Sequence[UUID]) -> dict[UUID, int]:
    """`last_seq` of many runs in one query (runs without events are left out)."""
    if not run_ids:
        return {}
    rows = await conn.execute(
        sa.select(run_events.c.run_id, sa.func.max(run_events.c.seq).label("seq"))
        .where(run_events.c.run_id.in_(run_ids))
        .group_by(run_events.c.run_id)
    )
    return {row.run_id: int(row.seq) for row in rows}


# A task's status (None: gone) and its runs' ids, oldest first.
TaskRuns = tuple[str | None, list[UUID]]


async def task_runs(conn: Connection, task_id: UUID, workspace_id: UUID | None = None) -> TaskRuns:
    """The task's status (None once it is gone, or if it is not `workspace_id`'s) and its runs,
    oldest first (a task stream's run numbers are positions here), in one statement."""
    query = (
        sa.select(tasks.c.status, runs.c.id)
        .select_from(tasks.outerjoin(runs, runs.c.task_id == tasks.c.id))
        .where(tasks.c.id == task_id)
        .order_by(runs.c.queued_at, runs.c.id)
    )
    if workspace_id is not None:
        query = query.where(tasks.c.workspace_id == workspace_id)
    rows = (await conn.execute(query)).all()
    if not rows:
        return None, []
    return rows[0].status, [row.id for row in rows if row.id is not None]


async def after(conn: Connection, *, run_id: UUID, after_seq: int, limit: int) -> list[RunEvent]:
    """Up to `limit` stored events of a run with seq > after_seq, in order."""
    result = await conn.execute(
        sa.select(run_events.c.seq, run_events.c.task_id, run_events.c.kind, run_events.c.data)
        .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq)
        .order_by(run_events.c.seq)
        .limit(limit)
    )
    return [
        RunEvent(
            run_id=run_id,
            task_id=row.task_id,
            seq=row.seq,
            kind=EventKind(row.kind),
            data=dict(row.data),
        )
        for row in result
    ]


async def end_seq(conn: Connection, run_id: UUID) -> int | None:
    """The seq of the run's `end` event, or None while it has not ended."""
    value = (
        await conn.execute(
            sa.select(run_events.c.seq).where(
                run_events.c.run_id == run_id, run_events.c.kind == EventKind.END.value
            )
        )
    ).scalar_one_or_none()
    return None if value is None else int(value)


async def delete_expired(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` events stored before `cutoff` of runs that have ended (a run
    still going keeps its events: its seq continues from them); returns how many."""
    e = run_events.c
    doomed = (
        sa.select(e.run_id, e.seq)
        .join(runs, runs.c.id == e.run_id)
        .where(
            e.created_at < cutoff,
            runs.c.status.in_([s.value for s in TERMINAL_RUN]),
        )
        .order_by(e.created_at)
        .limit(limit)
    )
    result = await conn.execute(run_events.delete().where(sa.tuple_(e.run_id, e.seq).in_(doomed)))
    return int(result.rowcount)


# What a run's timeline shows; text deltas are its output, read by the stream instead.
STEP_KINDS = (
    EventKind.STATUS,
    EventKind.TOOL_CALL,
    EventKind.TOOL_RESULT,
    EventKind.ERROR,
    EventKind.USAGE,
)


async def steps_of(conn: Connection, run_ids: Sequence[UUID], limit: int) -> list[RunEvent]:
    """Up to `limit` of the runs' status, tool, usage and error events, by run then seq (the
    primary key serves it: no text delta is read)."""
    if not run_ids:
        return []
    e = run_events.c
    result = await conn.execute(
        sa.select(e.run_id, e.seq, e.task_id, e.kind, e.data)
        .where(e.run_id.in_(run_ids), e.kind.in_([k.value for k in STEP_KINDS]))
        .order_by(e.run_id, e.seq)
        .limit(limit)
    )
    return [
        RunEvent(
            run_id=row.run_id,
            task_id=row.task_id,
            seq=row.seq,
            kind=EventKind(row.kind),
            data=dict(row.data),
        )
        for row in result
    ]
