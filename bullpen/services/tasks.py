"""Task use cases: create (with its run, atomically, audited), read, list."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.principal import Principal
from bullpen.errors import Forbidden, NotFound
from bullpen.store import agents as agent_store
from bullpen.store import audit
from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.tasks import TaskPage

TITLE_CHARS = 80


def title_from_prompt(prompt: str) -> str:
    """A one-line title: the prompt's first line, shortened."""
    line = prompt.strip().splitlines()[0] if prompt.strip() else ""
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class TaskService:
    """Creates and reads tasks within the caller's workspace."""

    def __init__(
        self, store: Store, clock: Callable[[], datetime], on_enqueued: Callable[[], None]
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_enqueued = on_enqueued

    async def create(self, principal: Principal, *, prompt: str, agent_id: UUID) -> tuple[Any, Any]:
        """Create a task and enqueue its run in one transaction; returns the stored task."""
        if not principal.can_write:
            raise Forbidden("viewers cannot create tasks")
        now = self._clock()
        async with self._store.write() as conn:
            agent = await agent_store.get_agent(conn, principal.workspace_id, agent_id)
            if agent is None:
                raise NotFound("no such agent in this workspace")
            if agent.status != "active":
                raise Forbidden(f"agent {agent.name!r} is {agent.status}")
            task, run = await task_store.insert_task_with_run(
                conn,
                workspace_id=principal.workspace_id,
                agent_id=agent_id,
                title=title_from_prompt(prompt),
                prompt=prompt,
                creator_user_id=principal.user_id,
                creator_key_id=principal.api_key_id,
                now=now,
            )
            await audit.record(
                conn,
                workspace_id=principal.workspace_id,
                actor_type=principal.actor_type,
                actor_id=principal.actor_id,
                action="task.create",
                target_type="task",
                target_id=task.id,
                now=now,
                data={"agent_id": str(agent_id), "run_id": str(run.id)},
            )
        self._on_enqueued()
        return task, run

    async def get(self, principal: Principal, task_id: UUID) -> tuple[Any, Any]:
        """The task and its latest run; another workspace's task is NotFound."""
        async with self._store.read() as conn:
            task = await task_store.get_task(conn, principal.workspace_id, task_id)
            if task is None:
                raise NotFound("no such task")
            run_rows = await task_store.runs_for_tasks(conn, [task_id])
        return task, run_rows.get(task_id)

    async def list(
        self,
        principal: Principal,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
        status: str | None,
    ) -> tuple[TaskPage, dict[UUID, Any]]:
        """A page of tasks, newest first, with each one's latest run."""
        async with self._store.read() as conn:
            page = await task_store.list_tasks(
                conn, principal.workspace_id, limit=limit, after=after, status=status
            )
            run_rows = await task_store.runs_for_tasks(conn, [row.id for row in page.rows])
        return page, run_rows
