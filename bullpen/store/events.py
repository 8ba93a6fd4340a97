"""Run events: append in batches, read back after a sequence number."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.events import EventKind, RunEvent
from bullpen.store.base import Connection
from bullpen.store.tables import run_events, runs

_INSERT = run_events.insert()


async def append(
    conn: Connection, events: Sequence[RunEvent], workspace_ids: Sequence[UUID], now: datetime
) -> None:
    """Insert many events in one statement (executemany)."""
    if not events:
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


async def last_seq(conn: Connection, run_id: UUID) -> int:
    """The highest stored seq of a run (0 when it has none)."""
    value = (
        await conn.execute(
            sa.select(sa.func.max(run_events.c.seq)).where(run_events.c.run_id == run_id)
        )
    ).scalar_one_or_none()
    return int(value or 0)


async def latest_run_id(conn: Connection, task_id: UUID) -> UUID | None:
    """The task's most recent run."""
    return (
        await conn.execute(
            sa.select(runs.c.id)
            .where(runs.c.task_id == task_id)
            .order_by(runs.c.queued_at.desc())
            .limit(1)
        )
    ).scalar_one_or_none()


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
