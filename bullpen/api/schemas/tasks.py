"""Wire schemas of /api/v1/tasks and /api/v1/runs: tasks, comments, runs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from bullpen.api.schemas.common import Strict, integral, optional
from bullpen.domain.records import CommentRecord, RunRecord, TaskLink, TaskRecord
from bullpen.store.workflow import MAX_BLOCKERS

PROMPT_MIN = 10
PROMPT_MAX = 2000
TITLE_MAX = 200
LABELS_MAX = 20
COMMENT_MAX = 10_000
PRIORITY_MIN, PRIORITY_MAX = -100, 100

# Free text (prompts, comments) keeps every character but NUL, which PostgreSQL text cannot
# hold: refused at the edge (422) on every backend alike (issue 19, finding 8c).
NO_NUL = r"^[^\x00]*$"
Prompt = Annotated[
    str, Field(min_length=PROMPT_MIN, max_length=PROMPT_MAX, strict=True, pattern=NO_NUL)
]

# Printable text without control characters (keeps logs, headers and SSE frames intact).
_TEXT = r"^[^\x00-\x1f\x7f]*$"
Title = Annotated[
    str, StringConstraints(min_length=1, max_length=TITLE_MAX, strip_whitespace=True, pattern=_TEXT)
]
Label = Annotated[
    str, StringConstraints(min_length=1, max_length=50, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
]


# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
Priority = Annotated[
    int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True), BeforeValidator(integral)
]
Labels = Annotated[list[Label], Field(max_length=LABELS_MAX)]


class TaskCreate(BaseModel):
    """Create a task for an agent."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "prompt": "Analyze this dataset and extract key metrics",
                    "agent_id": "0b7c6f0e-3f5e-4c1d-9a51-2f1b8d3c4e5a",
                }
            ]
        },
    )

    prompt: Prompt
    agent_id: UUID
    title: Title | None = Field(default=None, description="Defaults to the prompt's first line.")
    priority: Priority = Field(default=0, description="Higher runs first.")
    labels: Labels = Field(default_factory=list)
    parent_id: UUID | None = Field(
        default=None,
        description="Make it a subtask of this task (of the workspace, not ended); a parent "
        "that has to wait for its subtasks is `blocked` until they have all ended. Subtasks "
        "nest at most `BULLPEN_TASK_MAX_DEPTH` levels (32) below their root (422 "
        "`task-too-deep` beyond).",
    )
    blocked_by: list[UUID] = Field(
        default_factory=list,
        max_length=MAX_BLOCKERS,
        description="Tasks that must end first: the task is `blocked`, with no run, until "
        "each has ended (done, failed or cancelled); what they ended with is in its next "
        "run's context.",
    )


