"""Budgets and reservations in the store: reserve, extend and settle, safe under concurrency.

Every reservation reads the budgets it charges with a row lock (PostgreSQL `FOR UPDATE`, in
id order so two calls never wait on each other crosswise; SQLite has one writer), rolls a
month that has ended over to the next, grants at most what every hard-stop budget has left,
and adds the grant to `reserved_usd`, all in one short transaction. So concurrent calls, in one
process or many, can never together reserve past an amount. Settling moves a call's
reservation into `spent_usd` with its real cost, in the transaction that writes its ledger row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.budgets import (
    EPSILON_USD,
    BudgetPeriod,
    BudgetRecord,
    Crossing,
    period_end,
    period_start,
    warn_reached,
)
from bullpen.store import audit, notices
from bullpen.store import gateway as gateway_store
from bullpen.store.base import UNWATCHED, Connection
from bullpen.store.ids import time_ordered_id
from bullpen.store.tables import budget_reservations, budgets, cost_events, runs, tasks

_B = budgets.c
_R = budget_reservations.c
# What a pool may take beyond its present need: this share of what a budget has left.
_POOL_SHARE = 0.25


async def insert(conn: Connection, row: dict[str, Any]) -> BudgetRecord:
    """Store a new budget (every column but the period's figures); returns it."""
    values = {"id": time_ordered_id(), "spent_usd": 0.0, "reserved_usd": 0.0, **row}
    values.setdefault("warned", False)
    values.setdefault("exceeded", False)
    await conn.execute(budgets.insert(), values)
    found = await get(conn, row["workspace_id"], values["id"])
    assert found is not None
    return found


async def get(conn: Connection, workspace_id: UUID, budget_id: UUID) -> BudgetRecord | None:
    """One budget of the workspace."""
    row = (
        await conn.execute(
            sa.select(budgets).where(_B.workspace_id == workspace_id, _B.id == budget_id)
        )
    ).first()
    return BudgetRecord.of(row) if row is not None else None


async def of_workspace(conn: Connection, workspace_id: UUID) -> list[BudgetRecord]:
    """Every budget of the workspace, oldest first."""
    rows = await conn.execute(
        sa.select(budgets).where(_B.workspace_id == workspace_id).order_by(_B.created_at, _B.id)
    )
    return [BudgetRecord.of(row) for row in rows]


async def update(
    conn: Connection, workspace_id: UUID, budget_id: UUID, values: dict[str, Any]
) -> None:
    """Change a budget's settings."""
    await conn.execute(
        budgets.update().where(_B.workspace_id == workspace_id, _B.id == budget_id).values(values)
    )


async def delete(conn: Connection, workspace_id: UUID, budget_id: UUID) -> bool:
    """Remove a budget; False if it was not there."""
    result = await conn.execute(
        budgets.delete().where(_B.workspace_id == workspace_id, _B.id == budget_id)
    )
    return bool(result.rowcount)


async def task_tree(conn: Connection, task_id: UUID, max_depth: int = 64) -> frozenset[UUID]:
    """The task and every task above it (its parent, the parent's parent, ...)."""
    up = (
        sa.select(tasks.c.id, tasks.c.parent_id, sa.literal(0).label("depth"))
        .where(tasks.c.id == task_id)
        .cte("up", recursive=True)
    )
    up = up.union_all(
        sa.select(tasks.c.id, tasks.c.parent_id, (up.c.depth + 1).label("depth")).where(
            tasks.c.id == up.c.parent_id, up.c.depth < max_depth
        )
    )
    return frozenset(row.id for row in await conn.execute(sa.select(up.c.id)))


async def task_spend(conn: Connection, task_id: UUID, agent_id: UUID) -> float:
    """What the agent's runs of this task have spent so far, over every delivery and wake."""
    total = (
        await conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(cost_events.c.cost_usd), 0.0)).where(
                cost_events.c.task_id == task_id, cost_events.c.agent_id == agent_id
            )
        )
    ).scalar_one()
    return float(total)


