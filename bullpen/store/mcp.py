"""MCP servers, and tool steps open while their outside calls run.

Server names are unique per workspace (the constraint, mapped here to Conflict). Header values
are stored only sealed; sealing and opening happen in the service.

An open step is written before the first outside call of a step, each call's state is set
before and after it, and the step's commit deletes the row (`close_step`, in the commit's
transaction): every write is made in the run's fenced transaction by `services.team`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.records.mcp import McpServerRecord, OpenStep
from bullpen.errors import Conflict
from bullpen.store.base import Connection
from bullpen.store.tables import mcp_servers, task_open_steps

UPDATABLE = frozenset({"name", "url", "headers", "command", "env", "timeout_s"})


def _taken(name: str, err: exc.IntegrityError) -> Conflict:
    return Conflict(f"an MCP server named {name!r} already exists here")


async def create_server(
    conn: Connection, *, server_id: UUID, workspace_id: UUID, values: dict[str, Any], now: datetime
) -> None:
    """Insert a server; a taken name is Conflict."""
    try:
        await conn.execute(
            mcp_servers.insert().values(
                id=server_id, workspace_id=workspace_id, created_at=now, updated_at=now, **values
            )
        )
    except exc.IntegrityError as err:
        raise _taken(values["name"], err) from err


async def get_server(
    conn: Connection, workspace_id: UUID, server_id: UUID, *, for_update: bool = False
) -> McpServerRecord | None:
    """The server with this id in this workspace, or None."""
    query = sa.select(mcp_servers).where(
        mcp_servers.c.id == server_id, mcp_servers.c.workspace_id == workspace_id
    )
    if for_update:
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    return McpServerRecord.of(row._mapping) if row is not None else None


async def list_servers(
    conn: Connection, workspace_id: UUID, names: list[str] | None = None
) -> list[McpServerRecord]:
    """The workspace's servers by name (only those named in `names`, if given)."""
    query = sa.select(mcp_servers).where(mcp_servers.c.workspace_id == workspace_id)
    if names is not None:
        query = query.where(mcp_servers.c.name.in_(names))
    result = await conn.execute(query.order_by(mcp_servers.c.name))
    return [McpServerRecord.of(row._mapping) for row in result]


async def update_server(
    conn: Connection, server_id: UUID, changes: dict[str, Any], now: datetime
) -> None:
    """Change a server's fields; a taken name is Conflict."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    try:
        await conn.execute(
            mcp_servers.update()
            .where(mcp_servers.c.id == server_id)
            .values(**changes, updated_at=now)
        )
    except exc.IntegrityError as err:
        raise _taken(str(changes.get("name")), err) from err


async def delete_server(conn: Connection, server_id: UUID) -> None:
    """Delete a server (agents that list it get a tool error for its tools)."""
    await conn.execute(mcp_servers.delete().where(mcp_servers.c.id == server_id))


# ---- open steps ---------------------------------------------------------------------------


async def open_step(
    conn: Connection,
    *,
    task_id: UUID,
    step: int,
    run_id: UUID,
    messages: list[dict[str, Any]],
    calls: list[dict[str, str]],
    cost_usd: float,
    now: datetime,
) -> None:
    """Record a step about to make outside calls (its primary key refuses a second copy)."""
    await conn.execute(
        task_open_steps.insert().values(
            task_id=task_id,
            step=step,
            run_id=run_id,
            messages=messages,
            calls=calls,
            results={},
            cost_usd=cost_usd,
            created_at=now,
        )
    )


async def get_open_step(conn: Connection, task_id: UUID, step: int) -> OpenStep | None:
    """The task's open step `step`, or None."""
    row = (
        await conn.execute(
            sa.select(task_open_steps).where(
                task_open_steps.c.task_id == task_id, task_open_steps.c.step == step
            )
        )
    ).first()
    if row is None:
        return None
    return OpenStep(
        step=row.step,
        messages=list(row.messages),
        calls=list(row.calls),
        results=dict(row.results),
        cost_usd=float(row.cost_usd),
    )


async def set_call(
    conn: Connection, task_id: UUID, step: int, index: int, state: dict[str, Any]
) -> None:
    """Set one call's state in an open step (read, changed and written in the transaction)."""
    where = (task_open_steps.c.task_id == task_id) & (task_open_steps.c.step == step)
    query = sa.select(task_open_steps.c.results).where(where)
    if conn.dialect.name != "sqlite":
        query = query.with_for_update()
    results = (await conn.execute(query)).scalar_one_or_none()
    if results is None:
        raise Conflict("the tool step is no longer open")
    await conn.execute(
        task_open_steps.update().where(where).values(results={**results, str(index): state})
    )


async def close_step(conn: Connection, task_id: UUID, step: int) -> None:
    """Delete an open step (its commit has recorded it in `task_steps`)."""
    await conn.execute(
        task_open_steps.delete().where(
            task_open_steps.c.task_id == task_id, task_open_steps.c.step == step
        )
    )
