"""Routines and their fires: the rows behind scheduled tasks.

Two schedulers never fire one slot twice: `claim_due` hands a due routine to one of them
(PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite has one writer), `advance` moves it on only from
the slot it was claimed at, and a fire row's primary key (routine, slot) refuses a second
claim of the same slot (`INSERT … ON CONFLICT DO NOTHING` on both backends).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.records import RoutineFireRecord, RoutineRecord
from bullpen.errors import Conflict
from bullpen.store.base import Connection, upsert_insert
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import routine_fires, routines

UPDATABLE = frozenset(
    {
        "name",
        "agent_id",
        "cron",
        "timezone",
        "title",
        "prompt",
        "priority",
        "labels",
        "concurrency",
        "catch_up",
        "enabled",
        "next_fire_at",
    }
)


async def create_routine(conn: Connection, values: dict[str, Any], now: datetime) -> UUID:
    """Insert a routine (every column but id and timestamps); a taken name is Conflict."""
    routine_id = uuid.uuid4()
    try:
        await conn.execute(
            routines.insert().values(id=routine_id, created_at=now, updated_at=now, **values)
        )
    except exc.IntegrityError as err:
        raise Conflict(_taken(values.get("name"))) from err
    return routine_id


async def get_routine(
    conn: Connection, workspace_id: UUID, routine_id: UUID
) -> RoutineRecord | None:
    """The routine with this id in this workspace, or None (another workspace's is None too)."""
    query = sa.select(routines).where(
        routines.c.id == routine_id, routines.c.workspace_id == workspace_id
    )
    row = (await conn.execute(query)).first()
    return None if row is None else RoutineRecord.of(row._mapping)


async def list_routines(
    conn: Connection,
    workspace_id: UUID,
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    agent_id: UUID | None = None,
) -> Page[RoutineRecord]:
    """A page of the workspace's routines, oldest first, keyset-paginated."""
    c = routines.c
    query = sa.select(routines).where(c.workspace_id == workspace_id)
    if agent_id is not None:
        query = query.where(c.agent_id == agent_id)
    page = await keyset(
        conn, query, c.created_at, c.id, limit=limit, after=after, newest_first=False
    )
    return page.map(lambda row: RoutineRecord.of(row._mapping))


async def count_routines(conn: Connection, workspace_id: UUID) -> int:
    """How many routines the workspace has."""
    query = sa.select(sa.func.count()).where(routines.c.workspace_id == workspace_id)
    return int((await conn.execute(query)).scalar_one())


async def update_routine(
    conn: Connection, workspace_id: UUID, routine_id: UUID, changes: dict[str, Any], now: datetime
) -> None:
    """Change a routine's updatable columns; a taken name is Conflict."""
    if not changes.keys() <= UPDATABLE:
        raise ValueError(f"not updatable: {sorted(changes.keys() - UPDATABLE)}")
    try:
        await conn.execute(
            routines.update()
            .where(routines.c.id == routine_id, routines.c.workspace_id == workspace_id)
            .values(**changes, updated_at=now)
        )
    except exc.IntegrityError as err:
        raise Conflict(_taken(changes.get("name"))) from err


async def delete_routine(conn: Connection, workspace_id: UUID, routine_id: UUID) -> bool:
    """Delete a routine and its fires; False if it is not in this workspace."""
    result = await conn.execute(
        routines.delete().where(
            routines.c.id == routine_id, routines.c.workspace_id == workspace_id
        )
    )
    return int(result.rowcount) == 1


async def any_due(conn: Connection, now: datetime) -> bool:
    """Whether any routine is due (a cheap read before claiming in a write transaction)."""
    query = sa.select(routines.c.id).where(routines.c.next_fire_at <= now).limit(1)
    return (await conn.execute(query)).first() is not None


async def claim_due(conn: Connection, now: datetime, passed: list[UUID]) -> RoutineRecord | None:
    """The routine due longest ago (not in `passed`), locked for this transaction; or None."""
    query = (
        sa.select(routines)
        .where(routines.c.next_fire_at <= now)
        .order_by(routines.c.next_fire_at)
        .limit(1)
    )
    if passed:
        query = query.where(routines.c.id.not_in(passed))
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    row = (await conn.execute(query)).first()
    return None if row is None else RoutineRecord.of(row._mapping)


async def advance(
    conn: Connection, routine_id: UUID, claimed_at: datetime, next_fire_at: datetime | None
) -> bool:
    """Move a routine's next slot on, only from `claimed_at`; False if it moved meanwhile."""
    result = await conn.execute(
        routines.update()
        .where(routines.c.id == routine_id, routines.c.next_fire_at == claimed_at)
        .values(next_fire_at=next_fire_at)
    )
    return int(result.rowcount) == 1


async def set_last_task(conn: Connection, routine_id: UUID, task_id: UUID) -> None:
    """Remember the task of the routine's latest fire."""
    await conn.execute(
        routines.update().where(routines.c.id == routine_id).values(last_task_id=task_id)
    )


async def claim_slot(
    conn: Connection,
    *,
    routine_id: UUID,
    workspace_id: UUID,
    slot_at: datetime,
    source: str,
    outcome: str,
    detail: str | None,
    now: datetime,
) -> bool:
    """Record the routine's fire of `slot_at`; False if that slot was already recorded."""
    statement = (
        upsert_insert(conn.dialect.name)(routine_fires)
        .values(
            routine_id=routine_id,
            workspace_id=workspace_id,
            slot_at=slot_at,
            source=source,
            outcome=outcome,
            detail=detail,
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=["routine_id", "slot_at"])
    )
    return int((await conn.execute(statement)).rowcount) == 1


async def set_fire_task(
    conn: Connection, routine_id: UUID, slot_at: datetime, task_id: UUID
) -> None:
    """Attach the task a claimed fire created."""
    await conn.execute(
        routine_fires.update()
        .where(routine_fires.c.routine_id == routine_id, routine_fires.c.slot_at == slot_at)
        .values(task_id=task_id)
    )


async def get_fire(conn: Connection, routine_id: UUID, slot_at: datetime) -> RoutineFireRecord:
    """One fire of a routine."""
    query = sa.select(routine_fires).where(
        routine_fires.c.routine_id == routine_id, routine_fires.c.slot_at == slot_at
    )
    return RoutineFireRecord.of((await conn.execute(query)).one()._mapping)


async def list_fires(
    conn: Connection, routine_id: UUID, *, limit: int, after: tuple[datetime, UUID] | None
) -> Page[RoutineFireRecord]:
    """A page of a routine's fires, latest slot first, keyset-paginated on (slot_at, routine)."""
    c = routine_fires.c
    query = sa.select(routine_fires).where(c.routine_id == routine_id)
    page = await keyset(
        conn, query, c.slot_at, c.routine_id, limit=limit, after=after, newest_first=True
    )
    return page.map(lambda row: RoutineFireRecord.of(row._mapping))


async def prune_fires(conn: Connection, routine_id: UUID, keep: int) -> None:
    """Delete a routine's fires older than its `keep` latest (its history stays bounded)."""
    c = routine_fires.c
    oldest_kept = (
        sa.select(c.slot_at)
        .where(c.routine_id == routine_id)
        .order_by(c.slot_at.desc())
        .offset(keep - 1)
        .limit(1)
        .scalar_subquery()
    )
    await conn.execute(
        routine_fires.delete().where(c.routine_id == routine_id, c.slot_at < oldest_kept)
    )


def _taken(name: object) -> str:
    return f"a routine named {name!r} already exists in this workspace"
