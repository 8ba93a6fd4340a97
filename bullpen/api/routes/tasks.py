"""/api/v1/tasks: create, read, list, and stream a task's events."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse

from bullpen.api import cursor
from bullpen.api.deps import ReaderDep, ServicesDep, WriterDep, require_json
from bullpen.api.schemas import Problem, TaskCreate, TaskPage, TaskPublic
from bullpen.domain.status import TaskStatus
from bullpen.errors import InvalidInput, NotFound
from bullpen.store import tasks as task_store
from bullpen.streams.sse import task_stream

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])

_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {"application/problem+json": {}}}
    for code in (401, 404, 413, 415, 422, 503)
}

LAST_EVENT_ID_MAX = 2**31 - 1


@router.post(
    "",
    status_code=201,
    response_model=TaskPublic,
    dependencies=[Depends(require_json)],
    responses=_PROBLEMS,
    summary="Create a task and enqueue its first run",
)
async def create_task(
    body: TaskCreate, principal: WriterDep, svc: ServicesDep, response: Response
) -> TaskPublic:
    """Create a task for an agent of the caller's workspace; its run is queued atomically."""
    task, run = await svc.tasks.create(principal, prompt=body.prompt, agent_id=body.agent_id)
    response.headers["Location"] = f"/api/v1/tasks/{task.id}"
    return TaskPublic.from_rows(task, run)


@router.get("", response_model=TaskPage, responses=_PROBLEMS, summary="List tasks")
async def list_tasks(
    principal: ReaderDep,
    svc: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")] = 20,
    cursor_: Annotated[str | None, Query(alias="cursor", max_length=200)] = None,
    status: Annotated[TaskStatus | None, Query()] = None,
) -> TaskPage:
    """The workspace's tasks, newest first, keyset-paginated."""
    after = cursor.decode(cursor_) if cursor_ else None
    page, runs = await svc.tasks.list(
        principal, limit=limit, after=after, status=status.value if status else None
    )
    return TaskPage(
        items=[TaskPublic.from_rows(row, runs.get(row.id)) for row in page.rows],
        next_cursor=cursor.encode(*page.next_after) if page.next_after else None,
    )


@router.get("/{task_id}", response_model=TaskPublic, responses=_PROBLEMS, summary="Get a task")
async def get_task(task_id: UUID, principal: ReaderDep, svc: ServicesDep) -> TaskPublic:
    """One task with its latest run."""
    task, run = await svc.tasks.get(principal, task_id)
    return TaskPublic.from_rows(task, run)


@router.get(
    "/{task_id}/events",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
        **_PROBLEMS,
    },
    response_class=StreamingResponse,
    summary="Stream a task's events (SSE)",
)
async def task_events(
    task_id: UUID,
    principal: ReaderDep,
    svc: ServicesDep,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> StreamingResponse:
    """Replay events after `Last-Event-ID`, then follow live until the task's run ends."""
    after = _parse_last_event_id(last_event_id)
    async with svc.store.read() as conn:
        if await task_store.get_task(conn, principal.workspace_id, task_id) is None:
            raise NotFound("no such task")
    stream = task_stream(svc.store, svc.bus, task_id, after, svc.settings.sse_keepalive_s)
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _parse_last_event_id(value: str | None) -> int:
    if value is None or value == "":
        return 0
    if not value.isdigit() or int(value) > LAST_EVENT_ID_MAX:
        raise InvalidInput(
            "Last-Event-ID must be a non-negative integer (an event's `id`)",
            errors=[
                {
                    "location": "header",
                    "field": "Last-Event-ID",
                    "message": "not a non-negative integer",
                    "code": "last_event_id",
                }
            ],
        )
    return int(value)
