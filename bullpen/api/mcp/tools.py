"""The tools Bullpen offers over MCP: each validates its arguments with the REST API's own field
types and calls the same service as the REST route, under the same permission.

A tool returns a JSON object (sent as structured content and as its JSON text); a refusal or a
failure raises a `BullpenError`, which the server turns into a tool error (`server.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any
from uuid import UUID

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.responses import Response

from bullpen.api import cursor
from bullpen.api.idempotency import KEY_MAX, IdempotentWrite
from bullpen.api.problems import Replayed
from bullpen.api.schemas.tasks import COMMENT_MAX, NO_NUL, Label, Labels, Priority, Prompt, Title
from bullpen.app import Services
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.domain.records import AgentRecord, RunRecord, TaskRecord
from bullpen.domain.status import TERMINAL_TASK, TaskStatus
from bullpen.errors import NotFound
from bullpen.store import tasks as task_store
from bullpen.streams.bus.memory import Subscriber

# How long one `wait_for_task` call may hold its request: long enough to save a client most of
# its polling, short enough for proxies' idle timeouts (they commonly cut at 60 s).
WAIT_MAX_S = 50.0
WAIT_DEFAULT_S = 30.0
# While waiting, the task is read again at least this often (its end event wakes it sooner).
WAIT_POLL_S = 1.0
_ENDED = frozenset(status.value for status in TERMINAL_TASK)

IdempotencyKey = Annotated[
    str | None,
    Field(
        default=None,
        description="Makes the call safe to repeat: 1–255 printable ASCII characters, unique "
        "per call. A repeat with the same key and arguments returns the first outcome "
        "(`replayed: true`) instead of acting again; other arguments are an error. Kept 24 h.",
        pattern=r"^[ -~]+$",
        min_length=1,
        max_length=KEY_MAX,
    ),
]


@dataclass(frozen=True)
class Caller:
    """Who calls a tool (authenticated like the REST API) and the process's services."""

    principal: Principal
    svc: Services


class Args(BaseModel):
    """Tool arguments: unknown ones are refused, like unknown fields of a REST body."""

    model_config = ConfigDict(extra="forbid")


class NoArgs(Args):
    """A tool without arguments."""


class CreateTaskArgs(Args):
    """Arguments of `create_task`."""

    agent: Annotated[str, StringConstraints(min_length=1, max_length=100)] = Field(
        description="The agent to hand the task to: its name (see `list_agents`) or its id."
    )
    prompt: Prompt = Field(description="What the agent is to do (10–2000 characters).")
    title: Title | None = Field(default=None, description="Defaults to the prompt's first line.")
    priority: Priority = Field(default=0, description="Higher runs first (-100 to 100).")
    labels: Labels = Field(default_factory=list, description="Up to 20 labels.")
    parent_id: UUID | None = Field(default=None, description="Make it a subtask of this task.")
    idempotency_key: IdempotencyKey


class TaskArgs(Args):
    """Arguments naming one task."""

    task_id: UUID = Field(description="The task's id.")


class WaitArgs(TaskArgs):
    """Arguments of `wait_for_task`."""

    timeout_s: float = Field(
        default=WAIT_DEFAULT_S,
        ge=0,
        le=WAIT_MAX_S,
        description=f"Seconds to wait at most (0–{WAIT_MAX_S:g}); call again to wait longer.",
    )


class ListTasksArgs(Args):
    """Arguments of `list_tasks`."""

    status: TaskStatus | None = Field(default=None, description="Only tasks in this status.")
    agent_id: UUID | None = Field(default=None, description="Only tasks of this agent.")
    label: Label | None = Field(default=None, description="Only tasks with this label.")
    limit: int = Field(default=20, ge=1, le=100, description="Page size (max 100).")
    cursor: Annotated[str, StringConstraints(max_length=200)] | None = Field(
        default=None, description="`next_cursor` of the previous page."
    )


class CommentArgs(TaskArgs):
    """Arguments of `comment_on_task`."""

    body: Annotated[
        str, StringConstraints(min_length=1, max_length=COMMENT_MAX, pattern=NO_NUL)
    ] = Field(description="The comment (1–10000 characters).")
    idempotency_key: IdempotencyKey


def agent_view(row: AgentRecord) -> dict[str, Any]:
    """An agent as a tool shows it (no adapter config: it may hold what callers should not see)."""
    return {
        "id": str(row.id),
        "name": row.name,
        "title": row.title,
        "description": row.description,
        "status": row.status,
        "reports_to": None if row.reports_to is None else str(row.reports_to),
        "requires_approval": row.requires_approval,
    }


