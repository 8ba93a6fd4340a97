"""Each agent's runs since a moment: how many, how many ended well, time to first token, cost.

Two queries over `ix_runs_workspace_started`, whatever the number of agents: the counts and
sums grouped by agent, then the first-token times (the median is not portable SQL).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.status import RunStatus
from bullpen.store.base import Connection
from bullpen.store.tables import runs


@dataclass(frozen=True, slots=True)
class AgentActivity:
    """One agent's runs started since a moment."""

    runs: int
    ended: int  # done or failed (a cancelled or running run counts for neither)
    done: int
    cost_usd: float
    median_ttft_ms: float | None

    @property
    def success_rate(self) -> float | None:
        """Done among the runs that ended done or failed; None before any ended."""
        return self.done / self.ended if self.ended else None


async def since(conn: Connection, workspace_id: UUID, start: datetime) -> dict[UUID, AgentActivity]:
    """Each agent of the workspace that started a run at or after `start`, with its figures."""
    r = runs.c
    window = sa.and_(r.workspace_id == workspace_id, r.started_at >= start)
    done = sa.func.sum(sa.case((r.status == RunStatus.DONE.value, 1), else_=0))
    ended = sa.func.sum(
        sa.case((r.status.in_([RunStatus.DONE.value, RunStatus.FAILED.value]), 1), else_=0)
    )
    totals = await conn.execute(
        sa.select(
            r.agent_id,
            sa.func.count().label("runs"),
            done.label("done"),
            ended.label("ended"),
            sa.func.coalesce(sa.func.sum(r.cost_usd), 0.0).label("cost"),
        )
        .where(window)
        .group_by(r.agent_id)
    )
    ttfts: dict[UUID, list[float]] = {}
    timed = await conn.execute(
        sa.select(r.agent_id, r.ttft_ms).where(window, r.ttft_ms.is_not(None))
    )
    for row in timed:
        ttfts.setdefault(row.agent_id, []).append(float(row.ttft_ms))
    return {
        row.agent_id: AgentActivity(
            runs=int(row.runs),
            ended=int(row.ended or 0),
            done=int(row.done or 0),
            cost_usd=float(row.cost or 0.0),
            median_ttft_ms=statistics.median(ttfts[row.agent_id])
            if row.agent_id in ttfts
            else None,
        )
        for row in totals
    }
