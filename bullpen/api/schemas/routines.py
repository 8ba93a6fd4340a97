"""Wire schemas of /api/v1/routines: scheduled task templates and their fires."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bullpen.api.schemas.agents import AgentName
from bullpen.api.schemas.common import Strict, optional
from bullpen.api.schemas.tasks import Labels, Priority, Prompt, Title
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
