"""The dashboard's costs page: spend and tokens per UTC day by agent, model or provider, every
budget's progress this period, and time to first token (p50, p95) per hour.

The figures come from the services behind `/api/v1/costs` and `/api/v1/budgets` (the database
aggregates, off the event loop and side by side); this module lays the rows out, their cells
formatted here so that the template only places strings. Each chart's data is a JSON data
block that `costs.js` draws with uPlot; tables beside the charts hold the same figures (the
hourly latency one day at a time), which is what a screen reader or a browser without
JavaScript gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import Found, message, page, page_session
from bullpen.app import Services
from bullpen.domain.budgets import BudgetRecord, BudgetScope
from bullpen.errors import BullpenError, Forbidden, InvalidInput

router = APIRouter(include_in_schema=False)

SECTION = "costs"
GROUPS = {"agent": "Agent", "model": "Model", "provider": "Provider"}
DEFAULT_DAYS = 30  # the range shown without one: the last 30 UTC days, today included
MAX_DAYS = 366  # the longest range one page shows
CHART_SERIES = 10  # groups drawn in a chart (the largest spenders); the tables list all
NO_AGENT = "relay calls (no agent)"


@dataclass(frozen=True, slots=True)
class Range:
    """The page's UTC days, first and last included."""

    first: date
    last: date

    @property
    def since(self) -> datetime:
        """The range's start, as the costs service takes it (inclusive)."""
        return datetime(self.first.year, self.first.month, self.first.day, tzinfo=UTC)

    @property
    def until(self) -> datetime:
        """The range's end, as the costs service takes it (exclusive): after the last day."""
        return datetime(self.last.year, self.last.month, self.last.day, tzinfo=UTC) + timedelta(
            days=1
        )

    @property
    def days(self) -> list[date]:
        """Every day of the range."""
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]


def _day(value: str, field: str) -> date:
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(f"{field}: not a date (YYYY-MM-DD)") from None


def parse_range(since: str, until: str, today: date) -> Range:
    """The range a form asked for; empty fields are the last `DEFAULT_DAYS` days to today."""
    last = _day(until, "until") if until.strip() else today
    first = _day(since, "since") if since.strip() else last - timedelta(days=DEFAULT_DAYS - 1)
    if first > last:
        raise InvalidInput("since: must not be after until")
    if (last - first).days + 1 > MAX_DAYS:
        raise InvalidInput(f"since: a range of at most {MAX_DAYS} days")
    return Range(first, last)


def _label(group: str, key: str | None, agent_names: Mapping[str, str]) -> str:
    if group == "agent":
        return NO_AGENT if key is None else agent_names.get(key, key)
    return key or "—"


def _by_cost(row: Mapping[str, Any]) -> tuple[float, str]:
    """The largest spenders first; equal ones in a stable order."""
    return -row["cost_usd"], str(row["key"])


def _epoch(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())


def _usd(value: float) -> str:
    return f"${value:,.6f}"


def _count(value: int) -> str:
    return f"{value:,}"


def _sums(row: Mapping[str, Any]) -> tuple[str, ...]:
    """A costs row's calls, input, cached input and output tokens, and cost, formatted."""
    return (
        _count(row["calls"]),
        _count(row["input_tokens"]),
        _count(row["cached_input_tokens"]),
        _count(row["output_tokens"]),
        _usd(row["cost_usd"]),
    )


def table_rows(
    series: Sequence[Mapping[str, Any]],
    totals: Sequence[Mapping[str, Any]],
    hours: Sequence[Mapping[str, Any]],
    label: Mapping[str | None, str],
) -> dict[str, Any]:
    """The tables' rows with their cells formatted: the template only places strings (a
    month's page holds hundreds of rows; formatting them in Jinja took most of its time)."""
    return {
        "day_rows": [
            (
                r["day"],
                r["key"] or "",
                label.get(r["key"], r["key"] or ""),
                *_sums(r),
            )
            for r in series
        ],
        "totals_rows": [
            (
                r["key"] or "",
                label[r["key"]],
                *_sums(r),
            )
            for r in totals
        ],
        "latency_rows": [
            (
                r["hour"],
                r["hour"].replace("T", " "),
                str(r["runs"]),
                f"{r['p50_ms']:.1f} ms",
                f"{r['p95_ms']:.1f} ms",
            )
            for r in hours
        ],
    }


