"""Wire schemas: what the API accepts and returns (the domain never sees these)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

PROMPT_MIN = 10
PROMPT_MAX = 2000


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

    prompt: str = Field(min_length=PROMPT_MIN, max_length=PROMPT_MAX, strict=True)
    agent_id: UUID


class RunPublic(BaseModel):
    """One attempt of an agent on a task."""

    id: UUID
    status: str
    attempt: int
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

    @classmethod
    def from_row(cls, row: Any) -> RunPublic:
        """Build from a `runs` row."""
        return cls(
            id=row.id,
            status=row.status,
            attempt=row.attempt,
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
    result: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    run: RunPublic | None

    @classmethod
    def from_rows(cls, task: Any, run: Any | None) -> TaskPublic:
        """Build from a `tasks` row (joined with its workspace's key) and its run."""
        return cls(
            id=task.id,
            number=f"{task.task_key}-{task.number}",
            title=task.title,
            prompt=task.prompt,
            agent_id=task.agent_id,
            status=task.status,
            priority=task.priority,
            result=task.result,
            error=task.error,
            created_at=task.created_at,
            updated_at=task.updated_at,
            run=RunPublic.from_row(run) if run is not None else None,
        )


class TaskPage(BaseModel):
    """A page of tasks, newest first; pass `next_cursor` as `cursor` for the next."""

    items: list[TaskPublic]
    next_cursor: str | None


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