@dataclass(slots=True)
class Grant:
    """What a reservation got, and the budgets it made reach a threshold."""

    granted_usd: float
    crossings: list[Crossing] = field(default_factory=list)


async def _locked(conn: Connection, budget_ids: Sequence[UUID]) -> list[Any]:
    query = sa.select(budgets).where(_B.id.in_(list(budget_ids))).order_by(_B.id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return list(await conn.execute(query))


def _current(row: Any, now: datetime) -> dict[str, Any]:
    """The row's period figures as of `now` (a month that has ended starts over)."""
    figures = {
        "period_start": row.period_start,
        "spent_usd": row.spent_usd,
        "reserved_usd": row.reserved_usd,
        "warned": row.warned,
        "exceeded": row.exceeded,
    }
    period = BudgetPeriod(row.period)
    end = period_end(period, row.timezone, row.period_start)
    if end is not None and now >= end:
        # What is still reserved belongs to calls in flight; they settle into the new period.
        figures.update(
            period_start=period_start(period, row.timezone, now),
            spent_usd=0.0,
            warned=False,
            exceeded=False,
        )
    return figures


async def reserve(
    conn: Connection,
    *,
    workspace_id: UUID,
    budget_ids: Sequence[UUID],
    want_usd: float,
    now: datetime,
    expires_at: datetime,
    reservation_id: UUID | None = None,
    run_id: UUID | None = None,
    api_key_id: UUID | None = None,
    need_usd: float | None = None,
    override_task_id: UUID | None = None,
) -> tuple[UUID | None, Grant]:
    """Reserve up to `want_usd` against every budget in `budget_ids`: at most what the
    tightest hard-stop budget has left. Returns the reservation (created, or extended when
    `reservation_id` is given) and the grant; a grant of zero reserves nothing.

    With `need_usd` (a pool stocking up ahead of its calls), anything beyond `need_usd` is
    granted only up to a quarter of what is left, so one process never takes the last of a
    budget that the others' calls need.

    With `override_task_id`, what the hard-stop budgets cannot grant is taken from the one-off
    override an approver gave that task (`tasks.budget_override_usd`), while it lasts."""
    rows = await _locked(conn, budget_ids)
    grant = Grant(want_usd)
    figures = {row.id: _current(row, now) for row in rows}
    for row in rows:
        if row.hard_stop:
            f = figures[row.id]
            room = max(0.0, row.amount_usd - f["spent_usd"] - f["reserved_usd"])
            allowed = room if need_usd is None else min(room, max(need_usd, room * _POOL_SHARE))
            grant.granted_usd = min(grant.granted_usd, allowed)
    short = want_usd - grant.granted_usd
    if override_task_id is not None and short > EPSILON_USD:
        grant.granted_usd += await _take_override(conn, override_task_id, short)
    if grant.granted_usd <= EPSILON_USD:
        grant.granted_usd = 0.0
    for row in rows:
        f = figures[row.id]
        f["reserved_usd"] += grant.granted_usd
        if grant.granted_usd == 0.0 and row.hard_stop and not f["exceeded"]:
            f["exceeded"] = True
            grant.crossings.append(_crossing(row.id, "exceeded", row.amount_usd, f))
        elif not f["warned"] and warn_reached(
            row.amount_usd, row.warn_percent, f["spent_usd"], f["reserved_usd"]
        ):
            f["warned"] = True
            grant.crossings.append(_crossing(row.id, "warning", row.amount_usd, f))
        await conn.execute(budgets.update().where(_B.id == row.id).values(**f, updated_at=now))
    if grant.granted_usd == 0.0:
        return reservation_id, grant
    if reservation_id is None:
        reservation_id = time_ordered_id()
        await conn.execute(
            budget_reservations.insert(),
            {
                "id": reservation_id,
                "workspace_id": workspace_id,
                "budget_ids": sorted(str(b) for b in budget_ids),
                "amount_usd": grant.granted_usd,
                "run_id": run_id,
                "api_key_id": api_key_id,
                "expires_at": expires_at,
                "created_at": now,
            },
        )
    else:
        await conn.execute(
            budget_reservations.update()
            .where(_R.id == reservation_id)
            .values(amount_usd=_R.amount_usd + grant.granted_usd, expires_at=expires_at)
        )
    return reservation_id, grant


async def _take_override(conn: Connection, task_id: UUID, want_usd: float) -> float:
    """Up to `want_usd` of the task's budget override, taken from it (0 without one)."""
    query = sa.select(tasks.c.budget_override_usd).where(tasks.c.id == task_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    left = (await conn.execute(query)).scalar_one_or_none()
    if not left or left <= EPSILON_USD:
        return 0.0
    taken = min(float(left), want_usd)
    await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id)
        .values(budget_override_usd=float(left) - taken)
        .execution_options(**{UNWATCHED: True})
    )
    return taken


