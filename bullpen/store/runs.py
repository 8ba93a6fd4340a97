"""Runs as the queue once claimed: renew the lease, re-queue expired, finish under a fence.

Claiming lives in `store/claims.py`; the vocabulary (`Held`, `RunOutcome` …) in `domain/runs.py`.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.approvals import ApprovalKind
from bullpen.domain.records import RunRecord
from bullpen.domain.runs import Held, Redelivery, RetryPolicy, RunOutcome
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store import approvals as approval_store
from bullpen.store import budgets as budget_store
from bullpen.store import gateway as gateway_store
from bullpen.store import rollups, workflow
from bullpen.store.base import Connection
from bullpen.store.tables import runs, tasks


def _among(conn: Connection, column: sa.Column[UUID], ids: list[UUID]) -> sa.ColumnElement[bool]:
    """`column IN ids`; on PostgreSQL `column = ANY($1)`: one statement text (prepared once)
    whatever the number of ids, where IN would be a new statement for every count (a worker's
    fence, lease renewal and cancel poll pass hundreds or thousands of run ids)."""
    if conn.dialect.name == "postgresql":
        return column == sa.any_(sa.literal(ids, type_=sa.ARRAY(sa.Uuid)))
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
    lost: bool = False,
) -> list[Redelivery]:
    """End deliveries that failed transiently: queue each again after a backoff, or, at the
    policy's maximum of failed attempts, dead-letter it (`failed`, with the reason kept).
    `lost`: their worker died holding them (a lease ran out), which claims keep apart.

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
                    runs.c.started_at,
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
            "lost_leases": runs.c.lost_leases + int(lost),
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
        await _task_leaves_running(
            conn, row.task_id, task_status, now, error=error, ran=_elapsed(row.started_at, now)
        )
        if status is not RunStatus.QUEUED:
            await workflow.ended_task(conn, row.task_id, now)
        out.append(Redelivery(h.run_id, row.task_id, row.workspace_id, status, error))
    return out


async def release(conn: Connection, held: list[Held], *, now: datetime) -> int:
    """Give deliveries back to the queue unharmed (a draining worker); not a failure."""
    return await _requeue(conn, held, now, ran=True, available_at=None)


async def unclaim(conn: Connection, held: list[Held], *, now: datetime) -> int:
    """Undo claims in the claim's own transaction (nothing ran, nothing was written under
    them): the runs are queued again with their attempt and start as before the claim."""
    return await _requeue(conn, held, now, attempt=runs.c.attempt - 1, started_at=None)


async def _requeue(
    conn: Connection, held: list[Held], now: datetime, *, ran: bool = False, **values: Any
) -> int:
    """Queue running deliveries again, lease dropped, with `values` besides; returns how many
    were still held. Their tasks leave `running` for `queued` (with the time the deliveries
    ran added to their wall time, if they `ran`)."""
    requeued = 0
    for h in held:
        result = await conn.execute(
            runs.update()
            .where(
                runs.c.id == h.run_id,
                runs.c.attempt == h.attempt,
                runs.c.status == RunStatus.RUNNING.value,
            )
            .values(
                status=RunStatus.QUEUED.value, lease_owner=None, lease_expires_at=None, **values
            )
            .returning(runs.c.task_id, runs.c.started_at)
        )
        found = result.first()
        if found is None:
            continue
        requeued += 1
        elapsed = _elapsed(found.started_at, now) if ran else 0.0
        await _task_leaves_running(conn, found.task_id, TaskStatus.QUEUED, now, ran=elapsed)
    return requeued


async def _task_leaves_running(
    conn: Connection,
    task_id: UUID,
    status: TaskStatus,
    now: datetime,
    *,
    ran: float = 0.0,
    **values: Any,
) -> None:
    """Move a task whose delivery ended without an outcome out of `running`, adding the
    seconds the delivery `ran` to the task's wall time."""
    if ran > 0:
        values["elapsed_s"] = tasks.c.elapsed_s + ran
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
        runs.c.started_at,
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
        elapsed_s=tasks.c.elapsed_s + sa.bindparam("b_elapsed", type_=sa.Float),
    )
    .returning(tasks.c.parent_id, tasks.c.blocks_parent, tasks.c.dependencies, tasks.c.dependents)
)


def _elapsed(started_at: datetime | None, now: datetime) -> float:
    """Seconds a delivery ran (for its task's wall time over every delivery and wake)."""
    return max(0.0, (now - started_at).total_seconds()) if started_at is not None else 0.0


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
    ttft_ms = outcome.ttft_ms
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
    if ttft_ms is not None and row.started_at is not None:  # counted as the transaction commits
        await rollups.add_ttfts(conn, [(row.workspace_id, row.started_at, ttft_ms)])
    # A cancelled run may still hold reservations of the call it was stopped in.
    if outcome.calls is not None or outcome.status is RunStatus.CANCELLED:
        await budget_store.settle_run(
            conn,
            run_id=run_id,
            workspace_id=row.workspace_id,
            agent_id=row.agent_id,
            task_id=task_id,
            calls=outcome.calls or (),
            now=now,
        )
    elif outcome.cost_usd is not None and outcome.provider is not None:
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
                    "task_id": task_id,
                }
            ],
        )
    # A run that succeeded leaves its task blocked while what it waits for is open: decided
    # before the task changes, so the change log never shows a `done` that is not.
    dependencies = row.dependencies
    while True:
        status = TaskStatus(outcome.status.value)
        if status is TaskStatus.DONE and outcome.awaits_approval:
            status = TaskStatus.AWAITING_APPROVAL
        elif status is TaskStatus.DONE and (outcome.waits or dependencies):
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
                    "b_elapsed": _elapsed(row.started_at, now),
                },
            )
        ).first()
        if tree is not None:
            break
        dependencies = (
            await conn.execute(sa.select(tasks.c.dependencies).where(tasks.c.id == task_id))
        ).scalar_one()
    if status is TaskStatus.FAILED and outcome.budget_stop:
        # A budget stopped it: an approver may let the task go on with a one-off override.
        if not await approval_store.pending_for(conn, task_id):
            await approval_store.insert(
                conn,
                workspace_id=row.workspace_id,
                kind=ApprovalKind.BUDGET_OVERRIDE,
                task_id=task_id,
                agent_id=row.agent_id,
                subject={"run_id": str(run_id), "error": outcome.error},
                default_outcome="deny",
                now=now,
                run_id=run_id,
            )
    if status is TaskStatus.AWAITING_APPROVAL:  # not ended: nobody is told
        # Decided already (between the hold and this end): the decision found the task still
        # running and left it; it goes on now.
        if not await approval_store.pending_for(conn, task_id):
            run = await approval_store.release(conn, task_id, now)
            if run is not None and woken is not None:
                woken.append(run)
        return True
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


async def get_run(conn: Connection, workspace_id: UUID, run_id: UUID) -> RunRecord | None:
    """The run in this workspace, or None."""
    row = (
        await conn.execute(
            sa.select(runs).where(runs.c.id == run_id, runs.c.workspace_id == workspace_id)
        )
    ).first()
    return None if row is None else RunRecord.of(row._mapping)
