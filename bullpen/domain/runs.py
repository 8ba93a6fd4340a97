"""The run vocabulary: what a worker holds, what a finished run records, how failures retry."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from bullpen.domain.status import RunStatus


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a worker now holds, with what it needs to execute it."""

    id: UUID
    task_id: UUID
    workspace_id: UUID
    agent_id: UUID
    attempt: int
    failures: int
    prompt: str
    agent_adapter: str
    agent_config: dict[str, Any]
    title: str = ""
    task_key: str = ""  # `KEY-42`
    parent_id: UUID | None = None
    priority: int = 0
    agent_name: str = ""
    agent_description: str = ""
    dependencies: int = 0  # children waited for and blockers ever attached (0: no tree reads)
    dependents: int = 0  # tasks blocked by this one, ever (0: no one waits for its end)
    steps: int = 0  # tool steps an `llm` agent completed on the task (0: nothing to resume)
    elapsed_s: float = 0.0  # seconds the task's earlier deliveries ran (its wall time so far)
    has_reports: bool = False  # someone reports to the agent: it may delegate
    agent_breakers: dict[str, Any] | None = None  # the agent's breaker overrides
    breaker_since: datetime | None = None  # its breaker windows start no earlier
    trace_parent: str | None = None  # the W3C traceparent it was enqueued under (tracing on)
    lost_leases: int = 0  # earlier deliveries that ended with their worker gone


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a finished run records."""

    status: RunStatus
    result: str | None
    error: str | None
    first_token_at: datetime | None
    ttft_ms: float | None
    provider: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    # A transient failure (a provider or the network was away) is retried with backoff; a
    # permanent one (bad config, a refused request) ends the run at once.
    transient: bool = False
    error_code: str | None = None  # the problem type slug of the error, e.g. provider-timeout
    cost_usd: float | None = None
    cached_input_tokens: int | None = None
    llm_calls: list[dict[str, Any]] | None = None  # every provider attempt of the call
    # The agent delegated and waits: the task is `blocked` until what it waits for has ended
    # (at once queued again if that already happened), not `done`.
    waits: bool = False
    # Every LLM call the run made, for the cost ledger: provider, model, tokens, cost,
    # estimated, and the budget reservation it settles (`reservation_id`, may be None).
    calls: list[dict[str, Any]] | None = None
    # A tool call waits for an approval: the task is `awaiting_approval` until it is decided.
    awaits_approval: bool = False
    # A budget (not the run's ceiling) stopped the run: an approver may override it.
    budget_stop: bool = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed deliveries are retried: exponential backoff with jitter, then dead-letter."""

    max_attempts: int = 5
    base_s: float = 1.0
    max_s: float = 300.0

    def delay(self, failures: int, rng: random.Random | None = None) -> timedelta:
        """The wait before delivery `failures + 1`: base·2^(failures-1), capped, jittered ±50 %."""
        raw = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return timedelta(seconds=raw * (rng or random).uniform(0.5, 1.0))

    @property
    def quarantine_at(self) -> int:
        """Lost leases from which a run is *quarantined*: a worker process holds at most one
        such run at a time. Two (one when a second loss would already dead-letter it), so a
        good run that was in flight with a poison run when it killed its worker twice never
        shares a process with that poison run again, and keeps its last attempts."""
        return max(1, min(2, self.max_attempts - 1))


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery a worker holds: the run and the attempt its writes are fenced by."""

    run_id: UUID
    attempt: int


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What happened to a delivery that ended without an outcome."""

    run_id: UUID
    task_id: UUID
    workspace_id: UUID
    status: RunStatus  # QUEUED (retried later), FAILED (dead-lettered) or CANCELLED
    error: str | None
