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

from bullpen.domain.agents import AgentStatus
from bullpen.domain.records import AgentRecord
from bullpen.domain.status import TERMINAL_TASK
from bullpen.errors import Conflict
from bullpen.store import rollups
from bullpen.store.base import Connection
from bullpen.store.tables import agents, tasks

UPDATABLE = frozenset(
    {
        "name",
        "title",
        "description",
        "config",
        "status",
        "max_concurrent_runs",
        "reports_to",
        "requires_approval",
        "approval_ttl_s",
        "approval_default",
        "breakers",
    }
)
# Columns the service sets with a change (a resume clears the breaker state), never a caller.
_SET_WITH = frozenset({"paused_reason", "breaker_since", "failures_in_a_row"})
# How far up the org chart a new manager is followed when checking for a cycle.
CHAIN_MAX = 1000


async def create_agent(
    conn: Connection,
    *,
    workspace_id: UUID,
    name: str,
    title: str,
    adapter: str,
    config: dict[str, Any],
    now: datetime,
    status: str = AgentStatus.ACTIVE.value,
    max_concurrent_runs: int = 10,
    description: str = "",
    reports_to: UUID | None = None,
    agent_id: UUID | None = None,
    requires_approval: bool = False,
    approval_ttl_s: int | None = None,
    approval_default: str | None = None,
    breakers: dict[str, Any] | None = None,
) -> UUID:
    """Insert an agent and return its id; a taken name is Conflict."""
    agent_id = agent_id or uuid.uuid4()
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
                description=description,
                reports_to=reports_to,
                requires_approval=requires_approval,
                approval_ttl_s=approval_ttl_s,
                approval_default=approval_default,
                breakers=breakers,
                created_at=now,
            )
        )
    except exc.IntegrityError as err:
        raise Conflict(f"an agent named {name!r} already exists in this workspace") from err
    return agent_id


async def get_agent(conn: Connection, workspace_id: UUID, agent_id: UUID) -> AgentRecord | None:
    """The agent with this id in this workspace, or None (another workspace's is None too)."""
    params = {"agent_id": agent_id, "workspace_id": workspace_id}
    row = (await conn.execute(_GET_AGENT, params)).first()
    return None if row is None else AgentRecord.of(row._mapping)


_GET_AGENT = sa.select(agents).where(
    agents.c.id == sa.bindparam("agent_id"), agents.c.workspace_id == sa.bindparam("workspace_id")
)


async def list_agents(conn: Connection, workspace_id: UUID) -> list[AgentRecord]:
    """The workspace's agents by name."""
    result = await conn.execute(
        sa.select(agents).where(agents.c.workspace_id == workspace_id).order_by(agents.c.name)
    )
    return [AgentRecord.of(row._mapping) for row in result]


async def agent_names(conn: Connection, workspace_id: UUID) -> dict[UUID, str]:
    """The workspace's agents' names by id (without reading the rest of each agent)."""
    c = agents.c
    result = await conn.execute(sa.select(c.id, c.name).where(c.workspace_id == workspace_id))
    return {row.id: row.name for row in result}


async def update_agent(
    conn: Connection, workspace_id: UUID, agent_id: UUID, changes: dict[str, Any]
) -> None:
    """Change an agent's updatable columns; a taken name is Conflict."""
    if not changes.keys() <= UPDATABLE | _SET_WITH:
        raise ValueError(f"not updatable: {sorted(changes.keys() - UPDATABLE - _SET_WITH)}")
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
    """Delete an agent (its API keys go by cascade); Conflict while tasks or runs refer to it.
    The ledger keeps its calls without it (`SET NULL`), and so does the `cost_days` rollup."""
    keys = list((await conn.execute(rollups.agent_keys(agent_id))).scalars())
    try:
        result = await conn.execute(
            agents.delete().where(agents.c.id == agent_id, agents.c.workspace_id == workspace_id)
        )
    except exc.IntegrityError as err:
        raise Conflict("the agent has tasks; pause it instead of deleting it") from err
    if int(result.rowcount) != 1:
        return False
    await rollups.forget_agent(conn, workspace_id, agent_id, keys)
    return True


async def managers(conn: Connection, workspace_id: UUID, agent_id: UUID) -> list[UUID]:
    """The chain of command above an agent: its manager, the manager's manager, and so on.

    Stops at a cycle (which the service never lets in) or after CHAIN_MAX agents.
    """
    chain: list[UUID] = []
    current: UUID | None = agent_id
    while current is not None and len(chain) < CHAIN_MAX:
        row = (
            await conn.execute(
                sa.select(agents.c.reports_to).where(
                    agents.c.id == current, agents.c.workspace_id == workspace_id
                )
            )
        ).first()
        current = row.reports_to if row is not None else None
        if current is None or current in chain:
            break
        chain.append(current)
    return chain


async def open_tasks(conn: Connection, agent_id: UUID) -> list[UUID]:
    """The agent's tasks that have not ended (oldest first)."""
    rows = await conn.execute(
        sa.select(tasks.c.id)
        .where(
            tasks.c.agent_id == agent_id,
            tasks.c.status.not_in([s.value for s in TERMINAL_TASK]),
        )
        .order_by(tasks.c.created_at)
    )
    return [row.id for row in rows]


async def reports_of(conn: Connection, workspace_id: UUID, agent_id: UUID) -> list[str]:
    """The names of the agents reporting to `agent_id`."""
    rows = await conn.execute(
        sa.select(agents.c.name)
        .where(agents.c.workspace_id == workspace_id, agents.c.reports_to == agent_id)
        .order_by(agents.c.name)
    )
    return [row.name for row in rows]


async def reports(conn: Connection, workspace_id: UUID, agent_id: UUID) -> list[Any]:
    """The agents of the workspace that report to `agent_id`, by name (id, name, title,
    description, status)."""
    rows = await conn.execute(
        sa.select(
            agents.c.id,
            agents.c.name,
            agents.c.title,
            agents.c.description,
            agents.c.status,
        )
        .where(agents.c.workspace_id == workspace_id, agents.c.reports_to == agent_id)
        .order_by(agents.c.name)
    )
    return list(rows)


async def lock_org_chart(conn: Connection, workspace_id: UUID) -> None:
    """Serialise org chart changes of one workspace until this transaction ends (PostgreSQL;
    SQLite has one writer already)."""
    if conn.dialect.name == "postgresql":
        key = workspace_id.int & 0x7FFF_FFFF_FFFF_FFFF
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))
