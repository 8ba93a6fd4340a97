"""The cost ledger's totals and series, aggregated by the database (`GROUP BY`, never in Python).

Days are UTC days. `group_by` is one of `GROUPS`; rows of calls without that dimension (a relay
call has no agent, a run's call no API key) are grouped under null.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, time, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.errors import InvalidInput
from bullpen.store.base import Connection
from bullpen.store.rollups import NO_ID
from bullpen.store.tables import cost_days, cost_events

_C = cost_events.c
GROUPS = {
    "agent": _C.agent_id,
    "model": _C.model,
    "provider": _C.provider,
    "api_key": _C.api_key_id,
    "source": _C.source,
}
_D = cost_days.c
_SUMS = ("calls", "input_tokens", "cached_input_tokens", "output_tokens", "cost_usd")
_ID_GROUPS = ("agent", "api_key")  # keys are ids, returned as strings
# At most this many groups (series points) in one answer: narrow the range or the grouping.
MAX_ROWS = 5000


def _day(dialect: str) -> sa.ColumnElement[Any]:
    if dialect == "postgresql":
        return sa.func.to_char(sa.func.timezone("UTC", _C.created_at), "YYYY-MM-DD")
    return sa.func.strftime("%Y-%m-%d", _C.created_at)


def _rolled_day(dialect: str) -> sa.ColumnElement[Any]:
    if dialect == "postgresql":
        return sa.func.to_char(_D.day, "YYYY-MM-DD")
    return sa.type_coerce(_D.day, sa.String)  # stored as YYYY-MM-DD


def _keyed(key: sa.ColumnElement[Any], group_by: str) -> sa.ColumnElement[Any]:
    """A group key as the answer gives it: `NO_ID`, which stands for a call without an agent
    or API key in `cost_days` (and in the ledger's rows as they are grouped), is NULL."""
    if group_by in _ID_GROUPS:
        return sa.func.nullif(key, sa.literal(NO_ID, sa.Uuid), type_=sa.Uuid)
    return key


def _midnight(at: datetime, *, up: bool) -> datetime:
    """The UTC midnight at or before `at` (after it with `up`, unless it is one)."""
    day = datetime.combine(at.astimezone(UTC).date(), time(), UTC)
    return day + timedelta(days=1) if up and day < at else day


def _only(
    column: sa.ColumnElement[Any], group_by: str, only: Collection[str | None], *, rolled: bool
) -> sa.ColumnElement[bool]:
    """The groups in `only`; None, the calls without one, is `NO_ID` in `cost_days`."""
    named: list[Any] = [key for key in only if key is not None]
    if group_by in _ID_GROUPS:
        named = [UUID(key) for key in named]
        if rolled and None in only:
            return column.in_([*named, NO_ID])
    picked = column.in_(named)
    return sa.or_(picked, column.is_(None)) if None in only else picked


async def totals(
    conn: Connection,
    workspace_id: UUID,
    *,
    since: datetime,
    until: datetime,
    group_by: str | None,
    by_day: bool,
    only: Collection[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Calls, tokens and cost in [since, until), per group and/or per UTC day; with `only`,
    of those groups alone (keys as this returns them, None the calls without one).

    The whole UTC days of the range are read from the `cost_days` rollup, only the parts of a
    day at either end from the ledger itself: the same sums (the USD up to the floating-point
    rounding of adding in another order)."""
    dialect = conn.dialect.name
    first, last = _midnight(since, up=True), _midnight(until, up=False)
    parts: list[sa.Select[Any]] = []
    if first < last:
        keys = [_rolled_day(dialect).label("day")] if by_day else []
        if group_by is not None:  # grouped on the column itself, NO_ID as NULL once grouped
            keys.append(_D[GROUPS[group_by].name].label("key"))
        rolled = sa.select(*keys, *(_D[name].label(name) for name in _SUMS)).where(
            _D.workspace_id == workspace_id, _D.day >= first.date(), _D.day < last.date()
        )
        if only is not None and group_by is not None:
            rolled = rolled.where(_only(_D[GROUPS[group_by].name], group_by, only, rolled=True))
        parts.append(rolled)
        edges = [(since, first), (last, until)]
    else:
        edges = [(since, until)]
    for start, end in edges:
        if start < end:
            parts.append(_raw(dialect, workspace_id, start, end, group_by, by_day, only))
    if not parts:  # an empty range
        parts.append(_raw(dialect, workspace_id, since, until, group_by, by_day, only))
    rows_of = sa.union_all(*parts).subquery("rows") if len(parts) > 1 else parts[0].subquery()
    r = rows_of.c
    outer = [r.day] if by_day else []
    if group_by is not None:
        outer.append(r.key)
    shown = [r.day] if by_day else []
    if group_by is not None:
        shown.append(_keyed(r.key, group_by).label("key"))
    query = sa.select(
        *shown,
        *(sa.func.coalesce(sa.func.sum(r[name]), 0).label(name) for name in _SUMS[:-1]),
        sa.func.coalesce(sa.func.sum(r.cost_usd), 0.0).label("cost_usd"),
    ).limit(MAX_ROWS + 1)
    if outer:
        query = query.group_by(*outer).order_by(*shown)
    rows = [dict(row._mapping) for row in await conn.execute(query)]
    if len(rows) > MAX_ROWS:
        raise InvalidInput(f"more than {MAX_ROWS} groups: narrow the date range or group by less")
    for row in rows:
        if "key" in row and row["key"] is not None:
            row["key"] = str(row["key"])
        for name in _SUMS[:-1]:
            row[name] = int(row[name])
        row["cost_usd"] = float(row["cost_usd"])
    return rows


def _raw(
    dialect: str,
    workspace_id: UUID,
    since: datetime,
    until: datetime,
    group_by: str | None,
    by_day: bool,
    only: Collection[str | None] | None,
) -> sa.Select[Any]:
    """The ledger's rows in [since, until) with the columns of a `cost_days` row."""
    keys = [_day(dialect).label("day")] if by_day else []
    if group_by is not None:  # grouped with `cost_days`' rows, where NULL is NO_ID
        column: sa.ColumnElement[Any] = GROUPS[group_by]
        if group_by in _ID_GROUPS:
            column = sa.func.coalesce(column, sa.literal(NO_ID, sa.Uuid), type_=sa.Uuid)
        keys.append(column.label("key"))
    query = sa.select(
        *keys,
        sa.literal(1, sa.BigInteger).label("calls"),
        *(_C[name].label(name) for name in _SUMS[1:]),
    ).where(_C.workspace_id == workspace_id, _C.created_at >= since, _C.created_at < until)
    if only is not None and group_by is not None:
        query = query.where(_only(GROUPS[group_by], group_by, only, rolled=False))
    return query
