"""Budgets: an amount of USD per period over a scope, and the arithmetic of reserving against it.

A budget covers a workspace, an agent, an API key (relay calls made with it) or a task tree (a
task and all its subtasks). Its period is a calendar month in a time zone, or its whole
lifetime. Calls reserve before they start and in slices while they stream; a hard-stop budget
refuses what would take `spent + reserved` past its amount. At `warn_percent` of the amount a
warning is announced once per period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

# Amounts are compared with this much slack, so float rounding never refuses the last cent.
EPSILON_USD = 1e-9


class BudgetScope(StrEnum):
    """What a budget covers."""

    WORKSPACE = "workspace"
    AGENT = "agent"
    API_KEY = "api_key"  # pragma: allowlist secret
    TASK = "task"  # the task and every subtask under it


class BudgetPeriod(StrEnum):
    """How often a budget starts over."""

    MONTH = "month"  # a calendar month in the budget's time zone
    LIFETIME = "lifetime"


def period_start(period: BudgetPeriod, timezone: str, now: datetime) -> datetime:
    """The start of the period `now` is in (UTC), for a budget created at or before `now`."""
    if period is BudgetPeriod.LIFETIME:
        return datetime(1970, 1, 1, tzinfo=now.tzinfo)
    local = now.astimezone(ZoneInfo(timezone))
    first = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return first.astimezone(now.tzinfo)


def period_end(period: BudgetPeriod, timezone: str, start: datetime) -> datetime | None:
    """When the period that began at `start` ends (None: never)."""
    if period is BudgetPeriod.LIFETIME:
        return None
    local = start.astimezone(ZoneInfo(timezone))
    # Day 28 plus four days is always in the next month; its first day starts the next period.
    following = (local.replace(day=28) + timedelta(days=4)).replace(day=1)
    return (
        following.replace(tzinfo=None).replace(tzinfo=ZoneInfo(timezone)).astimezone(start.tzinfo)
    )


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """A budget as stored, with its current period's spend."""

    id: UUID
    workspace_id: UUID
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
    spent_usd: float
    reserved_usd: float
    warned: bool
    exceeded: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: Any) -> BudgetRecord:
        """From a `budgets` row."""
        m = row._mapping
        return cls(
            **{
                **{k: m[k] for k in cls.__slots__},
                "scope": BudgetScope(m["scope"]),
                "period": BudgetPeriod(m["period"]),
            }
        )

    @property
    def period_end(self) -> datetime | None:
        """When the current period ends (None: a lifetime budget)."""
        return period_end(self.period, self.timezone, self.period_start)

    @property
    def remaining_usd(self) -> float:
        """What is left to reserve this period (never below zero)."""
        return max(0.0, self.amount_usd - self.spent_usd - self.reserved_usd)

    def covers(
        self,
        *,
        agent_id: UUID | None,
        api_key_id: UUID | None,
        task_ids: frozenset[UUID],
    ) -> bool:
        """Whether a call made for this agent / with this key / in this task tree counts here."""
        if self.scope is BudgetScope.WORKSPACE:
            return True
        if self.scope is BudgetScope.AGENT:
            return agent_id is not None and self.agent_id == agent_id
        if self.scope is BudgetScope.API_KEY:
            return api_key_id is not None and self.api_key_id == api_key_id
        return self.task_id in task_ids


@dataclass(frozen=True, slots=True)
class Crossing:
    """A budget whose warning threshold or amount a reservation reached (announced once a
    period)."""

    budget_id: UUID
    kind: str  # "warning" or "exceeded"
    amount_usd: float
    spent_usd: float
    reserved_usd: float


def warn_reached(
    amount_usd: float, warn_percent: int | None, spent_usd: float, reserved_usd: float
) -> bool:
    """Whether spend and reservations have reached the warning threshold."""
    if warn_percent is None:
        return False
    return spent_usd + reserved_usd + EPSILON_USD >= amount_usd * warn_percent / 100
