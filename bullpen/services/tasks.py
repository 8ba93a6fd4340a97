"""Task use cases: create (with its run, atomically), update, cancel, retry, comment, read.

Every change commits with its audit event in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.events import RunEvent
from bullpen.domain.principal import Principal
from bullpen.domain.records import CommentRecord, RunRecord, TaskLink, TaskRecord, TaskWithRun
from bullpen.domain.status import TERMINAL_TASK, RunStatus, TaskStatus, task_can_move
from bullpen.errors import (
    Conflict,
    Forbidden,
    NotFound,
)
from bullpen.services.enqueue import Admission
from bullpen.store import agents as agent_store
from bullpen.store import audit, workflow
from bullpen.store import events as event_store
from bullpen.store import runs as run_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.paging import Page
from bullpen.streams.eventlog import Ending, append_ends

TITLE_CHARS = 80
# Subtasks cancelled per transaction: each batch is short, and a cancel cut short between two
# leaves the rest for the next cancel of the same task (issue 19, finding 6).
CANCEL_BATCH = 200
_ENDED = frozenset(status.value for status in TERMINAL_TASK)


def title_from_prompt(prompt: str) -> str:
    """A one-line title: the prompt's first line, shortened."""
    line = prompt.strip().splitlines()[0] if prompt.strip() else ""
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class TaskService:
    """Creates, changes and reads tasks within the caller's workspace."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        on_enqueued: Callable[[], None],
        cancel_local: Callable[[UUID], Awaitable[bool]],
        publish: Callable[[list[RunEvent]], None],
        admission: Admission | None = None,
    ) -> None:
        self._store = store
        self._admission = admission or Admission()
        self._clock = clock
        self._on_enqueued = on_enqueued
        self._cancel_local = cancel_local
        self._publish = publish

    async def create(
        self,
        principal: Principal,
        *,
        prompt: str,
        agent_id: UUID,
        title: str | None = None,
        priority: int = 0,
        labels: list[str] | None = None,
        parent_id: UUID | None = None,
        blocked_by: list[UUID] | None = None,
    ) -> TaskWithRun:
        """Create a task and enqueue its run in one transaction; returns the stored task.

        With `blocked_by`, the task waits (`blocked`, no run yet) until each of those tasks has
        ended; with `parent_id` it is a subtask, and a parent that is `blocked` waits for it too.
        """
        need(principal, Permission.TASKS_WRITE)
        now = self._clock()
        async with self._store.write(turn=task_store.numbering(principal.workspace_id)) as conn:
            if blocked_by:  # (a task with a run: its insert checks the agent)
                await self._admission.agent(conn, principal.workspace_id, agent_id)
            if parent_id is not None:
                parent = await task_store.get_task(conn, principal.workspace_id, parent_id)
                if parent is None:
                    raise NotFound("parent_id: no such task in this workspace")
                if parent.status in _ENDED:
                    raise Conflict(f"the parent task has ended ({parent.status})")
                await self._admission.check_depth(conn, parent_id)
            await self._admission.check_backlog(conn, principal.workspace_id)
            fields: dict[str, Any] = {
                "creator_user_id": principal.user_id,
                "creator_key_id": principal.api_key_id,
                "priority": priority,
                "labels": labels,
                "parent_id": parent_id,
            }
            common: dict[str, Any] = {
                "workspace_id": principal.workspace_id,
                "agent_id": agent_id,
                "title": title or title_from_prompt(prompt),
                "prompt": prompt,
                "now": now,
            }

            def audited(task_id: UUID, run_id: UUID | None) -> dict[str, Any]:
                data = {
                    "agent_id": str(agent_id),
                    "run_id": None if run_id is None else str(run_id),
                    "parent_id": None if parent_id is None else str(parent_id),
                    "blocked_by": [str(b) for b in blocked_by or []],
                }
                return audit.entry_by(principal, "task.create", "task", task_id, now, data)

            run: RunRecord | None = None
            if blocked_by:
                task = await task_store.insert_blocked_task(conn, **common, **fields)
                await workflow.add_blockers(conn, principal.workspace_id, task.id, blocked_by, now)
                if await workflow.wake(conn, task.id, now) is not None:  # all had ended
                    task = replace(task, status=TaskStatus.QUEUED)
                await audit.insert(conn, audited(task.id, None))
            else:  # the task, its run and the audit event in one statement
                try:
                    task, run = await task_store.insert_task_with_run(
                        conn, **common, **fields, audit=audited
                    )
                except task_store.AgentNotActive:
                    # Why: not in the workspace, paused, terminated (NotFound, Conflict ...).
                    await self._admission.agent(conn, principal.workspace_id, agent_id)
                    raise
            if parent_id is not None:
                await workflow.count_child(conn, parent_id)
            if task.status in (TaskStatus.QUEUED.value, TaskStatus.AWAITING_APPROVAL.value):
                self._store.after_commit(self._on_enqueued)  # (the stream shows the approval)
        if run is None:
            return await self.get(principal, task.id)
        return task, run

    async def dependencies(
        self, principal: Principal, task_id: UUID
    ) -> tuple[list[TaskLink], list[TaskLink]]:
        """A task's children and blockers, with their assignees' names."""
        async with self._store.read() as conn:
            await self._task(conn, principal, task_id)
            return await workflow.children(conn, task_id), await workflow.blockers(conn, task_id)

    async def cancel_open_of_agent(self, principal: Principal, agent_id: UUID) -> int:
        """Cancel every task of the agent that has not ended (a terminated agent's)."""
        async with self._store.read() as conn:
            open_ids = await agent_store.open_tasks(conn, agent_id)
        for task_id in open_ids:
            with contextlib.suppress(Conflict):  # it ended meanwhile
                await self.cancel(principal, task_id)
        return len(open_ids)

    async def get(self, principal: Principal, task_id: UUID) -> TaskWithRun:
        """The task and its latest run; another workspace's task is NotFound."""
        async with self._store.read() as conn:
            task = await self._task(conn, principal, task_id)
            run_rows = await task_store.runs_for_tasks(conn, [task_id])
        return task, run_rows.get(task_id)

    async def runs_of(self, principal: Principal, task_id: UUID) -> event_store.TaskRuns:
        """The task's status and runs, as its event stream starts from them (one statement);
        another workspace's task is NotFound."""
        async with self._store.read() as conn:
            found = await event_store.task_runs(conn, task_id, principal.workspace_id)
        if found[0] is None:
            raise NotFound("no such task")
        return found

    async def list(
        self,
        principal: Principal,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
        status: str | None = None,
        agent_id: UUID | None = None,
        label: str | None = None,
        parent_id: UUID | None = None,
        top_level: bool = False,
        search: str | None = None,
    ) -> tuple[Page[TaskRecord], dict[UUID, RunRecord]]:
        """A page of tasks, newest first, with each one's latest run; `parent_id` lists its
        subtasks, `top_level` only tasks without a parent, `search` those whose title or
        prompt holds the text."""
        async with self._store.read() as conn:
            page = await task_store.list_tasks(
                conn,
                principal.workspace_id,
                limit=limit,
                after=after,
                status=status,
                agent_id=agent_id,
                label=label,
                parent_id=parent_id,
                top_level=top_level,
                search=search,
                dialect=self._store.dialect,
            )
            run_rows = await task_store.runs_for_tasks(conn, [row.id for row in page.rows])
        return page, run_rows

    async def update(
        self, principal: Principal, task_id: UUID, changes: dict[str, Any]
    ) -> TaskWithRun:
        """Change a task's title, priority or labels (only those keys)."""
        need(principal, Permission.TASKS_WRITE)
        allowed = {"title", "priority", "labels"}
        if not changes.keys() <= allowed:
            raise Forbidden(f"only {sorted(allowed)} may be changed")
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._task(conn, principal, task_id)
            if changes:
                # The run before the task, the order a run's end takes them in: the other way
                # round the two transactions can deadlock.
                if "priority" in changes:  # a queued run is claimed by its task's priority
                    await run_store.reprioritise_queued(conn, task_id, changes["priority"])
                await task_store.update_task(conn, principal.workspace_id, task_id, changes, now)
                await audit.record_by(
                    conn,
                    principal,
                    "task.update",
                    "task",
                    task_id,
                    now,
                    {
                        "before": {k: getattr(before, k) for k in changes},
                        "after": changes,
                    },
                )
        return await self.get(principal, task_id)

    async def cancel(self, principal: Principal, task_id: UUID) -> TaskWithRun:
        """Cancel a task: a queued run ends at once, a running one is stopped by its worker.

        Then every subtask below it that has not ended, set-wise and shallowest first, in
        bounded batches of one transaction each (each cancelled subtask audited). Cancelling an
        already cancelled task is a no-op for it but still sweeps its tree, so a cancel cut
        short is finished by the next one.
        """
        cancelled = await self._cancel_one(principal, task_id)
        stopping = await self._cancel_subtree(principal, task_id)
        await self._await_stopped(stopping)
        return cancelled

    async def _cancel_subtree(self, principal: Principal, root_id: UUID) -> Sequence[UUID]:
        """Cancel the open subtasks below `root_id`; returns the running runs asked to stop."""
        stopping: list[UUID] = []
        while True:
            now = self._clock()
            async with self._store.write() as conn:
                batch = await workflow.open_descendants(
                    conn, principal.workspace_id, root_id, CANCEL_BATCH
                )
                if not batch:
                    return stopping
                done = await task_store.cancel_many(conn, [row.id for row in batch], now)
                ends = await append_ends(
                    conn,
                    [
                        Ending(run, task, principal.workspace_id, {"status": "cancelled"})
                        for run, task in done.runs
                    ],
                    now,
                )
                for changed in [*done.tasks, *(task for _, task in done.stopping)]:
                    await audit.record_by(
                        conn,
                        principal,
                        "task.cancel",
                        "task",
                        changed,
                        now,
                        {"with": str(root_id)},
                    )
                # Tasks outside the tree that waited for a cancelled one may run now; parents
                # are in the tree, cancelled before their subtasks.
                cancelled = set(done.tasks)
                woken: list[UUID] = []
                for row in batch:
                    if row.dependents and row.id in cancelled:
                        woken += await workflow.ended(
                            conn,
                            parent_id=None,
                            blocks_parent=False,
                            dependents=row.dependents,
                            task_id=row.id,
                            now=now,
                        )
                if woken:
                    self._store.after_commit(self._on_enqueued)
                if ends:
                    self._store.after_commit(functools.partial(self._publish, [*ends]))
            stopping += [run for run, _ in done.stopping]
            if not (done.tasks or done.stopping):
                return stopping  # what is left cannot be cancelled: stop rather than spin

    async def _await_stopped(self, run_ids: Sequence[UUID], wait_s: float = 3.0) -> None:
        """Wait up to `wait_s` for the workers to stop these runs (each in its cancel poll)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while run_ids and asyncio.get_running_loop().time() < deadline:
            async with self._store.read() as conn:
                left = 0
                for start in range(0, len(run_ids), CANCEL_BATCH):
                    chunk = [*run_ids[start : start + CANCEL_BATCH]]
                    left += await task_store.running_among(conn, chunk)
            if not left:
                return
            await asyncio.sleep(0.05)

    async def _cancel_one(self, principal: Principal, task_id: UUID) -> TaskWithRun:
        for _ in range(3):
            with contextlib.suppress(_RunMoved):
                return await self._cancel_once(principal, task_id)
        raise Conflict("the task changed state meanwhile; fetch it and retry")

    async def _cancel_once(self, principal: Principal, task_id: UUID) -> TaskWithRun:
        need(principal, Permission.TASKS_WRITE)
        task, run = await self.get(principal, task_id)
        if task.status == TaskStatus.CANCELLED.value:
            return task, run  # cancelling twice is a no-op
        if not task_can_move(TaskStatus(task.status), TaskStatus.CANCELLED):
            raise Conflict(f"a {task.status} task cannot be cancelled")
        if run is not None and run.status == RunStatus.RUNNING.value:
            if await self._cancel_local(run.id):
                async with self._store.write() as conn:
                    await audit.record_by(
                        conn, principal, "task.cancel", "task", task_id, self._clock()
                    )
                return await self.get(principal, task_id)
            async with self._store.write() as conn:
                asked = await run_store.request_cancel(conn, run.id, self._clock())
                if asked:
                    await audit.record_by(
                        conn, principal, "task.cancel", "task", task_id, self._clock()
                    )
            if asked:  # the worker holding it stops it within its cancel poll
                return await self._await_end(principal, task_id, run.id)
        now = self._clock()
        async with self._store.write() as conn:
            ended: list[RunEvent] = []
            if run is not None and await task_store.cancel_queued_run(conn, run.id, now):
                ending = Ending(run.id, task_id, principal.workspace_id, {"status": "cancelled"})
                ended = await append_ends(conn, [ending], now)
            elif run is not None and run.status == RunStatus.QUEUED.value:
                # A worker claimed it since it was read: cancelling the task alone would leave
                # the run going (and its end would overwrite the task's status). Look again.
                raise _RunMoved
            if not await task_store.set_task_status(
                conn, task_id, TaskStatus.CANCELLED, now, error="cancelled on request"
            ):
                raise Conflict("the task changed state meanwhile; fetch it and retry")
            if await workflow.ended_task(conn, task_id, now):
                self._store.after_commit(self._on_enqueued)
            await audit.record_by(conn, principal, "task.cancel", "task", task_id, now)
            if ended:
                self._store.after_commit(functools.partial(self._publish, ended))
        return await self.get(principal, task_id)

    async def _await_end(
        self, principal: Principal, task_id: UUID, run_id: UUID, wait_s: float = 3.0
    ) -> TaskWithRun:
        """The task once `run_id` ended, or as it is after `wait_s`."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            task, run = await self.get(principal, task_id)
            ended = run is None or run.id != run_id or run.status != RunStatus.RUNNING.value
            if ended or asyncio.get_running_loop().time() >= deadline:
                return task, run
            await asyncio.sleep(0.05)

    async def retry(self, principal: Principal, task_id: UUID) -> tuple[TaskRecord, RunRecord]:
        """Queue a new run of a failed or cancelled task."""
        need(principal, Permission.TASKS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            task = await self._task(conn, principal, task_id)
            if task.status not in (TaskStatus.FAILED.value, TaskStatus.CANCELLED.value):
                raise Conflict(f"only failed or cancelled tasks can be retried, not {task.status}")
            try:
                agent = await self._admission.agent(conn, principal.workspace_id, task.agent_id)
            except (NotFound, Conflict):
                raise Conflict("the task's agent is not active") from None
            await self._admission.check_backlog(conn, principal.workspace_id)
            if not await task_store.set_task_status(
                conn, task_id, TaskStatus.QUEUED, now, result=None, error=None
            ):  # another retry queued it since it was read
                raise Conflict("the task changed state meanwhile; fetch it and retry")
            run = await task_store.insert_run(
                conn, task_id, principal.workspace_id, agent.id, now, priority=task.priority
            )
            await audit.record_by(
                conn, principal, "task.retry", "task", task_id, now, {"run_id": str(run.id)}
            )
            self._store.after_commit(self._on_enqueued)
        task, latest = await self.get(principal, task_id)
        return task, latest or run  # the run just queued, as it is now

    async def comment(self, principal: Principal, task_id: UUID, body: str) -> CommentRecord:
        """Add a comment to a task."""
        need(principal, Permission.TASKS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            await self._task(conn, principal, task_id)
            row = await task_store.add_comment(
                conn,
                workspace_id=principal.workspace_id,
                task_id=task_id,
                author_type=principal.actor_type,
                author_id=principal.actor_id,
                body=body,
                now=now,
            )
            await audit.record_by(
                conn, principal, "task.comment", "task", task_id, now, {"comment_id": str(row.id)}
            )
        return row

    async def comments(
        self,
        principal: Principal,
        task_id: UUID,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
    ) -> Page[CommentRecord]:
        """A page of a task's comments, oldest first."""
        async with self._store.read() as conn:
            await self._task(conn, principal, task_id)
            return await task_store.list_comments(conn, task_id, limit=limit, after=after)

    async def runs(self, principal: Principal, task_id: UUID) -> Sequence[RunRecord]:
        """Every run of a task, oldest first."""
        async with self._store.read() as conn:
            await self._task(conn, principal, task_id)
            return await task_store.list_runs(conn, task_id)

    async def timeline(
        self, principal: Principal, task_id: UUID, *, limit: int
    ) -> tuple[Sequence[RunRecord], Sequence[RunEvent]]:
        """Every run of a task, oldest first, and up to `limit` of their status, tool, usage
        and error events (no text deltas)."""
        async with self._store.read() as conn:
            await self._task(conn, principal, task_id)
            run_rows = await task_store.list_runs(conn, task_id)
            steps = await event_store.steps_of(conn, [r.id for r in run_rows], limit)
        return run_rows, steps

    async def _task(self, conn: Connection, principal: Principal, task_id: UUID) -> TaskRecord:
        task = await task_store.get_task(conn, principal.workspace_id, task_id)
        if task is None:
            raise NotFound("no such task")
        return task


class _RunMoved(Exception):
    """The task's run changed state between reading and cancelling it."""
