"""/api/v1/tasks: create, read, list, change, cancel, retry, comment, runs, and the SSE stream."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import StringConstraints
from pydantic.json_schema import SkipJsonSchema

from bullpen.api import cursor, docs
from bullpen.api.deps import (
    ServicesDep,
    caller_with,
    check_json,
    require,
    require_json,
    services_of,
)
from bullpen.api.direct import body_as, served_by
from bullpen.api.eventstream import EventStream
from bullpen.api.idempotency import HEADER, Idempotent, write_of
from bullpen.api.schemas.tasks import (
    CommentCreate,
    CommentPage,
    CommentPublic,
    RunList,
    RunPublic,
    TaskCreate,
    TaskDependencies,
    TaskPage,
    TaskPublic,
    TaskRef,
    TaskUpdate,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.domain.status import TaskStatus
from bullpen.store import tasks as task_store
from bullpen.streams.sse import TaskCursor, task_stream
from bullpen.streams.tree import split_cursor, tree_stream

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])

Reader = Annotated[Principal, require(Permission.TASKS_READ)]
# `<run>.<seq>` or a bare `<seq>` (run 1), then with `subtasks` `~` and a change's position.
TASK_EVENT_ID = r"^([0-9]{1,6}\.)?[0-9]{1,9}(~([0-9]{1,19}-)?[0-9]{1,19})?$"
Writer = Annotated[Principal, require(Permission.TASKS_WRITE)]
TaskId = Annotated[UUID, docs.path_id("task")]
PageSize = Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")]
Cursor = Annotated[
    str | None,
    Query(alias="cursor", max_length=200, description="`next_cursor` of the previous page"),
]

_TASK_LINKS = {
    "GetTask": docs.link("getTask", task_id="$response.body#/id"),
    "UpdateTask": docs.link("updateTask", task_id="$response.body#/id"),
    "CancelTask": docs.link("cancelTask", task_id="$response.body#/id"),
    "ListRuns": docs.link("listTaskRuns", task_id="$response.body#/id"),
    "AddComment": docs.link("addTaskComment", task_id="$response.body#/id"),
    "StreamEvents": docs.link("streamTaskEvents", task_id="$response.body#/id"),
    "GetRun": docs.link("getRun", run_id="$response.body#/run/id"),
}


async def create_task(
    body: TaskCreate, principal: Writer, svc: ServicesDep, idem: Idempotent
) -> Response:
    """Create a task for an agent of the caller's workspace; its run is queued atomically."""
    async with idem.begin(principal, turn=task_store.numbering(principal.workspace_id)) as tx:
        task, run = await svc.tasks.create(
            principal,
            prompt=body.prompt,
            agent_id=body.agent_id,
            title=body.title,
            priority=body.priority,
            labels=body.labels,
            parent_id=body.parent_id,
            blocked_by=body.blocked_by,
        )
        return tx.respond(201, TaskPublic.from_rows(task, run), location=f"/api/v1/tasks/{task.id}")


async def create_request(request: Request) -> Response:
    """`create_task` with its parameters resolved here, as FastAPI would resolve them (415,
    then the caller: 401, 429, 403; then the `Idempotency-Key`: 400; then the body: 422),
    for a fraction of the CPU. The app serves it ahead of its middleware (`BullpenApp`)."""
    check_json(request)
    svc = services_of(request)
    principal = await caller_with(request, svc, Permission.TASKS_WRITE)
    idem = write_of(request, svc, request.headers.get(HEADER))
    body = body_as(TaskCreate, await request.body())
    return await create_task(body, principal, svc, idem)


router.add_api_route(
    "",
    create_task,
    methods=["POST"],
    route_class_override=served_by(create_request),
    operation_id="createTask",
    status_code=201,
    response_model=TaskPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(TaskPublic, "The task, queued", _TASK_LINKS),
        **docs.problems(*docs.WRITE),
    },
    summary="Create a task and enqueue its first run",
)


