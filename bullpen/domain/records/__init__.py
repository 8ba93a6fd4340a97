"""Typed records of the rows that cross layers: tasks, runs, agents, comments, routines.

Accounts (users, workspaces, members, API keys, invitations), the gateway's providers and
routes, audit events and idempotency outcomes have their own modules in this package.

The store builds them once, at its edge, from the rows it reads or writes; services and the API
read their attributes (the same names as the columns), never a driver's row. Statuses are the
domain's `StrEnum`s, so they compare, print and serialise as the stored strings.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from functools import cache
from typing import Any, Self, TypeAlias
from uuid import UUID

from bullpen.domain.agents import AgentStatus
from bullpen.domain.status import RunStatus, TaskStatus


@cache
@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))  # once per record type, not once per row


@functools.cache
def _defaulted(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls) if f.default is not MISSING)


def pick(cls: type, values: Mapping[Any, Any]) -> dict[str, Any]:
    """The record's fields from `values` (a row's mapping may carry more columns; a field with
    a default may be missing from it)."""
    defaulted = _defaulted(cls)
    return {name: values[name] for name in _names(cls) if name not in defaulted or name in values}


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as stored, with its workspace's task key (`KEY` of `KEY-42`)."""

    id: UUID
    workspace_id: UUID
    number: int
    title: str
    prompt: str
    agent_id: UUID
    creator_user_id: UUID | None
    creator_key_id: UUID | None
    status: TaskStatus
    priority: int
    labels: list[str]
    result: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    parent_id: UUID | None
    origin_key: str | None
    blocks_parent: bool
    dependencies: int
    dependents: int
    steps: int
    task_key: str
    budget_override_usd: float | None = None  # what an approved budget override still allows
    elapsed_s: float = 0.0  # seconds its deliveries have run (every delivery and wake)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping (or a dict of the same names)."""
        picked = pick(cls, values)
        picked["status"] = TaskStatus(picked["status"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One attempt of an agent on a task, as stored."""

    id: UUID
    workspace_id: UUID
    task_id: UUID
    agent_id: UUID
    status: RunStatus
    attempt: int
    lease_owner: str | None
    lease_expires_at: datetime | None
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
    priority: int
    available_at: datetime | None
    failures: int
    lost_leases: int  # of the failures, deliveries whose worker died holding the run
    cancel_requested_at: datetime | None
    error_code: str | None
    cost_usd: float | None
    llm_calls: list[dict[str, Any]] | None
    trace_parent: str | None  # the W3C traceparent it was enqueued under (tracing on)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["status"] = RunStatus(picked["status"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """An agent as stored (its config still holds sealed secrets: never shown as it is)."""

    id: UUID
    workspace_id: UUID
    name: str
    title: str
    adapter: str
    config: dict[str, Any]
    status: AgentStatus
    max_concurrent_runs: int
    created_at: datetime
    reports_to: UUID | None
    description: str
    breakers: dict[str, Any] | None  # overrides of the instance's limits (domain/breakers.py)
    paused_reason: str | None  # why a breaker paused it (None: not paused by a breaker)
    breaker_since: datetime | None  # breaker windows start no earlier (its last resume)
    failures_in_a_row: int
    requires_approval: bool = False  # each new task waits for a decision before it is queued
    approval_ttl_s: int | None = None  # an undecided approval expires after this (None: setting)
    approval_default: str | None = None  # what expiry decides: approve or deny (None: deny)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["status"] = AgentStatus(picked["status"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class CommentRecord:
    """A comment on a task, as stored."""

    id: UUID
    workspace_id: UUID
    task_id: UUID
    author_type: str
    author_id: UUID | None
    body: str
    created_at: datetime
    origin_key: str | None

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class TaskLink:
    """A child or blocker of a task as the task sees it: key, title, assignee and outcome."""

    id: UUID
    number: int
    task_key: str
    title: str
    agent: str  # the assignee's name
    status: TaskStatus
    result: str | None
    error: str | None
    blocks_parent: bool  # whether its parent waits for it (a blocker's own flag, unused)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["status"] = TaskStatus(picked["status"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class OpenDescendant:
    """A subtask still open below a task being cancelled, and how many tasks wait for it."""

    id: UUID
    dependents: int

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class RoutineRecord:
    """A routine as stored: a cron schedule that creates a task for its agent."""

    id: UUID
    workspace_id: UUID
    name: str
    agent_id: UUID
    cron: str
    timezone: str
    title: str | None
    prompt: str
    priority: int
    labels: list[str]
    concurrency: str
    catch_up: str
    enabled: bool
    next_fire_at: datetime | None
    last_task_id: UUID | None
    creator_user_id: UUID | None
    creator_key_id: UUID | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class RoutineFireRecord:
    """One slot a routine handled: what it did there, and the task it created, if any."""

    routine_id: UUID
    slot_at: datetime
    workspace_id: UUID
    source: str
    outcome: str
    detail: str | None
    task_id: UUID | None
    created_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


# A task with its latest run (None: it has had none, e.g. while blocked).
TaskWithRun: TypeAlias = tuple[TaskRecord, RunRecord | None]