async def add_override(conn: Connection, task_id: UUID, amount_usd: float) -> None:
    """Give a task a one-off budget override of `amount_usd` more (an approver's decision)."""
    await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id)
        .values(budget_override_usd=sa.func.coalesce(tasks.c.budget_override_usd, 0.0) + amount_usd)
        .execution_options(**{UNWATCHED: True})
    )


def _crossing(budget_id: UUID, kind: str, amount: float, f: dict[str, Any]) -> Crossing:
    return Crossing(budget_id, kind, amount, f["spent_usd"], f["reserved_usd"])


async def settle(
    conn: Connection,
    reservation_id: UUID,
    budget_ids: Sequence[UUID],
    cost_usd: float,
    now: datetime,
) -> list[Crossing] | None:
    """Move a reservation (against `budget_ids`) into the budgets' spend at the call's real
    cost, and drop it.

    A reservation settled already (or never made) changes nothing: settling is idempotent, so
    a run's final write and the reaper can never count one call twice: None when it was
    settled already. The budgets are locked before the reservation, in the order every
    reservation takes them, so a settle never waits crosswise on a reservation's extension."""
    locked = await _locked(conn, budget_ids)
    row = (
        await conn.execute(
            budget_reservations.delete().where(_R.id == reservation_id).returning(_R.amount_usd)
        )
    ).first()
    if row is None:
        return None
    return await _apply(conn, locked, {b: (row.amount_usd, cost_usd) for b in budget_ids}, now)


async def _apply(
    conn: Connection,
    locked: Sequence[Any],
    changes: dict[UUID, tuple[float, float]],
    now: datetime,
) -> list[Crossing]:
    """Give back `released` of what the `locked` budgets hold reserved and add `cost` to their
    spend, for each budget's `(released, cost)` in `changes`; the warnings this crosses."""
    crossings: list[Crossing] = []
    for budget in locked:
        released, cost = changes[budget.id]
        f = _current(budget, now)
        f["reserved_usd"] = max(0.0, f["reserved_usd"] - released)
        f["spent_usd"] += cost
        if not f["warned"] and warn_reached(
            budget.amount_usd, budget.warn_percent, f["spent_usd"], f["reserved_usd"]
        ):
            f["warned"] = True
            crossings.append(_crossing(budget.id, "warning", budget.amount_usd, f))
        await conn.execute(budgets.update().where(_B.id == budget.id).values(**f, updated_at=now))
    return crossings


@dataclass(frozen=True, slots=True)
class Draw:
    """What one relayed call drew from its process's pool (`reservation_id`, held against
    `budget_ids`) and what it really cost."""

    workspace_id: UUID
    reservation_id: UUID
    budget_ids: tuple[UUID, ...]
    drawn_usd: float
    cost_usd: float


