"""/api/v1/routines: scheduled tasks (cron + time zone) for an agent, their fires, fire now."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response

from bullpen.api import cursor, docs
from bullpen.api.deps import Routines, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.routines import (
    RoutineCreate,
    RoutineFirePage,
    RoutineFirePublic,
    RoutinePage,
    RoutinePublic,
    RoutineUpdate,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/routines", tags=["routines"])

RoutineId = Annotated[UUID, docs.path_id("routine")]
Reader = Annotated[Principal, require(Permission.TASKS_READ)]
Writer = Annotated[Principal, require(Permission.AGENTS_WRITE)]
Firer = Annotated[Principal, require(Permission.TASKS_WRITE)]
PageSize = Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")]
Cursor = Annotated[
    str | None,
    Query(alias="cursor", max_length=200, description="`next_cursor` of the previous page"),
]

_ROUTINE_LINKS = {
    "GetRoutine": docs.link("getRoutine", routine_id="$response.body#/id"),
    "UpdateRoutine": docs.link("updateRoutine", routine_id="$response.body#/id"),
    "ListFires": docs.link("listRoutineFires", routine_id="$response.body#/id"),
    "FireRoutine": docs.link("fireRoutine", routine_id="$response.body#/id"),
}


@router.get(
    "",
    operation_id="listRoutines",
    response_model=RoutinePage,
    responses=docs.problems(*docs.READ),
    summary="List routines",
)
async def list_routines(
    principal: Reader,
    routines: Routines,
    limit: PageSize = 50,
    cursor_: Cursor = None,
    agent_id: Annotated[UUID | None, Query(description="Only this agent's routines")] = None,
) -> RoutinePage:
    """The workspace's routines, oldest first, keyset-paginated."""
    page = await routines.list(
        principal, limit=limit, after=cursor.after(cursor_), agent_id=agent_id
    )
    return RoutinePage(
        items=[RoutinePublic.from_row(row) for row in page.rows], next_cursor=cursor.next_of(page)
    )


@router.post(
    "",
    operation_id="createRoutine",
    status_code=201,
    response_model=RoutinePublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(RoutinePublic, "The routine", _ROUTINE_LINKS),
        **docs.problems(*docs.WRITE),
    },
    summary="Create a routine",
)
async def create_routine(
    body: RoutineCreate, principal: Writer, routines: Routines, idem: Idempotent
) -> Response:
    """Create a routine for an agent of the workspace; a bad `cron` or `timezone` is 422, an
    unknown agent 404, a name in use 409. Its first slot is the next one after now."""
    async with idem.begin(principal) as tx:
        values = body.model_dump(mode="json")
        values["agent_id"] = body.agent_id
        row = await routines.create(principal, values)
        return tx.respond(201, RoutinePublic.from_row(row), location=f"/api/v1/routines/{row.id}")


@router.get(
    "/{routine_id}",
    operation_id="getRoutine",
    response_model=RoutinePublic,
    responses=docs.problems(*docs.READ),
    summary="Get a routine",
)
async def get_routine(
    routine_id: RoutineId, principal: Reader, routines: Routines
) -> RoutinePublic:
    """One routine of the workspace, with its next slot."""
    return RoutinePublic.from_row(await routines.get(principal, routine_id))


@router.patch(
    "/{routine_id}",
    operation_id="updateRoutine",
    response_model=RoutinePublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(*docs.WRITE),
    summary="Change, disable or enable a routine",
)
async def update_routine(
    routine_id: RoutineId, body: RoutineUpdate, principal: Writer, routines: Routines
) -> RoutinePublic:
    """Only the fields sent change; `null` is not a value for any of them."""
    changes = body.model_dump(mode="json", exclude_unset=True)
    if "agent_id" in changes:
        changes["agent_id"] = body.agent_id
    return RoutinePublic.from_row(await routines.update(principal, routine_id, changes))


@router.delete(
    "/{routine_id}",
    operation_id="deleteRoutine",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Delete a routine",
)
async def delete_routine(routine_id: RoutineId, principal: Writer, routines: Routines) -> Response:
    """Delete a routine and its fires; the tasks it created stay."""
    await routines.delete(principal, routine_id)
    return Response(status_code=204)


@router.get(
    "/{routine_id}/fires",
    operation_id="listRoutineFires",
    response_model=RoutineFirePage,
    responses=docs.problems(*docs.READ),
    summary="List a routine's fires",
)
async def list_fires(
    routine_id: RoutineId,
    principal: Reader,
    routines: Routines,
    limit: PageSize = 50,
    cursor_: Cursor = None,
) -> RoutineFirePage:
    """The slots the routine handled (created, skipped or missed), latest first; the latest
    1000 are kept."""
    page = await routines.fires(principal, routine_id, limit=limit, after=cursor.after(cursor_))
    return RoutineFirePage(
        items=[RoutineFirePublic.from_row(row) for row in page.rows],
        next_cursor=cursor.next_of(page),
    )


@router.post(
    "/{routine_id}/fire",
    operation_id="fireRoutine",
    status_code=201,
    response_model=RoutineFirePublic,
    responses={
        **docs.created(
            RoutineFirePublic,
            "The fire, with the task it queued",
            {"GetTask": docs.link("getTask", task_id="$response.body#/task_id")},
        ),
        **docs.problems(*docs.WRITE),
    },
    summary="Fire a routine now",
)
async def fire_routine(
    routine_id: RoutineId, principal: Firer, routines: Routines, idem: Idempotent
) -> Response:
    """Queue the routine's task now, whatever its schedule, `enabled` and concurrency policy;
    a paused agent is 409, a full queue 429."""
    async with idem.begin(principal) as tx:
        row = await routines.fire(principal, routine_id)
        return tx.respond(
            201, RoutineFirePublic.from_row(row), location=f"/api/v1/tasks/{row.task_id}"
        )