@router.get(
    "",
    operation_id="listTasks",
    response_model=TaskPage,
    responses=docs.problems(*docs.READ),
    summary="List tasks",
)
async def list_tasks(
    principal: Reader,
    svc: ServicesDep,
    limit: PageSize = 20,
    cursor_: Cursor = None,
    status: Annotated[TaskStatus | None, Query(description="Only tasks in this status")] = None,
    agent_id: Annotated[UUID | None, Query(description="Only tasks of this agent")] = None,
    label: Annotated[
        str | None, Query(max_length=50, description="Only tasks with this label")
    ] = None,
) -> TaskPage:
    """The workspace's tasks, newest first, keyset-paginated."""
    page, runs = await svc.tasks.list(
        principal,
        limit=limit,
        after=cursor.after(cursor_),
        status=status.value if status else None,
        agent_id=agent_id,
        label=label,
    )
    return TaskPage(
        items=[TaskPublic.from_rows(row, runs.get(row.id)) for row in page.rows],
        next_cursor=cursor.next_of(page),
    )


@router.get(
    "/{task_id}",
    operation_id="getTask",
    response_model=TaskPublic,
    responses=docs.problems(*docs.READ),
    summary="Get a task",
)
async def get_task(task_id: TaskId, principal: Reader, svc: ServicesDep) -> TaskPublic:
    """One task with its latest run."""
    task, run = await svc.tasks.get(principal, task_id)
    return TaskPublic.from_rows(task, run)


@router.patch(
    "/{task_id}",
    operation_id="updateTask",
    response_model=TaskPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(*docs.WRITE),
    summary="Change a task's title, priority or labels",
)
async def update_task(
    task_id: TaskId, body: TaskUpdate, principal: Writer, svc: ServicesDep
) -> TaskPublic:
    """Only the fields sent change; `null` is not a value for any of them."""
    task, run = await svc.tasks.update(principal, task_id, body.model_dump(exclude_unset=True))
    return TaskPublic.from_rows(task, run)


@router.post(
    "/{task_id}/cancel",
    operation_id="cancelTask",
    response_model=TaskPublic,
    responses=docs.problems(*docs.WRITE),
    summary="Cancel a task",
)
async def cancel_task(task_id: TaskId, principal: Writer, svc: ServicesDep) -> TaskPublic:
    """A queued run ends at once; a running one is stopped. Cancelling twice is a no-op."""
    task, run = await svc.tasks.cancel(principal, task_id)
    return TaskPublic.from_rows(task, run)


@router.post(
    "/{task_id}/retry",
    operation_id="retryTask",
    status_code=201,
    response_model=TaskPublic,
    responses={
        **docs.created(TaskPublic, "The task with its new queued run", _TASK_LINKS),
        **docs.problems(*docs.WRITE),
    },
    summary="Run a failed or cancelled task again",
)
async def retry_task(
    task_id: TaskId, principal: Writer, svc: ServicesDep, idem: Idempotent
) -> Response:
    """Queue a new run of the task (a new attempt history entry)."""
    async with idem.begin(principal) as tx:
        task, run = await svc.tasks.retry(principal, task_id)
        return tx.respond(201, TaskPublic.from_rows(task, run), location=f"/api/v1/runs/{run.id}")


@router.get(
    "/{task_id}/runs",
    operation_id="listTaskRuns",
    response_model=RunList,
    responses=docs.problems(*docs.READ),
    summary="List a task's runs",
)
async def list_runs(task_id: TaskId, principal: Reader, svc: ServicesDep) -> RunList:
    """Every run (attempt history) of the task, oldest first."""
    rows = await svc.tasks.runs(principal, task_id)
    return RunList(items=[RunPublic.from_row(row) for row in rows])


@router.get(
    "/{task_id}/dependencies",
    operation_id="getTaskDependencies",
    response_model=TaskDependencies,
    responses=docs.problems(*docs.READ),
    summary="A task's subtasks and blockers",
)
async def dependencies(task_id: TaskId, principal: Reader, svc: ServicesDep) -> TaskDependencies:
    """Its subtasks (oldest first) and the tasks blocking it, with what each ended with."""
    children, blockers = await svc.tasks.dependencies(principal, task_id)
    return TaskDependencies(
        children=[TaskRef.from_row(row) for row in children],
        blockers=[TaskRef.from_row(row) for row in blockers],
    )


