"""The cost ledger's totals and series, aggregated by the database (`GROUP BY`, never in Python).

Days are UTC days. `group_by` is one of `GROUPS`; rows of calls without that dimension (a relay
call has no agent, a run's call no API key) are grouped under null.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.errors import InvalidInput
from bullpen.store.base import Connection
from bullpen.store.tables import cost_events

_C = cost_events.c
GROUPS = {
    "agent": _C.agent_id,
    "model": _C.model,
    "provider": _C.provider,
    "api_key": _C.api_key_id,
    "source": _C.source,
}
_ID_GROUPS = ("agent", "api_key")  # keys are ids, returned as strings
# At most this many groups (series points) in one answer: narrow the range or the grouping.
MAX_ROWS = 5000


def _day(dialect: str) -> sa.ColumnElement[Any]:
    if dialect == "postgresql":
        return sa.func.to_char(sa.func.timezone("UTC", _C.created_at), "YYYY-MM-DD")
    return sa.func.strftime("%Y-%m-%d", _C.created_at)


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
    of those groups alone (keys as this returns them, None the calls without one)."""
    keys: list[sa.ColumnElement[Any]] = []
    if by_day:
        keys.append(_day(conn.dialect.name).label("day"))
    if group_by is not None:
        keys.append(GROUPS[group_by].label("key"))
    query = (
        sa.select(
            *keys,
            sa.func.count().label("calls"),
            sa.func.coalesce(sa.func.sum(_C.input_tokens), 0).label("input_tokens"),
            sa.func.coalesce(sa.func.sum(_C.cached_input_tokens), 0).label("cached_input_tokens"),
            sa.func.coalesce(sa.func.sum(_C.output_tokens), 0).label("output_tokens"),
            sa.func.coalesce(sa.func.sum(_C.cost_usd), 0.0).label("cost_usd"),
        )
        .where(_C.workspace_id == workspace_id, _C.created_at >= since, _C.created_at < until)
        .limit(MAX_ROWS + 1)
    )
    if only is not None and group_by is not None:
        column = GROUPS[group_by]
        named: list[Any] = [key for key in only if key is not None]
        if group_by in _ID_GROUPS:
            named = [UUID(key) for key in named]
        picked = column.in_(named)
        query = query.where(sa.or_(picked, column.is_(None)) if None in only else picked)
    if keys:
        query = query.group_by(*keys).order_by(*keys)
    rows = [dict(row._mapping) for row in await conn.execute(query)]
    if len(rows) > MAX_ROWS:
        raise InvalidInput(f"more than {MAX_ROWS} groups: narrow the date range or group by less")
    for row in rows:
        if "key" in row and row["key"] is not None:
            row["key"] = str(row["key"])
        row["cost_usd"] = float(row["cost_usd"])
    return rows