class TaskUpdate(Strict):
    """Change a task's title, priority or labels (send only what changes)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"priority": 5, "labels": ["q3"]}]}
    )

    title: Title = optional()
    priority: Priority = optional("Higher runs first.")
    labels: Labels = optional("Replaces the task's labels.")


class CommentCreate(Strict):
    """A comment on a task."""

    body: str = Field(
        min_length=1, max_length=COMMENT_MAX, pattern=NO_NUL, examples=["Looks good."]
    )


class CommentPublic(BaseModel):
    """A comment on a task."""

    id: UUID
    task_id: UUID
    author_type: str
    author_id: UUID | None
    body: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: CommentRecord) -> CommentPublic:
        """Build from a `task_comments` row."""
        return cls(
            id=row.id,
            task_id=row.task_id,
            author_type=row.author_type,
            author_id=row.author_id,
            body=row.body,
            created_at=row.created_at,
        )


class CommentPage(BaseModel):
    """A page of comments, oldest first."""

    items: list[CommentPublic]
    next_cursor: str | None


class RunPublic(BaseModel):
    """One attempt of an agent on a task."""

    id: UUID
    task_id: UUID
    status: str
    attempt: int = Field(description="Deliveries so far: each claim by a worker is one")
    failures: int = Field(
        description="Deliveries that ended without an outcome (lost lease, transient failure)"
    )
    lost_leases: int = Field(
        description="Of those, deliveries whose worker died holding the run. Claims keep such "
        "runs apart, and a worker holds at most one run lost twice (see docs/queue.md)"
    )
    priority: int
    available_at: datetime | None = Field(description="When a retried run may be claimed again")
    cancel_requested_at: datetime | None
    queued_at: datetime
    started_at: datetime | None
    first_token_at: datetime | None
    finished_at: datetime | None
    ttft_ms: float | None
    provider: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    error: str | None
    error_code: str | None = Field(
        description="The problem type slug of the error (`provider-timeout`, "
        "`provider-incomplete`, ...); see docs/gateway.md",
        examples=["provider-unavailable"],
    )
    cost_usd: float | None = Field(description="What the provider call cost, from the price table")
    llm_calls: list[dict[str, Any]] | None = Field(
        description="Every provider attempt of the last delivery: provider, model, outcome "
        "(ok, failed, skipped, incomplete, cancelled), reason, ttft_ms, duration_ms, tokens"
    )
    trace_id: str | None = Field(
        default=None,
        description="The OpenTelemetry trace the run's spans are in (32 hex digits), when it "
        "was enqueued with tracing on; see docs/tracing.md",
        examples=["4bf92f3577b34da6a3ce929d0e0e4736"],  # pragma: allowlist secret
    )

    @classmethod
    def from_row(cls, row: RunRecord) -> RunPublic:
        """Build from a `runs` row."""
        return cls(
            id=row.id,
            task_id=row.task_id,
            status=row.status,
            attempt=row.attempt,
            failures=row.failures,
            lost_leases=row.lost_leases,
            priority=row.priority,
            available_at=row.available_at,
            cancel_requested_at=row.cancel_requested_at,
            queued_at=row.queued_at,
            started_at=row.started_at,
            first_token_at=row.first_token_at,
            finished_at=row.finished_at,
            ttft_ms=row.ttft_ms,
            provider=row.provider,
            model=row.model,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            error=row.error,
            error_code=row.error_code,
            cost_usd=row.cost_usd,
            llm_calls=row.llm_calls,
            trace_id=row.trace_parent.split("-")[1] if row.trace_parent else None,
        )


class TaskPublic(BaseModel):
    """A task as the API shows it, with its latest run."""

    id: UUID
    number: str = Field(examples=["BP-42"])
    title: str
    prompt: str
    agent_id: UUID
    status: str
    priority: int
    labels: list[str]
    result: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    parent_id: UUID | None = Field(description="The parent task of a subtask.")
    run: RunPublic | None

    @classmethod
    def from_rows(cls, task: TaskRecord, run: RunRecord | None) -> TaskPublic:
        """Build from a `tasks` row (joined with its workspace's key) and its run."""
        return cls(
            id=task.id,
            number=f"{task.task_key}-{task.number}",
            title=task.title,
            prompt=task.prompt,
            agent_id=task.agent_id,
            status=task.status,
            priority=task.priority,
            labels=list(task.labels),
            result=task.result,
            error=task.error,
            created_at=task.created_at,
            updated_at=task.updated_at,
            parent_id=task.parent_id,
            run=RunPublic.from_row(run) if run is not None else None,
        )


class TaskRef(BaseModel):
    """A child or blocker of a task."""

    id: UUID
    number: str = Field(examples=["BP-43"])
    title: str
    agent: str = Field(description="The assignee's name.")
    status: str
    result: str | None
    error: str | None

    @classmethod
    def from_row(cls, row: TaskLink) -> TaskRef:
        """Build from a row of `store.workflow.children` or `blockers`."""
        return cls(
            id=row.id,
            number=f"{row.task_key}-{row.number}",
            title=row.title,
            agent=row.agent,
            status=row.status,
            result=row.result,
            error=row.error,
        )


class TaskDependencies(BaseModel):
    """What a task waits for: its subtasks and its blockers."""

    children: list[TaskRef]
    blockers: list[TaskRef]


class RunList(BaseModel):
    """A task's runs, oldest first."""

    items: list[RunPublic]


class TaskPage(BaseModel):
    """A page of tasks, newest first; pass `next_cursor` as `cursor` for the next."""

    items: list[TaskPublic]
    next_cursor: str | None
