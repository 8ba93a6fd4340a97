"""Agents: who runs a task and how.

A second agent with a workspace's existing name is `Conflict` (the unique constraint, mapped
here), and so is deleting an agent that tasks or runs still refer to.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.errors import Conflict
from bullpen.store.base import Connection
from bullpen.store.tables import agents, tasks

UPDATABLE = frozenset({"name", "title", "config", "status", "max_concurrent_runs"})


async def create_agent(
    conn: Connection,
    *,
    workspace_id: UUID,
    name: str,
    title: str,
    adapter: str,
    config: dict[str, Any],
    now: datetime,
    status: str = "active",
    max_concurrent_runs: int = 10,
) -> UUID:
    """Insert an agent and return its id; a taken name is Conflict."""
    agent_id = uuid.uuid4()
    try:
        await conn.execute(
            agents.insert().values(
                id=agent_id,
                workspace_id=workspace_id,
                name=name,
                title=title,
                adapter=adapter,
                config=config,
                status=status,
                max_concurrent_runs=max_concurrent_runs,
                created_at=now,
            )
        )
    except exc.IntegrityError as err:
        raise Conflict(f"an agent named {name!r} already exists in this workspace") from err
    return agent_id


async def get_agent(conn: Connection, workspace_id: UUID, agent_id: UUID) -> Any | None:
    """The agent with this id in this workspace, or None (another workspace's is None too)."""
    params = {"agent_id": agent_id, "workspace_id": workspace_id}
    return (await conn.execute(_GET_AGENT, params)).first()


_GET_AGENT = sa.select(agents).where(
    agents.c.id == sa.bindparam("agent_id"), agents.c.workspace_id == sa.bindparam("workspace_id")
)


async def list_agents(conn: Connection, workspace_id: UUID) -> list[Any]:
    """The workspace's agents by name."""
    result = await conn.execute(
        sa.select(agents).where(agents.c.workspace_id == workspace_id).order_by(agents.c.name)
    )
    return list(result)


async def update_agent(
    conn: Connection, workspace_id: UUID, agent_id: UUID, changes: dict[str, Any]
) -> None:
    """Change an agent's updatable columns; a taken name is Conflict."""
    if not changes.keys() <= UPDATABLE:
        raise ValueError(f"not updatable: {sorted(changes.keys() - UPDATABLE)}")
    try:
        await conn.execute(
            agents.update()
            .where(agents.c.id == agent_id, agents.c.workspace_id == workspace_id)
            .values(**changes)
        )
    except exc.IntegrityError as err:
        raise Conflict(
            f"an agent named {changes.get('name')!r} already exists in this workspace"
        ) from err


async def has_tasks(conn: Connection, agent_id: UUID) -> bool:
    """Whether any task is assigned to the agent."""
    found = await conn.execute(sa.select(tasks.c.id).where(tasks.c.agent_id == agent_id).limit(1))
    return found.first() is not None


async def delete_agent(conn: Connection, workspace_id: UUID, agent_id: UUID) -> bool:
    """Delete an agent (its API keys go by cascade); Conflict while tasks or runs refer to it."""
    try:
        result = await conn.execute(
            agents.delete().where(agents.c.id == agent_id, agents.c.workspace_id == workspace_id)
        )
    except exc.IntegrityError as err:
        raise Conflict("the agent has tasks; pause it instead of deleting it") from err
    return int(result.rowcount) == 1
