"""Runs as the queue: claim with a lease, renew, re-queue expired, finish under a fence."""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store import gateway as gateway_store
from bullpen.store import workflow
from bullpen.store.base import Connection
from bullpen.store.tables import agents, runs, tasks, workspaces


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a worker now holds, with what it needs to execute it."""

    id: UUID
    task_id: UUID
    workspace_id: UUID
    agent_id: UUID
    attempt: int
    failures: int
    prompt: str
    agent_adapter: str
    agent_config: dict[str, Any]
    title: str = ""
    task_key: str = ""  # `KEY-42`
    parent_id: UUID | None = None
    priority: int = 0
    agent_name: str = ""
    agent_description: str = ""
    dependencies: int = 0  # children waited for and blockers ever attached (0: no tree reads)
    steps: int = 0  # tool steps an `llm` agent completed on the task (0: nothing to resume)
    has_reports: bool = False  # someone reports to the agent: it may delegate


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a finished run records."""

    status: RunStatus
    result: str | None
    error: str | None
    first_token_at: datetime | None
    ttft_ms: float | None
    provider: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    # A transient failure (a provider or the network was away) is retried with backoff; a
    # permanent one (bad config, a refused request) ends the run at once.
    transient: bool = False
    error_code: str | None = None  # the problem type slug of the error, e.g. provider-timeout
    cost_usd: float | None = None
    cached_input_tokens: int | None = None
    llm_calls: list[dict[str, Any]] | None = None  # every provider attempt of the call
    # The agent delegated and waits: the task is `blocked` until what it waits for has ended
    # (at once queued again if that already happened), not `done`.
    waits: bool = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed deliveries are retried: exponential backoff with jitter, then dead-letter."""

    max_attempts: int = 5
    base_s: float = 1.0
    max_s: float = 300.0

    def delay(self, failures: int, rng: random.Random | None = None) -> timedelta:
        """The wait before delivery `failures + 1`: base·2^(failures-1), capped, jittered ±50 %."""
        raw = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return timedelta(seconds=raw * (rng or random).uniform(0.5, 1.0))


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery a worker holds: the run and the attempt its writes are fenced by."""

    run_id: UUID
    attempt: int


_reports = agents.alias("reports")

# PostgreSQL: one claimer at a time (per database), so fairness and per-agent caps are exact.
_CLAIM_LOCK = 0x6270_636C  # "bpcl"


