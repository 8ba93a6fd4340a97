"""Breakers' reads and writes: an agent's recent starts, failures and spend, and the trip.

`trip_breaker` is the one place an agent is paused by a breaker: the status, the reason and
the audit event (actor `system`) are written in the caller's transaction, so a pause is
recorded with the claim or the run end that caused it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.agents import AgentStatus
from bullpen.store import audit, notices
from bullpen.store.base import UNWATCHED, Connection
from bullpen.store.tables import agents, cost_events, runs

_STARTS = sa.select(sa.func.count()).select_from(
    sa.select(sa.literal(1))
    .where(runs.c.agent_id == sa.bindparam("agent_id"), runs.c.started_at >= sa.bindparam("since"))
    .limit(sa.bindparam("bound"))
    .subquery()
)
# `cost_usd > 0` lets both backends read the partial covering index `ix_cost_events_agent_priced`:
# an agent that costs nothing (the simulated demo agent) has an empty range there.
# The agent's last resume is read here, not taken from the claim: a run in flight across a
# resume must not count the spend from before it.
_RESUMED = (
    sa.select(agents.c.breaker_since)
    .where(agents.c.id == sa.bindparam("agent_id"))
    .scalar_subquery()
)
_SPENT = sa.select(sa.func.coalesce(sa.func.sum(cost_events.c.cost_usd), 0.0)).where(
    cost_events.c.agent_id == sa.bindparam("agent_id"),
    cost_events.c.created_at >= sa.bindparam("since"),
    cost_events.c.created_at >= sa.func.coalesce(_RESUMED, sa.bindparam("since")),
    cost_events.c.cost_usd > 0,
)
# The counter is no part of what caches of agent rows hold (the API key cache reads agents):
# unwatched, so run ends do not empty them (see `UNWATCHED`).
_FAILED = (
    agents.update()
    .where(agents.c.id == sa.bindparam("agent_id"))
    .values(failures_in_a_row=agents.c.failures_in_a_row + 1)
    .returning(agents.c.failures_in_a_row)
    .execution_options(**{UNWATCHED: True})
)
# A success on an agent without failures matches no row, so it writes (and locks) nothing.
_RESET = (
    agents.update()
    .where(agents.c.id == sa.bindparam("agent_id"), agents.c.failures_in_a_row != 0)
    .values(failures_in_a_row=0)
)
_SUCCEEDED = _RESET.execution_options(**{UNWATCHED: True})
_SUCCEEDED_SPENT = _SPENT.add_cte(_RESET.cte("reset")).execution_options(**{UNWATCHED: True})


async def runs_started(conn: Connection, agent_id: UUID, since: datetime, bound: int) -> int:
    """The agent's runs started at or after `since`, counted up to `bound` (an index range)."""
    params = {"agent_id": agent_id, "since": since, "bound": bound}
    return int((await conn.execute(_STARTS, params)).scalar_one())


async def spent(conn: Connection, agent_id: UUID, since: datetime) -> float:
    """What the agent's ledger rows since `since` cost, in USD."""
    params = {"agent_id": agent_id, "since": since}
    return float((await conn.execute(_SPENT, params)).scalar_one())


async def run_failed(conn: Connection, agent_id: UUID) -> int:
    """Count one more failed run in a row; the agent's failures in a row now."""
    found = (await conn.execute(_FAILED, {"agent_id": agent_id})).scalar_one_or_none()
    return int(found or 0)


async def run_succeeded(conn: Connection, agent_id: UUID) -> None:
    """A run ended well: the agent's failures in a row start again from zero."""
    await conn.execute(_SUCCEEDED, {"agent_id": agent_id})


async def succeeded_and_spent(conn: Connection, agent_id: UUID, since: datetime) -> float:
    """`run_succeeded`, then `spent`: on PostgreSQL in one statement (the update rides in a
    CTE, which runs whether or not the query reads it), one round trip fewer per run's end."""
    params = {"agent_id": agent_id, "since": since}
    if conn.dialect.name != "postgresql":
        await conn.execute(_SUCCEEDED, {"agent_id": agent_id})
        return await spent(conn, agent_id, since)
    return float((await conn.execute(_SUCCEEDED_SPENT, params)).scalar_one())


async def trip_breaker(
    conn: Connection,
    *,
    workspace_id: UUID,
    agent_id: UUID,
    breaker: str,
    limit: float,
    observed: float,
    reason: str,
    now: datetime,
) -> bool:
    """Pause an active agent because `breaker` tripped; False if it was not active.

    Writes the status and reason, and an audit event `agent.breaker_trip` whose actor is the
    system, and the workspace notice `agent.paused`, in the caller's transaction.
    """
    paused = (
        await conn.execute(
            agents.update()
            .where(
                agents.c.id == agent_id,
                agents.c.workspace_id == workspace_id,
                agents.c.status == AgentStatus.ACTIVE.value,
            )
            .values(status=AgentStatus.PAUSED.value, paused_reason=reason)
            .returning(agents.c.id)
        )
    ).first()
    if paused is None:
        return False
    data: dict[str, Any] = {
        "before": {"status": AgentStatus.ACTIVE.value},
        "after": {"status": AgentStatus.PAUSED.value, "paused_reason": reason},
        "breaker": breaker,
        "limit": limit,
        "observed": observed,
    }
    await audit.record(
        conn,
        workspace_id=workspace_id,
        actor_type="system",
        actor_id=None,
        action="agent.breaker_trip",
        target_type="agent",
        target_id=agent_id,
        now=now,
        data=data,
    )
    await notices.add_notice(
        conn,
        workspace_id,
        "agent.paused",
        {
            "agent_id": str(agent_id),
            "reason": reason,
            "breaker": breaker,
            "limit": limit,
            "observed": observed,
        },
        now,
    )
    return True


def resumed_values(now: datetime) -> dict[str, Any]:
    """The columns a resume sets: no reason, a fresh window, no failures in a row."""
    return {"paused_reason": None, "breaker_since": now, "failures_in_a_row": 0}
