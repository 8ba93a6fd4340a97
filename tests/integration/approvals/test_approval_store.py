"""The approval store on both backends: a tool call decided before the run that held it has
ended is released by that end (exactly once), and one still pending keeps the task waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bullpen.domain.approvals import ApprovalKind, ApprovalStatus
from bullpen.domain.runs import RunOutcome
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store import approvals as approval_store
from bullpen.store import claims as claim_store
from bullpen.store import runs as run_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from tests.support.seed import NOW, new_task, workspace_with_agent

LEASE = timedelta(seconds=30)
HELD = RunOutcome(
    RunStatus.DONE, None, None, None, None, None, None, None, None, awaits_approval=True
)


@pytest.mark.parametrize("decided_first", [True, False])
async def test_a_held_step_decided_before_its_run_ended_goes_on(
    store: Store, decided_first: bool
) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    async with store.write() as conn:
        (claimed,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
        approval = await approval_store.insert(
            conn,
            workspace_id=ws,
            kind=ApprovalKind.TOOL_CALL,
            task_id=task_id,
            agent_id=agent,
            run_id=run_id,
            step=1,
            subject={"tools": ["comment"], "calls": [], "messages": []},
            default_outcome="deny",
            now=NOW,
        )

    async def decide() -> object:
        async with store.write() as conn:
            decided = await approval_store.decide(
                conn, approval.id, status=ApprovalStatus.APPROVED, reason=None, now=NOW
            )
            assert decided is not None
            return await approval_store.release(conn, task_id, NOW)

    async def end() -> list[object]:
        woken: list[object] = []
        async with store.write() as conn:
            assert await run_store.finish(
                conn, run_id=run_id, attempt=claimed.attempt, outcome=HELD, now=NOW, woken=woken
            )
        return woken

    if decided_first:  # the decision finds the task running: the run's end releases it
        assert await decide() is None
        assert len(await end()) == 1
    else:  # the end leaves it waiting; the decision releases it
        assert await end() == []
        async with store.read() as conn:
            task = await task_store.get_task(conn, ws, task_id)
        assert task is not None and task.status == TaskStatus.AWAITING_APPROVAL
        assert await decide() is not None
    async with store.read() as conn:
        task = await task_store.get_task(conn, ws, task_id)
        runs = await task_store.list_runs(conn, task_id)
        held = await approval_store.held_step(conn, task_id, 1)
    assert task is not None and task.status == TaskStatus.QUEUED
    assert sorted(r.status for r in runs) == ["done", "queued"]
    assert held is not None and held.approved is True


async def test_a_pending_held_step_keeps_the_task_waiting(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    async with store.write() as conn:
        (claimed,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
        await approval_store.insert(
            conn,
            workspace_id=ws,
            kind=ApprovalKind.TOOL_CALL,
            task_id=task_id,
            agent_id=agent,
            run_id=run_id,
            step=1,
            subject={"tools": ["comment"], "calls": [], "messages": []},
            default_outcome="deny",
            now=NOW,
        )
        woken: list[object] = []
        assert await run_store.finish(
            conn, run_id=run_id, attempt=claimed.attempt, outcome=HELD, now=NOW, woken=woken
        )
    assert woken == []
    async with store.read() as conn:
        task = await task_store.get_task(conn, ws, task_id)
        assert await approval_store.pending_for(conn, task_id)
    assert task is not None and task.status == TaskStatus.AWAITING_APPROVAL
