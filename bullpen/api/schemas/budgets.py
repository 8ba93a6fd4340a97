"""Wire schemas of /api/v1/budgets and /api/v1/costs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, Field

from bullpen.api.schemas.common import Strict, integral, optional
from bullpen.api.schemas.routines import TimeZone
from bullpen.domain.budgets import BudgetPeriod, BudgetRecord, BudgetScope
from bullpen.services.budgets import MAX_AMOUNT_USD

Amount = Annotated[
    float, Field(gt=0, le=MAX_AMOUNT_USD, allow_inf_nan=False, description="USD per period.")
]
HardStop = Annotated[bool, Field(strict=True)]
WarnPercent = Annotated[int, Field(ge=1, le=100, strict=True), BeforeValidator(integral)]


class BudgetCreate(Strict):
    """A new budget over the workspace, an agent, an API key or a task tree: the target's id
    goes in the field its scope names (and no other)."""

    scope: BudgetScope = Field(
        description="`workspace`; `agent` (needs `agent_id`); `api_key`, the relay calls made "
        "with it (needs `api_key_id`); `task`, the task and all its subtasks (needs `task_id`)."
    )
    agent_id: UUID | None = None
    api_key_id: UUID | None = None
    task_id: UUID | None = None
    amount_usd: Amount
    period: BudgetPeriod = Field(
        default=BudgetPeriod.MONTH,
        description="`month`: a calendar month in `timezone`; `lifetime`: never starts over.",
    )
    timezone: TimeZone = Field(default="UTC", description="An IANA time zone name.")
    warn_percent: WarnPercent | None = Field(
        default=80, description="Announce a warning once spend and reservations reach this."
    )
    hard_stop: HardStop = Field(
        default=True,
        description="Refuse calls and stop streams that would pass the amount; without it "
        "the budget only warns and records.",
    )


class BudgetUpdate(Strict):
    """Only the fields sent change."""

    amount_usd: Amount = optional()
    warn_percent: WarnPercent = optional()
    hard_stop: HardStop = optional()
    timezone: TimeZone = optional()


class BudgetPublic(BaseModel):
    """A budget with its current period's figures."""

    id: UUID
    scope: BudgetScope
    agent_id: UUID | None
    api_key_id: UUID | None
    task_id: UUID | None
    amount_usd: float
    period: BudgetPeriod
    timezone: str
    warn_percent: int | None
    hard_stop: bool
    period_start: datetime
    period_end: datetime | None = Field(description="null for a lifetime budget")
    spent_usd: float = Field(description="Settled spend this period.")
    reserved_usd: float = Field(description="Held by calls in flight.")
    remaining_usd: float
    warned: bool = Field(description="The warning was announced this period.")
    exceeded: bool = Field(description="A call was refused or stopped this period.")
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: BudgetRecord) -> BudgetPublic:
        """Build from a stored budget."""
        return cls(
            id=row.id,
            scope=row.scope,
            agent_id=row.agent_id,
            api_key_id=row.api_key_id,
            task_id=row.task_id,
            amount_usd=row.amount_usd,
            period=row.period,
            timezone=row.timezone,
            warn_percent=row.warn_percent,
            hard_stop=row.hard_stop,
            period_start=row.period_start,
            period_end=row.period_end,
            spent_usd=round(row.spent_usd, 6),
            reserved_usd=round(row.reserved_usd, 6),
            remaining_usd=round(row.remaining_usd, 6),
            warned=row.warned,
            exceeded=row.exceeded,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class BudgetList(BaseModel):
    """Every budget of the workspace."""

    items: list[BudgetPublic]


CostGroup = Literal["agent", "model", "provider", "api_key", "source"]


class CostRow(BaseModel):
    """Ledger totals of one group and/or day."""

    day: str | None = Field(default=None, description="UTC day, `YYYY-MM-DD` (series only)")
    key: str | None = Field(
        default=None, description="The group's value (agent or key id, model, provider)"
    )
    calls: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cost_usd: float


class CostReport(BaseModel):
    """The ledger over [since, until)."""

    since: datetime
    until: datetime
    group_by: CostGroup | None
    interval: Literal["day"] | None
    rows: list[CostRow]


class LatencyRow(BaseModel):
    """Time to first token of the runs that started in one UTC hour."""

    hour: datetime = Field(description="The UTC hour's start")
    runs: int = Field(description="Runs that started in the hour and reached a first token")
    p50_ms: float = Field(description="Median time to first token, ms")
    p95_ms: float = Field(description="95th percentile of the time to first token, ms")


class LatencyReport(BaseModel):
    """Time to first token per UTC hour over [since, until)."""

    since: datetime
    until: datetime
    rows: list[LatencyRow]
