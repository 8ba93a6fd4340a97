"""/api/v1/budgets (spend caps) and /api/v1/costs (the ledger's totals and series)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response

from bullpen.api import docs, instants
from bullpen.api.deps import Budgets, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.instants import Instant
from bullpen.api.schemas.budgets import (
    BudgetCreate,
    BudgetList,
    BudgetPublic,
    BudgetUpdate,
    CostGroup,
    CostReport,
    CostRow,
    LatencyReport,
    LatencyRow,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.errors import InvalidInput

router = APIRouter(tags=["costs"])

BudgetId = Annotated[UUID, docs.path_id("budget")]


Reader = Annotated[Principal, require(Permission.COSTS_READ)]
# The range of a costs query: 30 days to now unless given.
Since = Annotated[
    Instant | None,
    Query(description="Start (inclusive), RFC 3339; default 30 days before `until`"),
]
Until = Annotated[Instant | None, Query(description="End (exclusive), RFC 3339; default now")]
Writer = Annotated[Principal, require(Permission.BUDGETS_WRITE)]


@router.get(
    "/api/v1/budgets",
    operation_id="listBudgets",
    response_model=BudgetList,
    responses=docs.problems(*docs.READ),
    summary="List budgets",
)
async def list_budgets(principal: Reader, budgets: Budgets) -> BudgetList:
    """Every budget of the workspace (at most 100), with spent, reserved and remaining this
    period and when the period ends."""
    return BudgetList(items=[BudgetPublic.from_row(b) for b in await budgets.list(principal)])


@router.post(
    "/api/v1/budgets",
    operation_id="createBudget",
    status_code=201,
    response_model=BudgetPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            BudgetPublic,
            "The budget",
            {"GetBudget": docs.link("getBudget", budget_id="$response.body#/id")},
        ),
        **docs.problems(*docs.WRITE),
    },
    summary="Create a budget",
)
async def create_budget(
    body: BudgetCreate, principal: Writer, budgets: Budgets, idem: Idempotent
) -> Response:
    """A cap on what calls covered by `scope` may spend per period; an unknown agent, key or
    task is 404, a target its scope does not name (or none where it names one) 422."""
    async with idem.begin(principal) as tx:
        budget = await budgets.create(principal, body.model_dump())
        return tx.respond(
            201, BudgetPublic.from_row(budget), location=f"/api/v1/budgets/{budget.id}"
        )


@router.get(
    "/api/v1/budgets/{budget_id}",
    operation_id="getBudget",
    response_model=BudgetPublic,
    responses=docs.problems(*docs.READ),
    summary="Get a budget",
)
async def get_budget(budget_id: BudgetId, principal: Reader, budgets: Budgets) -> BudgetPublic:
    """One budget with this period's figures."""
    return BudgetPublic.from_row(await budgets.get(principal, budget_id))


@router.patch(
    "/api/v1/budgets/{budget_id}",
    operation_id="updateBudget",
    response_model=BudgetPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(*docs.WRITE),
    summary="Change a budget",
)
async def update_budget(
    budget_id: BudgetId, body: BudgetUpdate, principal: Writer, budgets: Budgets
) -> BudgetPublic:
    """Change the amount, warning threshold, hard stop or time zone; the next reservation
    uses them."""
    changes = body.model_dump(exclude_unset=True)
    return BudgetPublic.from_row(await budgets.update(principal, budget_id, changes))


@router.delete(
    "/api/v1/budgets/{budget_id}",
    operation_id="deleteBudget",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Delete a budget",
)
async def delete_budget(budget_id: BudgetId, principal: Writer, budgets: Budgets) -> Response:
    """Remove a budget; the ledger keeps every call."""
    await budgets.delete(principal, budget_id)
    return Response(status_code=204)


@router.get(
    "/api/v1/costs",
    operation_id="getCosts",
    response_model=CostReport,
    responses=docs.problems(*docs.READ),
    summary="Totals and series of the cost ledger",
)
async def get_costs(
    principal: Reader,
    budgets: Budgets,
    since: Since = None,
    until: Until = None,
    group_by: Annotated[CostGroup | None, Query(description="Group by this")] = None,
    interval: Annotated[
        Literal["day"] | None, Query(description="`day`: a series per UTC day")
    ] = None,
) -> CostReport:
    """Calls, tokens and USD of every LLM call, agent runs' and relay calls', in total, per
    group and/or per UTC day; an empty range has no rows. A time without an offset is UTC.
    At most 5,000 rows: more is 422 (narrow the range or group by less)."""
    start, end = instants.window(since, until, now=datetime.now(UTC), days=30)
    rows = await budgets.costs(
        principal, since=start, until=end, group_by=group_by, interval=interval
    )
    return CostReport(
        since=start,
        until=end,
        group_by=group_by,
        interval=interval,
        rows=[CostRow(**row) for row in rows],
    )


# The longest range of one latency answer (a year of hourly points; the costs page shows at
# most 366 days).
MAX_LATENCY_DAYS = 366


@router.get(
    "/api/v1/costs/latency",
    operation_id="getCostsLatency",
    response_model=LatencyReport,
    responses=docs.problems(*docs.READ),
    summary="Time to first token per hour",
)
async def get_costs_latency(
    principal: Reader,
    budgets: Budgets,
    since: Since = None,
    until: Until = None,
) -> LatencyReport:
    """Per UTC hour, the runs that started in [since, until) and reached a first token, with
    the p50 and p95 of their time to first token; hours without such runs are left out, an
    empty range has no rows. A time without an offset is UTC. Whole hours come from a
    histogram (within 5 % of the exact percentile, or 1 ms below 1 ms), hours the range cuts
    from the runs themselves (exact). At most 366 days: a longer range is 422."""
    start, end = instants.window(since, until, now=datetime.now(UTC), days=30)
    if end - start > timedelta(days=MAX_LATENCY_DAYS):
        message = f"a range of at most {MAX_LATENCY_DAYS} days"
        raise InvalidInput(
            f"since: {message}",
            errors=[{"location": "query", "field": "since", "message": message, "code": "range"}],
        )
    rows = await budgets.latency(principal, since=start, until=end)
    return LatencyReport(
        since=start,
        until=end,
        rows=[
            LatencyRow(
                hour=datetime.fromisoformat(row["hour"]).replace(tzinfo=UTC),
                runs=row["runs"],
                p50_ms=row["p50_ms"],
                p95_ms=row["p95_ms"],
            )
            for row in rows
        ],
    )
