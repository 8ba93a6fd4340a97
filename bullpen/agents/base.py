"""The one interface every agent adapter implements.

An adapter is given the run's context (the run, its task, what its children and blockers
ended with) and a sink for events; it streams what the agent produces into the sink and
returns the run's outcome. Failures are raised as `BullpenError` (the worker ends the run
`failed` with the error's type, or retries it later when the error is transient);
cancellation arrives as `asyncio.CancelledError` and the adapter must stop everything it
started (child processes, upstream requests) before letting it propagate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from pydantic import SecretStr

from bullpen.domain.events import EventKind
from bullpen.domain.records.mcp import OpenStep
from bullpen.domain.runs import ClaimedRun, RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.gateway.catalog import Target
from bullpen.gateway.router import Call

# A JSON schema pattern, and its check for secrets (whose value an error never quotes): no NUL,
# which PostgreSQL's text and jsonb cannot hold (issue 19, finding 8c).
NO_NUL = r"^[^\x00]*$"


def no_nul_secret(value: SecretStr) -> SecretStr:
    """`value`, unless it holds a NUL character (then a validation error)."""
    if "\x00" in value.get_secret_value():
        raise ValueError("must not contain NUL")  # the value itself is never quoted
    return value


class Events(Protocol):
    """Where an adapter writes the run's events (the run's `RunWriter`)."""

    def text(self, delta: str) -> None:
        """Append model or agent output text (coalesced into `text` events)."""

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        """Append one structured event (`log`, `tool_call`, `tool_result`, ...)."""


@dataclass(frozen=True, slots=True)
class Related:
    """A child or blocker of the task, as the task's next run sees it."""

    task_id: UUID
    key: str  # `KEY-42`
    title: str
    agent: str  # the assignee's name
    status: str  # done | failed | cancelled (only ended ones are reported)
    result: str | None
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form sent to webhook agents and shown to models."""
        return {
            "task_id": str(self.task_id),
            "key": self.key,
            "title": self.title,
            "agent": self.agent,
            "status": self.status,
            "result": self.result,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class TaskBrief:
    """The task a run works on."""

    id: UUID
    key: str
    title: str
    prompt: str
    parent_id: UUID | None
    children: tuple[Related, ...] = ()  # ended children, in creation order
    blockers: tuple[Related, ...] = ()  # ended blockers

    def as_dict(self) -> dict[str, Any]:
        """The JSON form sent to webhook agents."""
        return {
            "id": str(self.id),
            "key": self.key,
            "title": self.title,
            "prompt": self.prompt,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "children": [c.as_dict() for c in self.children],
            "blockers": [b.as_dict() for b in self.blockers],
        }


@dataclass(frozen=True, slots=True)
class RunContext:
    """Everything an adapter is given for one delivery of a run."""

    run: ClaimedRun
    task: TaskBrief
    agent_name: str
    events: Events
    started_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """The run context as JSON (what a webhook agent receives)."""
        return {
            "run": {"id": str(self.run.id), "attempt": self.run.attempt},
            "agent": {"id": str(self.run.agent_id), "name": self.agent_name},
            "workspace_id": str(self.run.workspace_id),
            "task": self.task.as_dict(),
        }


class Adapter(Protocol):
    """Runs one delivery of a run for one kind of agent."""

    async def run(self, ctx: RunContext) -> RunOutcome:
        """Stream the agent's events into `ctx.events`; return the outcome."""


def done(result: str | None) -> RunOutcome:
    """A successful outcome with no provider usage (http and process agents)."""
    return RunOutcome(
        status=RunStatus.DONE,
        result=result,
        error=None,
        first_token_at=None,
        ttft_ms=None,
        provider=None,
        model=None,
        input_tokens=None,
        output_tokens=None,
    )


@dataclass(frozen=True, slots=True)
class Report:
    """An agent that reports to the one running."""

    id: UUID
    name: str
    title: str
    description: str
    status: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made in a step."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a committed step did."""

    results: list[str]  # one tool result per call, in order
    messages: list[dict[str, Any]]  # the `tool` messages that carry them to the model
    finished: str | None  # the `finish` result, if the step called it
    waits: bool  # a `delegate` asked to wait for its subtask


@dataclass(frozen=True, slots=True)
class HeldStep:
    """A tool step held for an approval and since decided: the next run carries it out."""

    messages: list[dict[str, Any]]  # the step's messages up to the assistant's tool calls
    calls: list[ToolCall]
    tools: frozenset[str]  # the gated tools among the calls
    approved: bool | None  # None: not decided yet
    reason: str | None  # the decision's reason
    cost_usd: float  # what the model call that made the step cost


class TeamPort(Protocol):
    """What an `llm` agent's tool loop asks of the store (`services.team.Team` implements it)."""

    async def reports(self, workspace_id: UUID, agent_id: UUID) -> list[Report]:
        """The agents reporting to `agent_id`, by name."""

    async def history(self, task_id: UUID) -> list[list[dict[str, Any]]]:
        """The task's completed tool steps, oldest first."""

    async def related(self, task_id: UUID) -> tuple[list[Related], list[Related]]:
        """The task's ended children (those it waits for) and ended blockers."""

    async def commit_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        reports: list[Report],
        cost_usd: float,
        denied: tuple[frozenset[str], str] | None = None,
        given: dict[int, str] | None = None,
    ) -> StepResult:
        """Carry out a step's tool calls and record the step, in one fenced transaction;
        `denied` (tools, result): those tools' calls are not carried out, their result given;
        `given`: results of calls already made outside (by index), the step's open record
        closed."""

    async def open_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        cost_usd: float,
    ) -> None:
        """Record a step about to make outside (MCP) calls, before the first (fenced)."""

    async def mark_call(
        self, run: ClaimedRun, step: int, index: int, state: dict[str, Any]
    ) -> None:
        """Record an outside call's state in its open step: `started`, or `done` with its
        result (fenced)."""

    async def open_step_of(self, task_id: UUID, step: int) -> OpenStep | None:
        """Step `step` of the task if it was opened and never committed (a crash)."""

    async def hold_step(
        self,
        run: ClaimedRun,
        *,
        step: int,
        messages: list[dict[str, Any]],
        calls: list[ToolCall],
        tools: frozenset[str],
        cost_usd: float,
    ) -> None:
        """Hold a step whose calls include gated `tools` for an approval (fenced)."""

    async def held_step(self, task_id: UUID, step: int) -> HeldStep | None:
        """Step `step` of the task if it was held for an approval (`approved` None while the
        approval is pending)."""


class MeterPort(Protocol):
    """One call's hold on the budgets and the run's cost ceiling (`services.spend.Meter`)."""

    due: float  # `need` has nothing to do until the output passes this

    async def need(self, output_tokens: int) -> None:
        """Make sure this much output is reserved; raise `BudgetExceeded` to stop the stream."""

    def ledger_row(self, call: Call) -> dict[str, Any] | None:
        """The call's ledger entry and the reservation it settles."""


class SpendPort(Protocol):
    """What an `llm` agent asks about money (`services.spend.RunSpend` implements it)."""

    async def task_spent(self, run: ClaimedRun) -> float:
        """What the agent's runs of this task spent before (every delivery and wake)."""

    async def open_call(
        self,
        run: ClaimedRun,
        chain: tuple[Target, ...],
        request: dict[str, Any],
        ceiling_left_usd: float | None,
    ) -> MeterPort:
        """Reserve for a call about to be made; raise `BudgetExceeded` if there is no room."""