def run_view(run: RunRecord) -> dict[str, Any]:
    """A run's outcome and what it cost."""
    return {
        "id": str(run.id),
        "status": run.status,
        "attempt": run.attempt,
        "provider": run.provider,
        "model": run.model,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost_usd": run.cost_usd,
        "error_code": run.error_code,
        "started_at": None if run.started_at is None else run.started_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
    }


def task_view(task: TaskRecord, run: RunRecord | None) -> dict[str, Any]:
    """A task with its latest run."""
    return {
        "id": str(task.id),
        "number": f"{task.task_key}-{task.number}",
        "title": task.title,
        "agent_id": str(task.agent_id),
        "status": task.status,
        "ended": task.status in _ENDED,
        "priority": task.priority,
        "labels": list(task.labels),
        "parent_id": None if task.parent_id is None else str(task.parent_id),
        "result": task.result,
        "error": task.error,
        "created_at": task.created_at.isoformat(),
        "updated_at": task.updated_at.isoformat(),
        "run": None if run is None else run_view(run),
    }


async def list_agents(call: Caller, _: NoArgs) -> dict[str, Any]:
    """The workspace's agents, by name."""
    rows = await call.svc.agents.list(call.principal)
    return {"agents": [agent_view(row) for row in rows]}


async def create_task(call: Caller, args: CreateTaskArgs) -> dict[str, Any]:
    """Create a task for an agent and queue its first run (as `POST /api/v1/tasks`)."""
    svc, principal = call.svc, call.principal
    agent_id = await _agent_id(call, args.agent)
    fields = args.model_dump(mode="json", exclude={"idempotency_key"})
    tx_of = IdempotentWrite(
        svc,
        args.idempotency_key,
        route="MCP create_task",
        body=_body_of(fields),
        instance="/mcp#create_task",
    )
    try:
        async with tx_of.begin(principal, turn=task_store.numbering(principal.workspace_id)) as tx:
            task, run = await svc.tasks.create(
                principal,
                prompt=args.prompt,
                agent_id=agent_id,
                title=args.title,
                priority=args.priority,
                labels=args.labels,
                parent_id=args.parent_id,
            )
            view = task_view(task, run)
            tx.respond(201, _Stored(view=view))
            return view
    except Replayed as replay:
        return _replayed(replay.response)


async def get_task(call: Caller, args: TaskArgs) -> dict[str, Any]:
    """A task: its status, result, latest run and what all its runs cost."""
    return await _costed(call, args.task_id)


async def wait_for_task(call: Caller, args: WaitArgs) -> dict[str, Any]:
    """Wait until the task has ended (done, failed or cancelled) or `timeout_s` has passed."""
    svc, principal = call.svc, call.principal
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout_s
    task, _ = await svc.tasks.get(principal, args.task_id)  # another workspace's: NotFound
    if task.status not in _ENDED and args.timeout_s > 0:
        with svc.bus.open(args.task_id, principal.workspace_id) as live:
            while True:  # read after subscribing: an end in between is not missed
                task, _ = await svc.tasks.get(principal, args.task_id)
                left = deadline - loop.time()
                if task.status in _ENDED or left <= 0:
                    break
                await _until_end_event(live, min(left, WAIT_POLL_S))
    view = await _costed(call, args.task_id)
    view["timed_out"] = not view["ended"]
    return view


async def list_tasks(call: Caller, args: ListTasksArgs) -> dict[str, Any]:
    """A page of the workspace's tasks, newest first."""
    page, runs = await call.svc.tasks.list(
        call.principal,
        limit=args.limit,
        after=cursor.after(args.cursor),
        status=None if args.status is None else args.status.value,
        agent_id=args.agent_id,
        label=args.label,
    )
    return {
        "tasks": [task_view(row, runs.get(row.id)) for row in page.rows],
        "next_cursor": cursor.next_of(page),
    }


async def comment_on_task(call: Caller, args: CommentArgs) -> dict[str, Any]:
    """Add a comment to a task (as `POST /api/v1/tasks/{id}/comments`)."""
    fields = args.model_dump(mode="json", exclude={"idempotency_key"})
    tx_of = IdempotentWrite(
        call.svc,
        args.idempotency_key,
        route="MCP comment_on_task",
        body=_body_of(fields),
        instance="/mcp#comment_on_task",
    )
    try:
        async with tx_of.begin(call.principal) as tx:
            row = await call.svc.tasks.comment(call.principal, args.task_id, args.body)
            view = {
                "id": str(row.id),
                "task_id": str(row.task_id),
                "body": row.body,
                "created_at": row.created_at.isoformat(),
            }
            tx.respond(201, _Stored(view=view))
            return view
    except Replayed as replay:
        return _replayed(replay.response)