@router.post(
    "/{task_id}/comments",
    operation_id="addTaskComment",
    status_code=201,
    response_model=CommentPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            CommentPublic,
            "The comment",
            {"ListComments": docs.link("listTaskComments", task_id="$response.body#/task_id")},
        ),
        **docs.problems(*docs.WRITE),
    },
    summary="Comment on a task",
)
async def add_comment(
    task_id: TaskId, body: CommentCreate, principal: Writer, svc: ServicesDep, idem: Idempotent
) -> Response:
    """Append a comment."""
    async with idem.begin(principal) as tx:
        row = await svc.tasks.comment(principal, task_id, body.body)
        return tx.respond(
            201, CommentPublic.from_row(row), location=f"/api/v1/tasks/{task_id}/comments"
        )


@router.get(
    "/{task_id}/comments",
    operation_id="listTaskComments",
    response_model=CommentPage,
    responses=docs.problems(*docs.READ),
    summary="List a task's comments",
)
async def list_comments(
    task_id: TaskId,
    principal: Reader,
    svc: ServicesDep,
    limit: PageSize = 50,
    cursor_: Cursor = None,
) -> CommentPage:
    """Comments, oldest first, keyset-paginated."""
    page = await svc.tasks.comments(principal, task_id, limit=limit, after=cursor.after(cursor_))
    return CommentPage(
        items=[CommentPublic.from_row(row) for row in page.rows], next_cursor=cursor.next_of(page)
    )


@router.get(
    "/{task_id}/events",
    operation_id="streamTaskEvents",
    responses={
        200: docs.EVENT_STREAM,
        **docs.problems(*docs.READ, 503),
    },
    response_class=EventStream,
    status_code=200,
    summary="Stream a task's events (SSE)",
)
async def task_events(
    task_id: TaskId,
    principal: Reader,
    svc: ServicesDep,
    subtasks: Annotated[
        bool,
        Query(
            description="Also a `task` event for every creation and status change in the "
            "task's tree (itself, its subtasks, theirs); ids become `<run>.<seq>~<change>`"
        ),
    ] = False,
    last_event_id: Annotated[
        Annotated[str, StringConstraints(pattern=TASK_EVENT_ID)] | SkipJsonSchema[None],
        Header(
            description="Resume after this event id (`<run number>.<seq>`, the `id:` of an "
            "event of this stream; a bare `<seq>`, as this stream's ids once were, means run 1; "
            "with `subtasks`, `<run>.<seq>~<change id>`)"
        ),
    ] = None,
) -> EventStream:
    """Every run of the task in order (each introduced by a `run` event): events replayed
    after `Last-Event-ID`, then live; a `close` event once the task has finished. With
    `subtasks`, the tree's status changes too (as `task` events, in the order they
    committed)."""
    keepalive = svc.settings.sse_keepalive_s
    if not subtasks:
        task_part, _ = split_cursor(last_event_id)
        cursor_ = TaskCursor.parse(task_part)
        # Listening before the first read: what changes after it is heard.
        live = svc.bus.open(task_id, principal.workspace_id)
        try:
            first = await svc.tasks.runs_of(principal, task_id)
        except BaseException:
            live.close()
            raise
        return EventStream(
            task_stream(svc.store, live, task_id, cursor_, keepalive, first),
            on_close=live.close,
            write_timeout_s=svc.settings.sse_write_timeout_s,
        )
    await svc.tasks.get(principal, task_id)
    live = svc.bus.open(task_id, principal.workspace_id)
    try:
        feed, close_feed = await svc.feeds.open(principal.workspace_id, counted=False)
    except BaseException:
        live.close()
        raise

    def close() -> None:
        live.close()
        close_feed()

    return EventStream(
        tree_stream(svc.store, live, feed, task_id, last_event_id, keepalive),
        on_close=close,
        write_timeout_s=svc.settings.sse_write_timeout_s,
    )