@dataclass(frozen=True, slots=True)
class HourlyDay:
    """The day whose hours the latency table lists (the chart draws every hour of the
    range), and the links to the days before and after it within the range."""

    day: date
    earlier: str | None
    later: str | None

    @classmethod
    def of(cls, value: str, span: Range, form: Mapping[str, str]) -> HourlyDay:
        """The day asked for (by default the range's last), which must be in the range."""
        day = _day(value, "day") if value.strip() else span.last
        if not span.first <= day <= span.last:
            raise InvalidInput(f"day: a day from {span.first} to {span.last}")
        one = timedelta(days=1)
        return cls(
            day,
            _hours_link(form, day - one) if day > span.first else None,
            _hours_link(form, day + one) if day < span.last else None,
        )

    def hours(self, latency: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The rows of `latency` of this day."""
        prefix = self.day.isoformat()
        return [row for row in latency if row["hour"].startswith(prefix)]


def _hours_link(form: Mapping[str, str], day: date) -> str:
    query = urlencode({**form, "day": day.isoformat()})
    return f"/costs?{query}#h-latency"


def chart_data(
    group: str,
    days: list[date],
    series: Sequence[Mapping[str, Any]],
    totals: Sequence[Mapping[str, Any]],
    latency: Sequence[Mapping[str, Any]],
    agent_names: Mapping[str, str],
) -> dict[str, Any]:
    """What `costs.js` draws: per group a value per day (0 on a day without calls) for the
    largest spenders, and the latency points, with x as Unix seconds."""
    at = {day.isoformat(): i for i, day in enumerate(days)}
    biggest = sorted(totals, key=_by_cost)[:CHART_SERIES]
    drawn: dict[str | None, dict[str, Any]] = {
        row["key"]: {
            "label": _label(group, row["key"], agent_names),
            "cost": [0.0] * len(days),
            "tokens": [0] * len(days),
        }
        for row in biggest
    }
    for row in series:
        line = drawn.get(row["key"])
        if line is not None and row["day"] in at:
            i = at[row["day"]]
            line["cost"][i] = row["cost_usd"]
            line["tokens"][i] = row["input_tokens"] + row["output_tokens"]
    hours = [datetime.fromisoformat(row["hour"]).replace(tzinfo=UTC) for row in latency]
    return {
        "since": _epoch(days[0]),
        "until": _epoch(days[-1] + timedelta(days=1)),
        "days": [_epoch(day) for day in days],
        "series": list(drawn.values()),
        "latency": {
            "x": [int(h.timestamp()) for h in hours],
            "p50": [round(row["p50_ms"], 1) for row in latency],  # as the table shows them
            "p95": [round(row["p95_ms"], 1) for row in latency],
        },
    }


@dataclass(frozen=True, slots=True)
class BudgetBar:
    """A budget as the page draws it: the percentages of its amount that are spent and
    reserved (the bar), and where its warning threshold sits."""

    budget: BudgetRecord
    label: str
    href: str | None
    spent_pct: float
    reserved_pct: float

    @classmethod
    def of(cls, budget: BudgetRecord, agent_names: Mapping[str, str]) -> BudgetBar:
        """The bar of one budget (amounts are always positive)."""
        spent = min(100.0, 100.0 * budget.spent_usd / budget.amount_usd)
        reserved = min(100.0 - spent, 100.0 * budget.reserved_usd / budget.amount_usd)
        label, href = _target(budget, agent_names)
        return cls(budget, label, href, round(spent, 3), round(reserved, 3))


def _target(budget: BudgetRecord, agent_names: Mapping[str, str]) -> tuple[str, str | None]:
    if budget.scope is BudgetScope.AGENT and budget.agent_id is not None:
        name = agent_names.get(str(budget.agent_id), str(budget.agent_id))
        return f"Agent {name}", f"/agents/{budget.agent_id}"
    if budget.scope is BudgetScope.TASK and budget.task_id is not None:
        return "Task tree", f"/tasks/{budget.task_id}"
    if budget.scope is BudgetScope.API_KEY and budget.api_key_id is not None:
        return f"API key {str(budget.api_key_id)[:8]}…", None
    return "Workspace", None


async def _agent_names(svc: Services, found: Found) -> dict[str, str]:
    try:
        return {
            str(key): name for key, name in (await svc.agents.names(found[1].principal)).items()
        }
    except Forbidden:  # a caller that may read costs but not agents: ids stand for names
        return {}


@router.get("/costs", response_class=HTMLResponse, response_model=None)
async def costs_page(
    request: Request,
    svc: ServicesDep,
    group: str = "agent",
    since: str = "",
    until: str = "",
    day: str = "",
) -> Response:
    """Spend and tokens per day by a grouping, budgets, and time to first token per hour
    (the table: the hours of `day`)."""
    found = await page_session(request, svc)
    principal = found[1].principal
    form = {"group": group, "since": since, "until": until}
    try:
        if group not in GROUPS:
            raise InvalidInput(f"group: one of {', '.join(GROUPS)}")
        span = parse_range(since, until, svc.clock().astimezone(UTC).date())
        form.update(since=span.first.isoformat(), until=span.last.isoformat())
        hourly = HourlyDay.of(day, span, form)
    except InvalidInput as err:
        return await _page(request, svc, found, form, status=err.status, error=err.detail)

    async def spend() -> tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]:
        totals = await svc.budgets.costs(
            principal, since=span.since, until=span.until, group_by=group, interval=None
        )
        # Per day, only the groups the charts draw: 200 agents over a month would otherwise be
        # 6,000 rows, a table no one reads and more than one answer may hold.
        drawn = [row["key"] for row in sorted(totals, key=_by_cost)[:CHART_SERIES]]
        series = await svc.budgets.costs(
            principal,
            since=span.since,
            until=span.until,
            group_by=group,
            interval="day",
            only=drawn,
        )
        return totals, series

    try:
        # The spend and the latency are aggregates read off the loop (on SQLite, each on a
        # thread of its own): they run side by side, with the budgets and the names.
        got = await asyncio.gather(
            spend(),
            svc.budgets.latency(principal, since=span.since, until=span.until),
            svc.budgets.list(principal),
            _agent_names(svc, found),
            return_exceptions=True,  # all of them end before the page answers
        )
        for failed in got:
            if isinstance(failed, BaseException):
                raise failed
        (totals, series), latency, budgets, names = got
    except InvalidInput as err:  # too many groups for one answer: the form says so
        return await _page(request, svc, found, form, status=err.status, error=err.detail)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    label = {row["key"]: _label(group, row["key"], names) for row in totals}
    return await _page(
        request,
        svc,
        found,
        form,
        span=span,
        hourly=hourly,
        **table_rows(series, sorted(totals, key=_by_cost), hourly.hours(latency), label),
        bars=[BudgetBar.of(b, names) for b in budgets],
        charts=chart_data(group, span.days, series, totals, latency, names),
        chart_series=CHART_SERIES,
    )


async def _page(
    request: Request,
    svc: Services,
    found: Found,
    form: dict[str, str],
    *,
    status: int = 200,
    error: str | None = None,
    **figures: Any,
) -> HTMLResponse:
    return await page(
        request,
        svc,
        found,
        "costs.html",
        section=SECTION,
        status=status,
        error=error,
        form=form,
        groups=GROUPS,
        max_days=MAX_DAYS,
        utc=UTC,
        **figures,
    )