async def settle_draws(conn: Connection, draws: Sequence[Draw], now: datetime) -> None:
    """Settle relayed calls against their pools, in the transaction that writes their ledger
    rows: each call's cost moves from its pool's reservation into the budgets' spend (what
    it drew beyond its cost stays in the pool; a cost beyond its draw is added to the spend
    directly). A pool its process has given back already holds nothing more to move: there
    the cost is only added."""
    if not draws:
        return
    budget_ids = sorted({b for d in draws for b in d.budget_ids})
    locked = await _locked(conn, budget_ids)
    moved: dict[UUID, float] = {}
    for d in draws:
        moved[d.reservation_id] = moved.get(d.reservation_id, 0.0) + min(d.cost_usd, d.drawn_usd)
    present: set[UUID] = set()
    for reservation_id, amount in moved.items():
        found = (
            await conn.execute(
                budget_reservations.update()
                .where(_R.id == reservation_id)
                .values(
                    amount_usd=sa.case((_R.amount_usd > amount, _R.amount_usd - amount), else_=0.0)
                )
                .returning(_R.id)
            )
        ).first()
        if found is not None:
            present.add(reservation_id)
    changes = {b: (0.0, 0.0) for b in budget_ids}
    for d in draws:
        released = min(d.cost_usd, d.drawn_usd) if d.reservation_id in present else 0.0
        for b in d.budget_ids:
            r, c = changes[b]
            changes[b] = (r + released, c + d.cost_usd)
    crossings = await _apply(conn, locked, changes, now)
    by_id = {row.id: row.workspace_id for row in locked}
    for crossing in crossings:
        await record_crossings(conn, by_id[crossing.budget_id], [crossing], now)


async def renew(conn: Connection, reservation_id: UUID, expires_at: datetime) -> None:
    """Move a live reservation's expiry on (its process still holds it)."""
    await conn.execute(
        budget_reservations.update().where(_R.id == reservation_id).values(expires_at=expires_at)
    )


async def charge_expired(conn: Connection, now: datetime, limit: int = 100) -> int:
    """Charge relay pools whose process died (their reservations expired, never given back):
    each is charged what it held, the bound of what its calls in flight had drawn, as an
    estimated ledger row. Returns how many were charged."""
    expired = list(
        await conn.execute(
            sa.select(_R.id, _R.budget_ids)
            .where(_R.run_id.is_(None), _R.expires_at < now)
            .order_by(_R.expires_at)
            .limit(limit)
        )
    )
    rows: list[dict[str, Any]] = []
    for item in expired:
        budget_ids = [UUID(b) for b in item.budget_ids]
        locked = await _locked(conn, budget_ids)
        gone = (
            await conn.execute(
                budget_reservations.delete()
                .where(_R.id == item.id)
                .returning(_R.amount_usd, _R.workspace_id, _R.api_key_id)
            )
        ).first()
        if gone is None:  # another process charged it meanwhile
            continue
        crossings = await _apply(
            conn, locked, {b: (gone.amount_usd, gone.amount_usd) for b in budget_ids}, now
        )
        await record_crossings(conn, gone.workspace_id, crossings, now)
        if gone.amount_usd > 0:
            rows.append(
                _charged(gone.workspace_id, gone.amount_usd, now, api_key_id=gone.api_key_id)
            )
    await gateway_store.record_costs(conn, rows)
    return len(rows)


async def record_crossings(
    conn: Connection, workspace_id: UUID, crossings: Sequence[Crossing], now: datetime
) -> None:
    """Record budgets that reached their warning threshold or their amount: an audit event and
    a workspace notice (`budget.warning`, `budget.exceeded`) each."""
    for crossing in crossings:
        figures = {
            "amount_usd": crossing.amount_usd,
            "spent_usd": round(crossing.spent_usd, 6),
            "reserved_usd": round(crossing.reserved_usd, 6),
        }
        await audit.record(
            conn,
            workspace_id=workspace_id,
            actor_type="system",
            actor_id=None,
            action=f"budget.{crossing.kind}",
            target_type="budget",
            target_id=crossing.budget_id,
            now=now,
            data=figures,
        )
        await notices.add_notice(
            conn,
            workspace_id,
            f"budget.{crossing.kind}",
            {"budget_id": str(crossing.budget_id), **figures},
            now,
        )