async def claim(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
    room: Callable[[UUID], int] | None = None,
) -> list[ClaimedRun]:
    """Take up to `limit` runs under a lease: fairly across workspaces, then by priority.

    Only runs that are due (`available_at`), of active agents below their
    `max_concurrent_runs`, are taken; with `room`, at most `room(workspace)` runs of each
    workspace (the claimer keeps slots free for other workspaces). Each claim increments the
    run's attempt: the fence every later write of this delivery is checked against.
    """
    if limit < 1:
        return []
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_CLAIM_LOCK)))
    chosen = await _fair_pick(conn, limit=limit, now=now, postgres=postgres, room=room)
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
            tasks.c.prompt,
            tasks.c.title,
            tasks.c.number,
            tasks.c.parent_id,
            tasks.c.priority,
            tasks.c.dependencies,
            tasks.c.steps,
            workspaces.c.task_key,
            agents.c.adapter,
            agents.c.config,
            agents.c.name,
            agents.c.description,
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
            steps=row.steps,
            has_reports=bool(row.has_reports),
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
) -> list[UUID]:
    """Which queued runs to claim next, without reading more of the queue than it needs.

    Max-min fairness over execution slots: the next run goes to the workspace with the fewest
    runs in progress (counting those picked in this claim), its best run by priority and age.
    Runs of paused agents, of agents at their `max_concurrent_runs`, and retries still backing
    off are skipped. A claim takes at most one *suspect* (a run whose earlier delivery failed):
    runs that were in flight together when a poison run killed their worker are retried on
    separate claims, so the poison does not take them down with it again and again. Each
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
        return []
    candidates = await _candidates(
        conn, workspace_ids, full, limit=limit, now=now, postgres=postgres
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
    left = {ws: room(ws) for ws in queues} if room is not None else {}
    while heap and len(chosen) < limit:
        share, _, _, ws = heapq.heappop(heap)
        if room is not None and left[ws] <= 0:
            continue  # this claimer keeps its other slots for other workspaces
        rows = queues[ws]
        while rows and (
            agent_free[rows[0].agent_id] <= 0 or (suspect_taken and rows[0].failures > 0)
        ):
            rows.pop(0)  # its agent is at its cap, or this claim already took a suspect
        if not rows:
            continue
        row = rows.pop(0)
        if room is not None:
            left[ws] -= 1
        agent_free[row.agent_id] -= 1
        suspect_taken = suspect_taken or row.failures > 0
        chosen.append(row.id)
        if rows:
            heapq.heappush(heap, (share + 1, -rows[0].priority, rows[0].queued_at, ws))
    return chosen


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
                runs.c.failures,
                agents.c.max_concurrent_runs,
            )
            .select_from(runs.join(agents, agents.c.id == runs.c.agent_id))
            .where(
                runs.c.status == RunStatus.QUEUED.value,
                runs.c.workspace_id == workspace,
                sa.or_(runs.c.available_at.is_(None), runs.c.available_at <= now),
                agents.c.status == "active",
            )
            .order_by(runs.c.priority.desc(), runs.c.queued_at, runs.c.id)
            .limit(limit)
        )
        if full_agents:
            query = query.where(runs.c.agent_id.not_in(full_agents))
        return query

    if postgres:  # one round trip: a LATERAL range scan per workspace
        wanted = (
            sa.func.unnest(sa.cast(workspace_ids, postgresql.ARRAY(sa.Uuid)))
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


def _among(conn: Connection, column: sa.Column[UUID], ids: list[UUID]) -> sa.ColumnElement[bool]:
    """`column IN ids`; on PostgreSQL `column = ANY($1)`: one statement text (prepared once)
    whatever the number of ids, where IN would be a new statement for every count (a worker's
    fence, lease renewal and cancel poll pass hundreds or thousands of run ids)."""
    if conn.dialect.name == "postgresql":
        return column == sa.any_(sa.literal(ids, type_=postgresql.ARRAY(sa.Uuid)))
    return column.in_(ids)


async def renew(
    conn: Connection, *, owner: str, held: list[Held], now: datetime, lease: timedelta
) -> list[Held]:
    """Extend the leases this worker still holds; returns the deliveries it no longer holds."""
    if not held:
        return []
    ids = [h.run_id for h in held]
    mine = sa.select(runs.c.id).where(
        _among(conn, runs.c.id, ids),
        runs.c.lease_owner == owner,
        runs.c.status == RunStatus.RUNNING.value,
    )
    if conn.dialect.name == "postgresql":  # in id order, so concurrent lockers cannot deadlock
        mine = mine.order_by(runs.c.id).with_for_update()
    await conn.execute(
        runs.update()
        .where(runs.c.id.in_(mine.scalar_subquery()))
        .values(lease_expires_at=now + lease)
    )
    current = await holders(conn, ids)
    return [h for h in held if current.get(h.run_id) != h.attempt]


async def holders(conn: Connection, run_ids: list[UUID], *, lock: bool = False) -> dict[UUID, int]:
    """The attempt holding each running run of `run_ids` (runs not running are absent).

    With `lock` (PostgreSQL) the rows are share-locked in id order until commit, so no claim or
    re-queue can move the lease on while the caller writes under the fence.
    """
    if not run_ids:
        return {}
    query = sa.select(runs.c.id, runs.c.attempt).where(
        _among(conn, runs.c.id, run_ids), runs.c.status == RunStatus.RUNNING.value
    )
    if lock and conn.dialect.name == "postgresql":
        query = query.order_by(runs.c.id).with_for_update(read=True)
    return {row.id: int(row.attempt) for row in await conn.execute(query)}


async def cancel_requested(conn: Connection, run_ids: list[UUID]) -> list[UUID]:
    """Which of these runs someone asked to cancel."""
    if not run_ids:
        return []
    query = sa.select(runs.c.id).where(
        _among(conn, runs.c.id, run_ids), runs.c.cancel_requested_at.is_not(None)
    )
    return [row.id for row in await conn.execute(query)]


async def queued_backlog(conn: Connection, workspace_id: UUID, cap: int) -> int:
    """How many runs of the workspace wait in the queue, counted up to `cap` (bounded cost)."""
    waiting = (
        sa.select(runs.c.id)
        .where(runs.c.status == RunStatus.QUEUED.value, runs.c.workspace_id == workspace_id)
        .limit(cap)
        .subquery()
    )
    return int((await conn.execute(sa.select(sa.func.count()).select_from(waiting))).scalar_one())


async def lock_backlog(conn: Connection, workspace_id: UUID) -> None:
    """Serialise enqueues of one workspace until this transaction ends (PostgreSQL; SQLite
    has one writer already), so that a count of its queue plus this insert is exact."""
    if conn.dialect.name != "postgresql":
        return
    digest = hashlib.sha256(b"backlog\0" + workspace_id.bytes).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))


async def reprioritise_queued(conn: Connection, task_id: UUID, priority: int) -> None:
    """Give a task's queued run its new priority."""
    await conn.execute(
        runs.update()
        .where(runs.c.task_id == task_id, runs.c.status == RunStatus.QUEUED.value)
        .values(priority=priority)
    )