async def cancel_task(call: Caller, args: TaskArgs) -> dict[str, Any]:
    """Cancel a task and its open subtasks; cancelling twice changes nothing."""
    task, run = await call.svc.tasks.cancel(call.principal, args.task_id)
    return task_view(task, run)


async def _costed(call: Caller, task_id: UUID) -> dict[str, Any]:
    task, run = await call.svc.tasks.get(call.principal, task_id)
    runs = await call.svc.tasks.runs(call.principal, task_id)
    costs = [row.cost_usd for row in runs if row.cost_usd is not None]
    view = task_view(task, run)
    view["runs"] = len(runs)
    view["cost_usd"] = round(sum(costs), 9) if costs else None
    return view


async def _until_end_event(live: Subscriber, wait_s: float) -> None:
    """Return at a run's end event, after `wait_s`, or when the subscriber lagged."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    while (left := until - loop.time()) > 0:
        event = await live.get(left)
        if event is None:
            if live.lagged:
                live.reset()  # events were dropped: the caller reads the store again
            return
        if event.is_end:
            return


async def _agent_id(call: Caller, agent: str) -> UUID:
    """The agent named by id or by name; the id is checked when the task is created."""
    try:
        return UUID(agent)
    except ValueError:
        pass
    for row in await call.svc.agents.list(call.principal):
        if row.name == agent:
            return row.id
    raise NotFound(f"agent: no agent named {agent!r} in this workspace (see `list_agents`)")


def _body_of(fields: dict[str, Any]) -> Callable[[], Awaitable[bytes]]:
    async def body() -> bytes:
        return orjson.dumps(fields)

    return body


class _Stored(BaseModel):
    """A tool's outcome as the idempotency store keeps it."""

    view: dict[str, Any]


def _replayed(response: Response) -> dict[str, Any]:
    """A stored outcome, replayed: the view it returned, or the refusal it raised again."""
    stored = orjson.loads(bytes(response.body))
    if response.status_code >= 400:
        raise StoredRefusal(stored)
    view: dict[str, Any] = stored["view"]
    return {**view, "replayed": True}


class StoredRefusal(Exception):
    """A refusal stored under an idempotency key, replayed: its problem document."""

    def __init__(self, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail", ""))
        self.problem = problem


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what it does, its arguments, the permission it needs."""

    name: str
    description: str
    args: type[Args]
    permission: Permission
    run: Callable[[Caller, Any], Awaitable[dict[str, Any]]]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "list_agents",
            "List the workspace's agents (name, title, description, status): who can take a task.",
            NoArgs,
            Permission.AGENTS_READ,
            list_agents,
            read_only=True,
        ),
        Tool(
            "create_task",
            "Hand a task to an agent: its run is queued at once. Returns the task; follow it "
            "with `wait_for_task` or `get_task`.",
            CreateTaskArgs,
            Permission.TASKS_WRITE,
            create_task,
        ),
        Tool(
            "get_task",
            "A task's status, result or error, its latest run, and what its runs cost.",
            TaskArgs,
            Permission.TASKS_READ,
            get_task,
            read_only=True,
        ),
        Tool(
            "wait_for_task",
            f"Wait until a task has ended (done, failed or cancelled), at most `timeout_s` "
            f"seconds (up to {WAIT_MAX_S:g}); returns it as `get_task` does, with `timed_out` "
            "true if it is still going (call again to keep waiting).",
            WaitArgs,
            Permission.TASKS_READ,
            wait_for_task,
            read_only=True,
        ),
        Tool(
            "list_tasks",
            "List the workspace's tasks, newest first, optionally by status, agent or label; "
            "pass `next_cursor` back as `cursor` for the next page.",
            ListTasksArgs,
            Permission.TASKS_READ,
            list_tasks,
            read_only=True,
        ),
        Tool(
            "comment_on_task",
            "Add a comment to a task.",
            CommentArgs,
            Permission.TASKS_WRITE,
            comment_on_task,
        ),
        Tool(
            "cancel_task",
            "Cancel a task (and its open subtasks): a queued run ends at once, a running one "
            "is stopped. Cancelling a cancelled task changes nothing.",
            TaskArgs,
            Permission.TASKS_WRITE,
            cancel_task,
            destructive=True,
            idempotent=True,
        ),
    )
}
