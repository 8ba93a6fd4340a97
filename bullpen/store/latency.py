"""Time to first token per hour: the p50 and p95 of the runs that started in each UTC hour.

A run's `ttft_ms` is the time from its start to its first content token (its first LLM call
that served one). Both percentiles are computed by the database with linear interpolation
between the two nearest values (PostgreSQL's `percentile_cont`, the same as Python's
`statistics.quantiles(method="inclusive")`):

- PostgreSQL: `percentile_cont(p) WITHIN GROUP (ORDER BY ttft_ms)`, grouped by hour;
- SQLite, which has no percentile aggregate: each run's 0-based rank in its hour and the hour's
  count from window functions (`row_number()`, `count(*) OVER`), then per hour the values at
  ranks floor(p·(n-1)) and ceil(p·(n-1)) interpolated, in one `GROUP BY`.

The query reads the runs started in the range (`ix_runs_workspace_started`); only the per-hour
rows come back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.errors import InvalidInput
from bullpen.store.base import Connection
from bullpen.store.tables import runs

PERCENTILES = (0.5, 0.95)
# Hours in one answer: a year and a day of hourly points (a longer range is refused).
MAX_HOURS = 24 * 367

_R = runs.c


def _hour(dialect: str) -> sa.ColumnElement[str]:
    """The run's UTC hour as `YYYY-MM-DDTHH:00`."""
    if dialect == "postgresql":
        return sa.func.to_char(sa.func.timezone("UTC", _R.started_at), 'YYYY-MM-DD"T"HH24:00')
    return sa.func.strftime("%Y-%m-%dT%H:00", _R.started_at)


async def ttft_per_hour(
    conn: Connection, workspace_id: UUID, *, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """Per UTC hour with runs that reached a first token in [since, until): `hour`, `runs`,
    `p50_ms`, `p95_ms`; oldest hour first."""
    dialect = conn.dialect.name
    hour = _hour(dialect).label("hour")
    window = sa.and_(
        _R.workspace_id == workspace_id,
        _R.started_at >= since,
        _R.started_at < until,
        _R.ttft_ms.is_not(None),
    )
    if dialect == "postgresql":
        query = sa.select(
            hour,
            sa.func.count().label("runs"),
            *(
                sa.func.percentile_cont(p).within_group(_R.ttft_ms).label(_name(p))
                for p in PERCENTILES
            ),
        )
        query = query.where(window).group_by(hour)
    else:
        query = _interpolated(hour, window)
    query = query.order_by(sa.text("hour")).limit(MAX_HOURS + 1)
    rows = [dict(row._mapping) for row in await conn.execute(query)]
    if len(rows) > MAX_HOURS:
        raise InvalidInput(f"more than {MAX_HOURS} hours: narrow the date range")
    for row in rows:
        row["runs"] = int(row["runs"])
        for p in PERCENTILES:
            row[_name(p)] = float(row[_name(p)])
    return rows


def _name(p: float) -> str:
    return f"p{round(p * 100)}_ms"


def _interpolated(hour: sa.ColumnElement[str], window: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """Percentiles from ranks (SQLite): the interpolation `percentile_cont` does."""
    ranked = (
        sa.select(
            hour,
            _R.ttft_ms.label("v"),
            (sa.func.row_number().over(partition_by=hour, order_by=_R.ttft_ms) - 1).label("i"),
            sa.func.count().over(partition_by=hour).label("n"),
        )
        .where(window)
        .subquery("ranked")
    )
    r = ranked.c
    columns: list[sa.ColumnElement[Any]] = []
    for p in PERCENTILES:
        position = (r.n - 1) * p  # where p falls among the hour's sorted values, 0-based
        low = sa.cast(position, sa.Integer)  # floor: the position is never negative
        high = low + sa.case((position > low, 1), else_=0)
        at_low = sa.func.max(sa.case((r.i == low, r.v)))
        at_high = sa.func.max(sa.case((r.i == high, r.v)))
        columns.append((at_low + (at_high - at_low) * (position - low)).label(_name(p)))
    return sa.select(r.hour, r.n.label("runs"), *columns).group_by(r.hour, r.n)