async def request_cancel(conn: Connection, run_id: UUID, now: datetime) -> bool:
    """Ask the worker holding a running run to stop it; False if it is not running."""
    result = await conn.execute(
        runs.update()
        .where(runs.c.id == run_id, runs.c.status == RunStatus.RUNNING.value)
        .values(cancel_requested_at=now)
    )
    return int(result.rowcount) == 1


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What happened to a delivery that ended without an outcome."""

    run_id: UUID
    task_id: UUID
    workspace_id: UUID
    status: RunStatus  # QUEUED (retried later), FAILED (dead-lettered) or CANCELLED
    error: str | None


async def expired(conn: Connection, *, now: datetime, limit: int = 500) -> list[Held]:
    """Deliveries whose lease ran out (PostgreSQL: locked; rows being changed are skipped)."""
    query = (
        sa.select(runs.c.id, runs.c.attempt)
        .where(runs.c.status == RunStatus.RUNNING.value, runs.c.lease_expires_at < now)
        .order_by(runs.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [Held(row.id, int(row.attempt)) for row in await conn.execute(query)]


async def fail_deliveries(
    conn: Connection,
    held: list[Held],
    *,
    reason: str,
    now: datetime,
    policy: RetryPolicy | None = None,
) -> list[Redelivery]:
    """End deliveries that failed transiently: queue each again after a backoff, or, at the
    policy's maximum of failed attempts, dead-letter it (`failed`, with the reason kept).

    Fenced: a delivery whose attempt no longer holds the run is left alone.
    """
    policy = policy or RetryPolicy()
    out: list[Redelivery] = []
    for h in held:
        row = (
            await conn.execute(
                sa.select(
                    runs.c.task_id,
                    runs.c.workspace_id,
                    runs.c.failures,
                    runs.c.cancel_requested_at,
                ).where(
                    runs.c.id == h.run_id,
                    runs.c.attempt == h.attempt,
                    runs.c.status == RunStatus.RUNNING.value,
                )
            )
        ).first()
        if row is None:
            continue
        failures = int(row.failures) + 1
        values: dict[str, Any] = {
            "failures": failures,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        if row.cancel_requested_at is not None:
            status, error = RunStatus.CANCELLED, "cancelled on request"
        elif failures >= policy.max_attempts:
            status = RunStatus.FAILED
            error = f"dead-lettered after {failures} failed attempts; last: {reason}"
        else:
            status, error = RunStatus.QUEUED, None
            values["available_at"] = now + policy.delay(failures)
        if status is not RunStatus.QUEUED:
            values.update(finished_at=now, error=error)
        await conn.execute(
            runs.update()
            .where(runs.c.id == h.run_id, runs.c.attempt == h.attempt)
            .values(status=status.value, **values)
        )
        task_status = TaskStatus.QUEUED if status is RunStatus.QUEUED else TaskStatus(status.value)
        await _task_leaves_running(conn, row.task_id, task_status, now, error=error)
        if status is not RunStatus.QUEUED:
            await workflow.ended_task(conn, row.task_id, now)
        out.append(Redelivery(h.run_id, row.task_id, row.workspace_id, status, error))
    return out


async def release(conn: Connection, held: list[Held], *, now: datetime) -> int:
    """Give deliveries back to the queue unharmed (a draining worker); not a failure."""
    released = 0
    for h in held:
        result = await conn.execute(
            runs.update()
            .where(
                runs.c.id == h.run_id,
                runs.c.attempt == h.attempt,
                runs.c.status == RunStatus.RUNNING.value,
            )
            .values(
                status=RunStatus.QUEUED.value,
                lease_owner=None,
                lease_expires_at=None,
                available_at=None,
            )
            .returning(runs.c.task_id)
        )
        task_id = result.scalar_one_or_none()
        if task_id is None:
            continue
        released += 1
        await _task_leaves_running(conn, task_id, TaskStatus.QUEUED, now)
    return released


async def _task_leaves_running(
    conn: Connection, task_id: UUID, status: TaskStatus, now: datetime, **values: Any
) -> None:
    """Move a task whose delivery ended without an outcome out of `running`."""
    await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id, tasks.c.status == TaskStatus.RUNNING.value)
        .values(status=status.value, updated_at=now, **values)
    )


_FINISH_RUN = (
    runs.update()
    .where(
        runs.c.id == sa.bindparam("b_run_id"),
        runs.c.attempt == sa.bindparam("b_attempt"),
        runs.c.status == RunStatus.RUNNING.value,
    )
    .values(
        {
            name: sa.bindparam(f"b_{name}", type_=runs.c[name].type)
            for name in (
                "status",
                "finished_at",
                "first_token_at",
                "ttft_ms",
                "provider",
                "model",
                "input_tokens",
                "output_tokens",
                "error",
                "error_code",
                "cost_usd",
                "llm_calls",
            )
        }
        | {"lease_owner": None, "lease_expires_at": None}
    )
    .returning(
        runs.c.task_id,
        runs.c.workspace_id,
        runs.c.agent_id,
        sa.select(tasks.c.dependencies)
        .where(tasks.c.id == runs.c.task_id)
        .scalar_subquery()
        .label("dependencies"),
    )
)
_FINISH_TASK = (
    tasks.update()
    # Only if no blocker was added since the caller looked (else it looks again).
    .where(
        tasks.c.id == sa.bindparam("b_task_id"),
        tasks.c.dependencies == sa.bindparam("b_dependencies"),
    )
    .values(
        status=sa.bindparam("b_status"),
        result=sa.bindparam("b_result"),
        error=sa.bindparam("b_error"),
        updated_at=sa.bindparam("b_now", type_=tasks.c.updated_at.type),
    )
    .returning(tasks.c.parent_id, tasks.c.blocks_parent, tasks.c.dependencies, tasks.c.dependents)
)


async def finish(
    conn: Connection,
    *,
    run_id: UUID,
    attempt: int,
    outcome: RunOutcome,
    now: datetime,
    woken: list[UUID] | None = None,
) -> bool:
    """Record a run's end and its task's, only if this attempt still holds it.

    A task whose run succeeded while children it waits for or blockers are still open is
    `blocked` instead of `done`; a task that ended wakes what waited for it (the runs enqueued
    are added to `woken`).
    """
    result = await conn.execute(
        _FINISH_RUN,
        {
            "b_run_id": run_id,
            "b_attempt": attempt,
            "b_status": outcome.status.value,
            "b_finished_at": now,
            "b_first_token_at": outcome.first_token_at,
            "b_ttft_ms": outcome.ttft_ms,
            "b_provider": outcome.provider,
            "b_model": outcome.model,
            "b_input_tokens": outcome.input_tokens,
            "b_output_tokens": outcome.output_tokens,
            "b_error": outcome.error,
            "b_error_code": outcome.error_code,
            "b_cost_usd": outcome.cost_usd,
            "b_llm_calls": outcome.llm_calls,
        },
    )
    row = result.first()
    if row is None:
        return False
    task_id = row.task_id
    if outcome.cost_usd is not None and outcome.provider is not None:
        # The ledger row commits with the usage it records.
        await gateway_store.record_costs(
            conn,
            [
                {
                    "workspace_id": row.workspace_id,
                    "run_id": run_id,
                    "agent_id": row.agent_id,
                    "user_id": None,
                    "api_key_id": None,
                    "provider": outcome.provider,
                    "model": outcome.model or "",
                    "input_tokens": outcome.input_tokens or 0,
                    "cached_input_tokens": outcome.cached_input_tokens or 0,
                    "output_tokens": outcome.output_tokens or 0,
                    "cost_usd": outcome.cost_usd,
                    "created_at": now,
                }
            ],
        )
    # A run that succeeded leaves its task blocked while what it waits for is open: decided
    # before the task changes, so the change log never shows a `done` that is not.
    dependencies = row.dependencies
    while True:
        status = TaskStatus(outcome.status.value)
        if status is TaskStatus.DONE and (outcome.waits or dependencies):
            if outcome.waits or await workflow.open_dependencies(conn, task_id):
                status = TaskStatus.BLOCKED
        tree = (
            await conn.execute(
                _FINISH_TASK,
                {
                    "b_task_id": task_id,
                    "b_dependencies": dependencies,
                    "b_status": status.value,
                    "b_result": outcome.result,
                    "b_error": outcome.error,
                    "b_now": now,
                },
            )
        ).first()
        if tree is not None:
            break
        dependencies = (
            await conn.execute(sa.select(tasks.c.dependencies).where(tasks.c.id == task_id))
        ).scalar_one()
    if status is TaskStatus.BLOCKED:
        # What it waits for may have ended already (the check above did not lock the task):
        # `wake` looks again with the task locked, and re-queues it then.
        run = await workflow.wake(conn, task_id, now)
        if run is not None and woken is not None:
            woken.append(run)
        return True
    if tree.parent_id is not None or tree.dependents:
        enqueued = await workflow.ended(
            conn,
            parent_id=tree.parent_id,
            blocks_parent=tree.blocks_parent,
            dependents=tree.dependents,
            task_id=task_id,
            now=now,
        )
        if woken is not None:
            woken.extend(enqueued)
    return True


async def get_run(conn: Connection, workspace_id: UUID, run_id: UUID) -> Any | None:
    """The run in this workspace, or None."""
    return (
        await conn.execute(
            sa.select(runs).where(runs.c.id == run_id, runs.c.workspace_id == workspace_id)
        )
    ).first()
