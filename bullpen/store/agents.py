"""Agents: who runs a task and how."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.store.base import Connection
from bullpen.store.tables import agents


async def create_agent(
    conn: Connection,
    *,
    workspace_id: UUID,
    name: str,
    title: str,
    adapter: str,
    config: dict[str, Any],
    now: datetime,
) -> UUID:
    """Insert an agent and return its id."""
    agent_id = uuid.uuid4()
    await conn.execute(
        agents.insert().values(
            id=agent_id,
            workspace_id=workspace_id,
            name=name,
            title=title,
            adapter=adapter,
            config=config,
            status="active",
            created_at=now,
        )
    )
    return agent_id


async def get_agent(conn: Connection, workspace_id: UUID, agent_id: UUID) -> Any | None:
    """The agent with this id in this workspace, or None (another workspace's is None too)."""
    return (
        await conn.execute(
            sa.select(agents).where(agents.c.id == agent_id, agents.c.workspace_id == workspace_id)
        )
    ).first()


async def list_agents(conn: Connection, workspace_id: UUID) -> list[Any]:
    """The workspace's agents by name."""
    result = await conn.execute(
        sa.select(agents).where(agents.c.workspace_id == workspace_id).order_by(agents.c.name)
    )
    return list(result)