# The ledger's provider and model for a call whose worker died before it could say.
UNKNOWN = "unknown"


async def settle_run(
    conn: Connection,
    *,
    run_id: UUID,
    workspace_id: UUID,
    agent_id: UUID,
    task_id: UUID,
    calls: Sequence[dict[str, Any]],
    now: datetime,
) -> None:
    """Write a run's calls to the ledger and settle their reservations, then charge whatever
    the run still holds (see `charge_held`). A call whose reservation was charged already (by
    the reaper, after this delivery lost its lease) is not written twice."""
    rows: list[dict[str, Any]] = []
    crossings: list[Crossing] = []
    for call in calls:
        settled: list[Crossing] | None = []
        if call.get("reservation_id") is not None:
            settled = await settle(
                conn, call["reservation_id"], call["budget_ids"], call["cost_usd"], now
            )
        if settled is None:
            continue
        crossings += settled
        if call.get("served"):
            row = {k: call[k] for k in _CALL_FIELDS}
            rows.append(_run_row(workspace_id, run_id, agent_id, task_id, now, **row))
    await gateway_store.record_costs(conn, rows)
    await record_crossings(conn, workspace_id, crossings, now)
    # Only a run that reserved, or one whose calls are unknown (cancelled mid-call), can still
    # hold something: the others skip the lookup.
    if not calls or any(call.get("reservation_id") is not None for call in calls):
        await charge_held(conn, [run_id], now)


_CALL_FIELDS = (
    "provider",
    "model",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_usd",
    "estimated",
)


def _run_row(
    workspace_id: UUID, run_id: UUID, agent_id: UUID, task_id: UUID, now: datetime, **call: Any
) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "run_id": run_id,
        "agent_id": agent_id,
        "task_id": task_id,
        "user_id": None,
        "api_key_id": None,
        "source": "run",
        "created_at": now,
        **call,
    }


def _charged(workspace_id: UUID, cost_usd: float, now: datetime, **ids: Any) -> dict[str, Any]:
    """The ledger row of a call charged what it held, its usage never reported: a run's
    (`run_id`, `agent_id`, `task_id`) or a relay pool's (`api_key_id`)."""
    return {
        "workspace_id": workspace_id,
        "run_id": None,
        "agent_id": None,
        "task_id": None,
        "user_id": None,
        "api_key_id": None,
        "provider": UNKNOWN,
        "model": UNKNOWN,
        "input_tokens": 0,
        "cached_input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": cost_usd,
        "estimated": True,
        "created_at": now,
        **ids,
    }


async def charge_held(conn: Connection, run_ids: Sequence[UUID], now: datetime) -> None:
    """Charge what these runs still hold: calls whose delivery died (the reaper) or was
    cancelled mid-stream, which never reported their usage. Each is charged what was reserved
    for it, which covers all the output it had received (at most a slice more), marked
    estimated in the ledger."""
    if not run_ids:
        return
    held = list(
        await conn.execute(
            sa.select(
                _R.id,
                _R.budget_ids,
                _R.amount_usd,
                _R.run_id,
                _R.workspace_id,
                runs.c.agent_id,
                runs.c.task_id,
            )
            .join(runs, runs.c.id == _R.run_id)
            .where(_R.run_id.in_(list(run_ids)))
        )
    )
    rows: list[dict[str, Any]] = []
    for item in held:
        budget_ids = [UUID(b) for b in item.budget_ids]
        crossings = await settle(conn, item.id, budget_ids, item.amount_usd, now)
        if crossings is None:
            continue
        await record_crossings(conn, item.workspace_id, crossings, now)
        rows.append(
            _charged(
                item.workspace_id,
                item.amount_usd,
                now,
                run_id=item.run_id,
                agent_id=item.agent_id,
                task_id=item.task_id,
            )
        )
    await gateway_store.record_costs(conn, rows)
