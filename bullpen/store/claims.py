"""Claiming runs: fairly across workspaces, by priority, under a lease."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.agents import AgentStatus
from bullpen.domain.runs import ClaimedRun
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store.base import Connection
from bullpen.store.tables import agents, runs, tasks, workspaces

_reports = agents.alias("reports")

# PostgreSQL: one claimer at a time (per database), so fairness and per-agent caps are exact.
_CLAIM_LOCK = 0x6270_636C  # "bpcl"


_ANY_QUEUED = sa.select(sa.exists().where(runs.c.status == RunStatus.QUEUED.value))


async def any_queued(conn: Connection) -> bool:
    """Whether any run waits in the queue (an index probe: a claim's cheap first look)."""
    return bool((await conn.execute(_ANY_QUEUED)).scalar())


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim took, and whether it left runs waiting in the queue.

    `held_back` is True when queued runs were left that wait for something other than a free
    slot of this claimer: an agent at its `max_concurrent_runs`, or a workspace's share of
    this claimer (`room`). The claimer should then look again as soon as one of its runs
    ends, and not let that end wait for the event log's coalescing.
    """

    runs: list[ClaimedRun]
    held_back: bool


async def claim(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    room: Callable[[UUID], int] | None = None,
    lost_below: int | None = None,
) -> Claim:
    """Take up to `limit` runs under a lease: fairly across workspaces, then by priority.

    Only runs that are due (`available_at`), of active agents below their
    `max_concurrent_runs`, are taken; with `room`, at most `room(workspace)` runs of each
    workspace (the claimer keeps slots free for other workspaces); with `lost_below`, only
    runs whose workers died under them fewer times than that (the claimer already holds a
    quarantined run, see `RetryPolicy.quarantine_at`). Each claim increments the run's
    attempt: the fence every later write of this delivery is checked against.
    """
    if limit < 1:
        return Claim([], held_back=False)
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_CLAIM_LOCK)))
    held_back, chosen = await _fair_pick(
        conn, limit=limit, now=now, postgres=postgres, room=room, lost_below=lost_below
    )
    runs = await _take(conn, chosen, owner=owner, now=now, lease=lease, postgres=postgres)
    return Claim(runs, held_back=held_back)


async def _take(
    conn: Connection,
    chosen: list[UUID],
    *,
    owner: str,
    now: datetime,
    lease: timedelta,
    postgres: bool,
) -> list[ClaimedRun]:
    """Move the chosen runs (those still queued) to running under this owner's lease."""
    if not chosen:
        return []
    target = sa.select(runs.c.id).where(
        runs.c.id.in_(chosen), runs.c.status == RunStatus.QUEUED.value
    )
    if postgres:  # a row another transaction is changing (a cancel) is left for later
        target = target.with_for_update(skip_locked=True)
    claimed = list(
        await conn.execute(
            runs.update()
            .where(runs.c.id.in_(target.scalar_subquery()))
            .values(
                status=RunStatus.RUNNING.value,
                attempt=runs.c.attempt + 1,
                lease_owner=owner,
                lease_expires_at=now + lease,
                started_at=now,
                available_at=None,
            )
            .returning(runs.c.id, runs.c.task_id)
        )
    )
    if not claimed:
        return []
    await conn.execute(
        tasks.update()
        .where(
            tasks.c.id.in_([row.task_id for row in claimed]),
            tasks.c.status == TaskStatus.QUEUED.value,
        )
        .values(status=TaskStatus.RUNNING.value, updated_at=now)
    )
    details = await conn.execute(
        sa.select(
            runs.c.id,
            runs.c.task_id,
            runs.c.workspace_id,
            runs.c.agent_id,
            runs.c.attempt,
            runs.c.failures,
            runs.c.lost_leases,
            runs.c.trace_parent,
            tasks.c.prompt,
            tasks.c.title,
            tasks.c.number,
            tasks.c.parent_id,
            tasks.c.priority,
            tasks.c.dependencies,
            tasks.c.dependents,
            tasks.c.steps,
            tasks.c.elapsed_s,
            workspaces.c.task_key,
            agents.c.adapter,
            agents.c.config,
            agents.c.name,
            agents.c.description,
            agents.c.breakers,
            agents.c.breaker_since,
            sa.exists()
            .where(_reports.c.reports_to == agents.c.id)
            .correlate(agents)
            .label("has_reports"),
        )
        .select_from(
            runs.join(tasks, tasks.c.id == runs.c.task_id)
            .join(agents, agents.c.id == runs.c.agent_id)
            .join(workspaces, workspaces.c.id == runs.c.workspace_id)
        )
        .where(runs.c.id.in_([row.id for row in claimed]))
    )
    order = {run_id: index for index, run_id in enumerate(chosen)}
    found = [
        ClaimedRun(
            id=row.id,
            task_id=row.task_id,
            workspace_id=row.workspace_id,
            agent_id=row.agent_id,
            attempt=row.attempt,
            failures=row.failures,
            lost_leases=row.lost_leases,
            prompt=row.prompt,
            agent_adapter=row.adapter,
            agent_config=dict(row.config),
            title=row.title,
            task_key=f"{row.task_key}-{row.number}",
            parent_id=row.parent_id,
            priority=row.priority,
            agent_name=row.name,
            agent_description=row.description,
            dependencies=row.dependencies,
            dependents=row.dependents,
            steps=row.steps,
            elapsed_s=float(row.elapsed_s or 0.0),
            has_reports=bool(row.has_reports),
            agent_breakers=row.breakers,
            breaker_since=row.breaker_since,
            trace_parent=row.trace_parent,
        )
        for row in details
    ]
    return sorted(found, key=lambda run: order[run.id])


async def _fair_pick(
    conn: Connection,
    *,
    limit: int,
    now: datetime,
    postgres: bool,
    room: Callable[[UUID], int] | None,
    lost_below: int | None,
) -> tuple[bool, list[UUID]]:
    """Whether queued runs are held back (see `Claim`), and which queued runs to claim next,
    without reading more of the queue than it needs.

    Max-min fairness over execution slots: the next run goes to the workspace with the fewest
    runs in progress (counting those picked in this claim), its best run by priority and age.
    Runs of paused agents, of agents at their `max_concurrent_runs`, and retries still backing
    off are skipped. A claim takes at most one *suspect* (a run whose worker died under it):
    runs that were in flight together when a poison run killed their worker are retried on
    separate claims, so the poison does not take them down with it again and again; and with
    `lost_below`, none lost that often (a quarantined run: its claimer holds one already). A
    delivery that failed on a live worker (a provider's 503) does not make a run a suspect. Each
    workspace's candidates come from an index range scan of at most `limit` rows, so a claim's
    cost grows with the number of workspaces waiting, not with the length of the queue.
    """
    busy = list(
        await conn.execute(
            sa.select(
                runs.c.workspace_id,
                runs.c.agent_id,
                agents.c.max_concurrent_runs,
                sa.func.count().label("running"),
            )
            .select_from(runs.join(agents, agents.c.id == runs.c.agent_id))
            .where(runs.c.status == RunStatus.RUNNING.value)
            .group_by(runs.c.workspace_id, runs.c.agent_id, agents.c.max_concurrent_runs)
        )
    )
    in_progress: dict[UUID, int] = {}
    agent_free: dict[UUID, int] = {}
    for row in busy:
        in_progress[row.workspace_id] = in_progress.get(row.workspace_id, 0) + int(row.running)
        agent_free[row.agent_id] = int(row.max_concurrent_runs) - int(row.running)
    full = [agent_id for agent_id, free in agent_free.items() if free <= 0]
    waiting = (
        sa.select(runs.c.id)
        .where(runs.c.status == RunStatus.QUEUED.value, runs.c.workspace_id == workspaces.c.id)
        .exists()
    )
    workspace_ids = list((await conn.execute(sa.select(workspaces.c.id).where(waiting))).scalars())
    if not workspace_ids:
        return False, []
    candidates = await _candidates(
        conn, workspace_ids, full, limit=limit, now=now, postgres=postgres
    )
    # Runs of agents at their cap are not candidates: whether any waits is one index probe.
    capped = bool(full) and bool(
        (
            await conn.execute(
                sa.select(
                    sa.exists().where(
                        runs.c.status == RunStatus.QUEUED.value, runs.c.agent_id.in_(full)
                    )
                )
            )
        ).scalar()
    )
    queues: dict[UUID, list[Any]] = {}
    for row in candidates:
        queues.setdefault(row.workspace_id, []).append(row)
        agent_free.setdefault(row.agent_id, int(row.max_concurrent_runs))  # none running yet
    # (runs in progress, best priority first, oldest first, workspace) per workspace's head.
    heap = [
        (in_progress.get(ws, 0), -rows[0].priority, rows[0].queued_at, ws)
        for ws, rows in queues.items()
    ]
    heapq.heapify(heap)
    chosen: list[UUID] = []
    suspect_taken = False
    skipped = False  # a candidate passed over for its agent's cap, or as a suspect
    left = {ws: room(ws) for ws in queues} if room is not None else {}
    while heap and len(chosen) < limit:
        share, _, _, ws = heapq.heappop(heap)
        if room is not None and left[ws] <= 0:
            continue  # this claimer keeps its other slots for other workspaces
        rows = queues[ws]
        while rows and (
            agent_free[rows[0].agent_id] <= 0
            or (suspect_taken and rows[0].lost_leases > 0)
            or (lost_below is not None and rows[0].lost_leases >= lost_below)
        ):
            rows.pop(0)  # its agent is at its cap, or this claimer holds a suspect like it
            skipped = True
        if not rows:
            continue
        row = rows.pop(0)
        if room is not None:
            left[ws] -= 1
        agent_free[row.agent_id] -= 1
        suspect_taken = suspect_taken or row.lost_leases > 0
        chosen.append(row.id)
        if rows:
            heapq.heappush(heap, (share + 1, -rows[0].priority, rows[0].queued_at, ws))
    # Candidates passed over or left behind with slots to spare wait for an agent's cap or
    # this claimer's room, not for a free slot (as those beyond `limit` do).
    leftover = skipped or any(rows for rows in queues.values())
    return capped or (leftover and len(chosen) < limit), chosen


async def _candidates(
    conn: Connection,
    workspace_ids: list[UUID],
    full_agents: list[UUID],
    *,
    limit: int,
    now: datetime,
    postgres: bool,
) -> list[Any]:
    """Up to `limit` claimable runs per workspace, best first (priority, then age)."""

    def head(workspace: Any) -> sa.Select[Any]:
        query = (
            sa.select(
                runs.c.id,
                runs.c.workspace_id,
                runs.c.agent_id,
                runs.c.priority,
                runs.c.queued_at,
                runs.c.lost_leases,
                agents.c.max_concurrent_runs,
            )
            .select_from(runs.join(agents, agents.c.id == runs.c.agent_id))
            .where(
                runs.c.status == RunStatus.QUEUED.value,
                runs.c.workspace_id == workspace,
                sa.or_(runs.c.available_at.is_(None), runs.c.available_at <= now),
                agents.c.status == AgentStatus.ACTIVE.value,
            )
            .order_by(runs.c.priority.desc(), runs.c.queued_at, runs.c.id)
            .limit(limit)
        )
        if full_agents:
            query = query.where(runs.c.agent_id.not_in(full_agents))
        return query

    if postgres:  # one round trip: a LATERAL range scan per workspace
        wanted = (
            sa.func.unnest(sa.cast(workspace_ids, sa.ARRAY(sa.Uuid)))
            .table_valued("id")
            .render_derived(name="wanted")
        )
        lateral = head(wanted.c.id).lateral("head")
        return list(
            await conn.execute(sa.select(lateral).select_from(wanted.join(lateral, sa.true())))
        )
    rows: list[Any] = []
    for workspace_id in workspace_ids:  # SQLite runs in-process: a query each is cheap
        rows.extend(await conn.execute(head(workspace_id)))
    return rows
