"""Budgets as users manage them, and the cost ledger's totals and series.

Creating, changing and deleting a budget is audited; a change of amount or period takes effect
for the next reservation. Totals and series are aggregated by the database from the ledger
(`cost_events`), never row by row in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bullpen.domain.access import Permission, need
from bullpen.domain.budgets import BudgetPeriod, BudgetRecord, BudgetScope, period_start
from bullpen.domain.principal import Principal
from bullpen.errors import InvalidInput, NotFound
from bullpen.services.spend import Spend
from bullpen.store import agents as agent_store
from bullpen.store import api_keys as key_store
from bullpen.store import audit
from bullpen.store import budgets as budget_store
from bullpen.store import costs as cost_store
from bullpen.store import latency as latency_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store

# Budgets a workspace may have (each reservation reads the ones covering a call).
MAX_BUDGETS = 100
MAX_AMOUNT_USD = 1_000_000_000.0
_SETTABLE = frozenset({"amount_usd", "warn_percent", "hard_stop", "timezone"})


def _invalid(field: str, message: str, code: str | None = None) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}",
        errors=[{"location": "body", "field": field, "message": message, "code": code or field}],
    )


def _check_timezone(value: str) -> None:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise _invalid("timezone", f"{value!r} is not an IANA time zone name") from None


class BudgetService:
    """Budgets of a workspace: create, list, change, delete; and what the ledger says."""

    def __init__(self, store: Store, clock: Callable[[], datetime], spend: Spend) -> None:
        self._store = store
        self._clock = clock
        self._spend = spend

    async def create(self, principal: Principal, values: dict[str, Any]) -> BudgetRecord:
        """A new budget (its target must be the workspace's); its first period starts now."""
        need(principal, Permission.BUDGETS_WRITE)
        scope = BudgetScope(values["scope"])
        period = BudgetPeriod(values.get("period", BudgetPeriod.MONTH))
        timezone = values.get("timezone") or "UTC"
        _check_timezone(timezone)
        targets = {
            BudgetScope.AGENT: "agent_id",
            BudgetScope.API_KEY: "api_key_id",  # pragma: allowlist secret
            BudgetScope.TASK: "task_id",
        }
        for target_scope, column in targets.items():
            given = values.get(column) is not None
            if given != (scope is target_scope):
                wanted = "needs" if scope is target_scope else "must not have"
                raise _invalid(
                    column, f"a {scope.value} budget {wanted} `{column}`", "scope_target"
                )
        now = self._clock()
        async with self._store.write() as conn:
            await self._check_target(conn, principal.workspace_id, scope, values)
            if len(await budget_store.of_workspace(conn, principal.workspace_id)) >= MAX_BUDGETS:
                raise _invalid("scope", f"a workspace has at most {MAX_BUDGETS} budgets")
            budget = await budget_store.insert(
                conn,
                {
                    "workspace_id": principal.workspace_id,
                    "scope": scope.value,
                    "agent_id": values.get("agent_id"),
                    "api_key_id": values.get("api_key_id"),
                    "task_id": values.get("task_id"),
                    "amount_usd": float(values["amount_usd"]),
                    "period": period.value,
                    "timezone": timezone,
                    "warn_percent": values.get("warn_percent"),
                    "hard_stop": bool(values.get("hard_stop", True)),
                    "period_start": period_start(period, timezone, now),
                    "created_at": now,
                    "updated_at": now,
                },
            )
            await audit.record_by(
                conn, principal, "budget.create", "budget", budget.id, now, _shown(budget)
            )
        self._spend.forget(principal.workspace_id)
        return budget

    async def list(self, principal: Principal) -> Sequence[BudgetRecord]:
        """The workspace's budgets, oldest first, with this period's figures."""
        need(principal, Permission.COSTS_READ)
        async with self._store.read() as conn:
            return await budget_store.of_workspace(conn, principal.workspace_id)

    async def get(self, principal: Principal, budget_id: UUID) -> BudgetRecord:
        """One budget of the workspace."""
        need(principal, Permission.COSTS_READ)
        async with self._store.read() as conn:
            return await self._budget(conn, principal, budget_id)

    async def update(
        self, principal: Principal, budget_id: UUID, changes: dict[str, Any]
    ) -> BudgetRecord:
        """Change a budget's amount, warning threshold, hard stop or time zone."""
        need(principal, Permission.BUDGETS_WRITE)
        unknown = set(changes) - _SETTABLE
        if unknown:
            raise InvalidInput(f"only {sorted(_SETTABLE)} may be changed")
        if "timezone" in changes:
            _check_timezone(changes["timezone"])
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._budget(conn, principal, budget_id)
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if not changed:
                return before
            if "timezone" in changed and before.period is BudgetPeriod.MONTH:
                changed["period_start"] = period_start(before.period, changed["timezone"], now)
            await budget_store.update(
                conn, principal.workspace_id, budget_id, {**changed, "updated_at": now}
            )
            after = await self._budget(conn, principal, budget_id)
            await audit.record_by(
                conn,
                principal,
                "budget.update",
                "budget",
                budget_id,
                now,
                {
                    "before": {k: _json(getattr(before, k)) for k in changed if k in _SETTABLE},
                    "after": {k: _json(getattr(after, k)) for k in changed if k in _SETTABLE},
                },
            )
        self._spend.forget(principal.workspace_id)
        return after

    async def delete(self, principal: Principal, budget_id: UUID) -> None:
        """Remove a budget; calls in flight settle without it."""
        need(principal, Permission.BUDGETS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._budget(conn, principal, budget_id)
            await budget_store.delete(conn, principal.workspace_id, budget_id)
            await audit.record_by(
                conn, principal, "budget.delete", "budget", budget_id, now, _shown(before)
            )
        self._spend.forget(principal.workspace_id)

    async def costs(
        self,
        principal: Principal,
        *,
        since: datetime,
        until: datetime,
        group_by: str | None,
        interval: str | None,
        only: Collection[str | None] | None = None,
    ) -> Sequence[dict[str, Any]]:
        """Ledger totals in [since, until), grouped by one dimension and/or by day; with
        `only`, of those groups alone. Off the event loop (`Store.read_apart`)."""
        need(principal, Permission.COSTS_READ)
        if until <= since:
            return []
        return await self._store.read_apart(
            lambda conn: cost_store.totals(
                conn,
                principal.workspace_id,
                since=since,
                until=until,
                group_by=group_by,
                by_day=interval == "day",
                only=only,
            )
        )

    async def latency(
        self, principal: Principal, *, since: datetime, until: datetime
    ) -> Sequence[dict[str, Any]]:
        """Time to first token of the runs started in [since, until): p50 and p95 per UTC
        hour, computed by the database, off the event loop (`Store.read_apart`)."""
        need(principal, Permission.COSTS_READ)
        if until <= since:
            return []
        return await self._store.read_apart(
            lambda conn: latency_store.ttft_per_hour(
                conn, principal.workspace_id, since=since, until=until
            )
        )

    async def _budget(
        self, conn: Connection, principal: Principal, budget_id: UUID
    ) -> BudgetRecord:
        found = await budget_store.get(conn, principal.workspace_id, budget_id)
        if found is None:
            raise NotFound("no such budget")
        return found

    @staticmethod
    async def _check_target(
        conn: Connection, workspace_id: UUID, scope: BudgetScope, values: dict[str, Any]
    ) -> None:
        if scope is BudgetScope.AGENT:
            if await agent_store.get_agent(conn, workspace_id, values["agent_id"]) is None:
                raise NotFound("no such agent in this workspace")
        elif scope is BudgetScope.API_KEY:
            if await key_store.get_key(conn, workspace_id, values["api_key_id"]) is None:
                raise NotFound("no such API key in this workspace")
        elif scope is BudgetScope.TASK:
            if await task_store.get_task(conn, workspace_id, values["task_id"]) is None:
                raise NotFound("no such task in this workspace")


def _json(value: Any) -> Any:
    return str(value) if isinstance(value, (UUID, datetime)) else value


def _shown(budget: BudgetRecord) -> dict[str, Any]:
    return {
        "scope": budget.scope.value,
        "target": _json(budget.agent_id or budget.api_key_id or budget.task_id),
        "amount_usd": budget.amount_usd,
        "period": budget.period.value,
        "timezone": budget.timezone,
        "warn_percent": budget.warn_percent,
        "hard_stop": budget.hard_stop,
    }
