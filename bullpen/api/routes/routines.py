"""/api/v1/routines: scheduled tasks (cron + time zone) for an agent, their fires, fire now."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bullpen.api import cursor, docs
from bullpen.api.deps import Routines, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.routes.agents import AgentName
from bullpen.api.schemas import Labels, Priority, Prompt, Strict, Title, optional
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.domain.records import RoutineFireRecord, RoutineRecord
from bullpen.services.routines import CATCH_UP_MAX

# Five fields of cron's characters, one space apart; which of them can fire, and which zone
# names exist, the service checks (422 naming the field).
_FIELD = r"[0-9A-Za-z*,/#-]+"
Cron = Annotated[str, StringConstraints(max_length=100, pattern=rf"^{_FIELD}( {_FIELD}){{4}}$")]
TimeZone = Annotated[
    str,
    StringConstraints(max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"),
]
Enabled = Annotated[bool, Field(strict=True)]

_CRON = (
    "Five fields one space apart, `minute hour day-of-month month day-of-week` (cron syntax: "
    "`*`, lists, ranges, steps, `JAN`–`DEC`, `SUN`–`SAT`, and `L`, `LW`, `#`), in `timezone`."
)


class Concurrency(StrEnum):
    """What a slot does while the previous fire's task has not ended."""

    SKIP = "skip"
    QUEUE = "queue"


class CatchUp(StrEnum):
    """Which slots passed while no scheduler ran are fired when one runs again."""

    SKIP = "skip"
    LATEST = "latest"
    ALL = "all"


class RoutineCreate(Strict):
    """A new routine: at each slot of `cron` in `timezone`, a task for `agent_id`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "daily-metrics",
                    "agent_id": "0b7c6f0e-3f5e-4c1d-9a51-2f1b8d3c4e5a",
                    "cron": "0 9 * * 1-5",
                    "timezone": "Europe/Berlin",
                    "prompt": "Analyze yesterday's dataset and extract key metrics",
                }
            ]
        },
    )

    name: AgentName = Field(description="Unique in the workspace.")
    agent_id: UUID
    cron: Cron = Field(description=_CRON, examples=["0 9 * * 1-5"])
    timezone: TimeZone = Field(default="UTC", description="An IANA time zone name.")
    prompt: Prompt
    title: Title | None = Field(
        default=None, description="The tasks' title; defaults to the prompt's first line."
    )
    priority: Priority = Field(default=0, description="The tasks' priority (higher runs first).")
    labels: Labels = Field(default_factory=list, description="The tasks' labels.")
    concurrency: Concurrency = Field(
        default=Concurrency.SKIP,
        description="`skip`: a slot creates nothing while the previous fire's task has not "
        "ended; `queue`: it creates a task anyway.",
    )
    catch_up: CatchUp = Field(
        default=CatchUp.LATEST,
        description="Slots passed while no scheduler ran: `skip` fires none, `latest` the "
        f"latest, `all` each of them (at most the latest {CATCH_UP_MAX}).",
    )
    enabled: Enabled = Field(default=True, description="A disabled routine fires no slot.")


class RoutineUpdate(Strict):
    """Change a routine (send only what changes). A new `cron` or `timezone`, or enabling it,
    restarts its slots from now."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"enabled": False}, {"cron": "30 8 * * *"}]},
    )

    name: AgentName = optional()
    agent_id: UUID = optional()
    cron: Cron = optional(_CRON)
    timezone: TimeZone = optional("An IANA time zone name.")
    prompt: Prompt = optional()
    title: Title = optional()
    priority: Priority = optional()
    labels: Labels = optional("Replaces the routine's labels.")
    concurrency: Concurrency = optional("`skip` or `queue`.")
    catch_up: CatchUp = optional("`skip`, `latest` or `all`.")
    enabled: Enabled = optional()


class RoutinePublic(BaseModel):
    """A routine as the API shows it."""

    id: UUID
    name: str
    agent_id: UUID
    cron: str = Field(examples=["0 9 * * 1-5"])
    timezone: str = Field(examples=["Europe/Berlin"])
    title: str | None
    prompt: str
    priority: int
    labels: list[str]
    concurrency: str = Field(examples=["skip"])
    catch_up: str = Field(examples=["latest"])
    enabled: bool
    next_fire_at: datetime | None = Field(
        description="The next slot, in UTC (null: disabled, or no slot within 50 years)"
    )
    last_task_id: UUID | None = Field(description="The task of the latest fire that made one")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RoutineRecord) -> RoutinePublic:
        """Build from a `routines` row."""
        return cls(
            id=row.id,
            name=row.name,
            agent_id=row.agent_id,
            cron=row.cron,
            timezone=row.timezone,
            title=row.title,
            prompt=row.prompt,
            priority=row.priority,
            labels=list(row.labels),
            concurrency=row.concurrency,
            catch_up=row.catch_up,
            enabled=row.enabled,
            next_fire_at=row.next_fire_at,
            last_task_id=row.last_task_id,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class RoutinePage(BaseModel):
    """A page of routines, oldest first; pass `next_cursor` as `cursor` for the next."""

    items: list[RoutinePublic]
    next_cursor: str | None


class RoutineFirePublic(BaseModel):
    """One slot a routine handled."""

    routine_id: UUID
    slot_at: datetime = Field(description="The slot, in UTC (a manual fire: when it was asked)")
    source: str = Field(examples=["schedule"], description="`schedule` or `manual`.")
    outcome: str = Field(
        examples=["created"],
        description="`created`; `skipped_open` (the previous task had not ended), "
        "`skipped_agent` (the agent is paused or terminated), `skipped_backlog` (the queue is "
        "full); or `missed` (slots passed while no scheduler ran that catch-up did not fire)",
    )
    detail: str | None = Field(description="Why it was skipped or missed")
    task_id: UUID | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: RoutineFireRecord) -> RoutineFirePublic:
        """Build from a `routine_fires` row."""
        return cls(
            routine_id=row.routine_id,
            slot_at=row.slot_at,
            source=row.source,
            outcome=row.outcome,
            detail=row.detail,
            task_id=row.task_id,
            created_at=row.created_at,
        )


class RoutineFirePage(BaseModel):
    """A page of a routine's fires, latest slot first."""

    items: list[RoutineFirePublic]
    next_cursor: str | None


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
        if tx.replayed is not None:
            return tx.replayed
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
        if tx.replayed is not None:
            return tx.replayed
        row = await routines.fire(principal, routine_id)
        return tx.respond(
            201, RoutineFirePublic.from_row(row), location=f"/api/v1/tasks/{row.task_id}"
        )
