"""Admission: may a task be queued? One answer for every path that enqueues.

Tasks created or retried over the API, routines fired by hand or by the scheduler, and
subtasks an agent delegates all ask `Admission`: is the assignee active, would the subtask
nest too deep, is the workspace's queue full. Each path words a refusal for its audience (an
HTTP problem, a routine fire's `skipped_*` outcome, a tool result the model reads), but the
rule is decided here, once.
"""

from __future__ import annotations

import time
from typing import Protocol
from uuid import UUID

from bullpen.domain.agents import AgentStatus
from bullpen.domain.records import AgentRecord
from bullpen.errors import AgentTerminated, Conflict, NotFound, RateLimited, TaskTooDeep
from bullpen.store import agents as agent_store
from bullpen.store import runs as run_store
from bullpen.store import workflow
from bullpen.store.base import Connection

# Creates that may be in flight at once across every API process, unserialised: within this
# many of the bound, the backlog check serialises a workspace's creates to stay exact.
_EXACT_MARGIN = 1000


class Assignee(Protocol):
    """What admission reads of an agent."""

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> str: ...


def unavailable(agent: Assignee) -> str | None:
    """Why `agent` takes no new task (its status), or None when it is active."""
    return None if agent.status == AgentStatus.ACTIVE else str(agent.status)


class Admission:
    """Decides whether a task may be queued; built once, shared by every enqueuing path."""

    def __init__(
        self,
        *,
        max_backlog: int = 10_000,
        backlog_retry_after_s: int = 5,
        max_depth: int = 32,
    ) -> None:
        self.max_backlog = max_backlog
        self.max_depth = max_depth
        self._retry_after_s = backlog_retry_after_s
        self._seen: dict[UUID, tuple[float, int]] = {}  # workspace -> (when, count)

    async def agent(
        self, conn: Connection, workspace_id: UUID, agent_id: UUID, *, terminated: bool = True
    ) -> AgentRecord:
        """The assignee if it takes tasks: NotFound, AgentTerminated or Conflict otherwise.

        With `terminated=False` a terminated agent is a plain Conflict, like a paused one (what
        a routine's manual fire has always answered).
        """
        agent = await agent_store.get_agent(conn, workspace_id, agent_id)
        if agent is None:
            raise NotFound("no such agent in this workspace")
        status = unavailable(agent)
        if status == AgentStatus.TERMINATED and terminated:
            raise AgentTerminated(f"agent {agent.name!r} is terminated and takes no tasks")
        if status is not None:
            raise Conflict(f"agent {agent.name!r} is {status}")
        return agent

    async def check_depth(self, conn: Connection, parent_id: UUID) -> None:
        """Refuse a new subtask of `parent_id` that would nest too deep (422)."""
        if await self.too_deep(conn, parent_id):
            message = f"subtasks nest at most {self.max_depth} levels below their root task"
            raise TaskTooDeep(
                message,
                errors=[
                    {
                        "location": "body",
                        "field": "parent_id",
                        "message": message,
                        "code": "too_deep",
                    }
                ],
            )

    async def too_deep(self, conn: Connection, parent_id: UUID) -> bool:
        """Whether a new subtask of `parent_id` would nest deeper than `max_depth`."""
        return await workflow.depth_below_root(conn, parent_id, self.max_depth) + 1 > self.max_depth

    async def waiting(self, conn: Connection, workspace_id: UUID) -> int:
        """How many runs of the workspace wait, counted up to the bound (bounded cost)."""
        return await run_store.queued_backlog(conn, workspace_id, self.max_backlog)

    def full(self, waiting: int) -> bool:
        """Whether a queue with `waiting` runs takes no more."""
        return waiting >= self.max_backlog

    def full_message(self, *, subject: str = "this workspace") -> str:
        """What a refusal for a full queue says."""
        return f"{subject} already has {self.max_backlog} runs waiting in the queue"

    async def check_backlog(self, conn: Connection, workspace_id: UUID) -> None:
        """Refuse to enqueue beyond the workspace's bounded backlog (429, nothing created).

        A count costs up to `max_backlog` index entries, so a count far below the bound is
        reused for a second (plus what this process enqueued since). Within `_EXACT_MARGIN`
        of the bound every enqueue counts afresh under a per-workspace lock held to its
        commit (PostgreSQL; SQLite has one writer), so concurrent creates, in this process or
        others, cannot together pass the bound: its creates are serialised only while the
        queue is nearly full.
        """
        exact_from = self.max_backlog - _EXACT_MARGIN
        now = time.monotonic()
        seen = self._seen.get(workspace_id)
        reusable = min(self.max_backlog // 2, exact_from)
        if seen is not None and now - seen[0] < 1.0 and seen[1] < reusable:
            self._seen[workspace_id] = (seen[0], seen[1] + 1)  # this one joins it
            return
        waiting = await self.waiting(conn, workspace_id)
        if exact_from <= waiting < self.max_backlog:  # a full queue refuses without waiting
            await run_store.lock_backlog(conn, workspace_id)
            waiting = await self.waiting(conn, workspace_id)
        self._seen[workspace_id] = (now, waiting + 1)
        if self.full(waiting):
            raise RateLimited(
                self.full_message() + "; retry when some have started",
                retry_after=self._retry_after_s,
            )
