"""Time to first token per hour: the p50 and p95 of the runs that started in each UTC hour.

A run's `ttft_ms` is the time from its start to its first content token (its first LLM call
that served one). A percentile is the linear interpolation between the two nearest values, as
PostgreSQL's `percentile_cont` and Python's `statistics.quantiles(method="inclusive")`: at
position p·(n-1) among the hour's n values sorted.

Whole hours come from the `ttft_hours` histogram (bullpen/store/rollups.py), kept as runs end:
per hour, counts of runs per log-spaced bucket (bucket i ≥ 1 holds [1.05^(i-1), 1.05^i) ms,
bucket 0 below 1 ms). The database hands over each hour's buckets as one list; here, per hour
and percentile, the buckets holding the values at ranks floor(p·(n-1)) and ceil(p·(n-1)) are
found (running sums over the buckets); each of those values is estimated by spreading its
bucket's runs evenly over the bucket (the k-th of c at (k + ½)/c of its width), then the two
are interpolated as above. Each estimate lies in the
same bucket as the value it stands for, so a percentile is off by less than 5 % of the exact
one (or by less than 1 ms, below 1 ms). It reads one row per hour and bucket in use, whatever
the number of runs.

An hour the range cuts (an API range need not start or end on the hour) is computed exactly
from the runs started in its part of the range (`ix_runs_workspace_started`):

- PostgreSQL: `percentile_cont(p) WITHIN GROUP (ORDER BY ttft_ms)`, grouped by hour;
- SQLite, which has no percentile aggregate: each run's 0-based rank in its hour and the hour's
  count from window functions (`row_number()`, `count(*) OVER`), then per hour the values at
  ranks floor(p·(n-1)) and ceil(p·(n-1)) interpolated, in one `GROUP BY`.

The histogram keeps the hours of runs whose tasks retention deleted, and goes with the usage
ledger's retention (`retention.delete_old_ttft`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.errors import InvalidInput
from bullpen.store import rollups
from bullpen.store.base import Connection, dicts
from bullpen.store.tables import runs, ttft_hours

PERCENTILES = (0.5, 0.95)
# Hours in one answer: a year and a day of hourly points (a longer range is refused).
MAX_HOURS = 24 * 367
# A histogram's bucket and its count read as one integer, bucket * 2^32 + runs: one hour's
# runs in one bucket stay far below 2^32.
_PACK = 1 << 32
_RUNS = _PACK - 1

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
    first, last = _on_the_hour(since, up=True), _on_the_hour(until, up=False)
    rows: list[dict[str, Any]] = []
    if first < last:
        rows += await _from_histogram(conn, workspace_id, first, last)
        edges = [(since, first), (last, until)]
    else:
        edges = [(since, until)]
    for start, end in edges:
        if start < end:
            rows += await _exact(conn, workspace_id, start, end)
    rows.sort(key=lambda row: str(row["hour"]))
    if len(rows) > MAX_HOURS:
        raise InvalidInput(f"more than {MAX_HOURS} hours: narrow the date range")
    return rows


def _on_the_hour(at: datetime, *, up: bool) -> datetime:
    """The UTC hour at or before `at` (the next one with `up`, unless `at` is on the hour)."""
    hour = rollups.hour_of(at)
    return hour + timedelta(hours=1) if up and hour < at else hour


async def _from_histogram(
    conn: Connection, workspace_id: UUID, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """The percentiles of the whole hours in [since, until), from `ttft_hours`; on SQLite
    those of hours not written since they were last read come from the rollups' memo
    (`rollups.Memo`), and only the span from the first hour it lacks to the last is read."""
    await rollups.settle(conn)  # a write transaction reads what it added
    memo = rollups.memo_of(conn)
    if memo is None:
        return await _histogram(conn, workspace_id, since, until)
    hours = [since + timedelta(hours=n) for n in range(int((until - since) / _HOUR))]

    async def read(start: datetime, end: datetime) -> dict[datetime, dict[str, Any]]:
        return {
            datetime.fromisoformat(row["hour"]).replace(tzinfo=UTC): row
            for row in await _histogram(conn, workspace_id, start, end + _HOUR)
        }

    # None: no run started in that hour
    _stamp, found = await memo.recall(_KIND, workspace_id, hours, read, None)
    return [dict(row) for row in found.values() if row is not None]


_KIND = "ttft"
_HOUR = timedelta(hours=1)


async def _histogram(
    conn: Connection, workspace_id: UUID, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """The percentiles of the whole hours in [since, until), from `ttft_hours`: the database
    hands over each hour's buckets as one list of integers, `bucket * 2^32 + runs`
    (`array_agg`; SQLite: `group_concat`), which is a few rows whatever the number of runs
    and, sorted, puts the buckets in order; the ranks are found here."""
    h = ttft_hours.c
    window = sa.and_(h.workspace_id == workspace_id, h.hour >= since, h.hour < until)
    postgres = conn.dialect.name == "postgresql"
    packed = sa.cast(h.bucket, sa.BigInteger) * _PACK + h.runs
    if postgres:
        hour: sa.ColumnElement[Any] = sa.func.to_char(
            sa.func.timezone("UTC", h.hour), 'YYYY-MM-DD"T"HH24:00'
        )
        buckets: sa.ColumnElement[Any] = sa.func.array_agg(packed)
    else:
        hour = sa.type_coerce(h.hour, sa.String)  # 'YYYY-MM-DD HH:00:00.000000'
        buckets = sa.func.group_concat(packed)
    query = (
        sa.select(hour.label("hour"), buckets.label("buckets"))
        .where(window)
        .group_by(h.hour)
        .order_by(h.hour)
        .limit(MAX_HOURS + 1)
    )
    rows = []
    got: Any
    for got in await conn.execute(query):
        hour_text, listed = tuple(got)
        if postgres:
            pairs = sorted(listed)
        else:
            hour_text = f"{hour_text[:10]}T{hour_text[11:13]}:00"
            pairs = sorted(map(int, listed.split(",")))
        rows.append({"hour": hour_text, **_percentiles(pairs)})
    return rows


def _percentiles(pairs: list[int]) -> dict[str, Any]:
    """`runs` and each percentile of one hour's buckets, as sorted `bucket * 2^32 + runs`."""
    counts = [pair & _RUNS for pair in pairs]
    upto = list(itertools.accumulate(counts))  # runs up to and including each bucket
    n = upto[-1]
    out: dict[str, Any] = {"runs": n}
    for p, name in _NAMES.items():
        at = (n - 1) * p  # where p falls among the hour's sorted values, 0-based
        low = math.floor(at)
        at_low = _value_at(pairs, counts, upto, low)
        at_high = _value_at(pairs, counts, upto, math.ceil(at)) if at > low else at_low
        out[name] = at_low + (at_high - at_low) * (at - low)
    return out


def _value_at(pairs: list[int], counts: list[int], upto: list[int], rank: int) -> float:
    """The estimate of the value at a 0-based rank: its bucket's runs spread evenly over the
    bucket, the k-th of c at (k + ½)/c of its width."""
    i = bisect.bisect_right(upto, rank)  # the first bucket holding more than `rank` runs
    lower, upper = rollups.bucket_bounds(pairs[i] >> 32)
    k = rank - (upto[i] - counts[i])
    return lower + (upper - lower) * (k + 0.5) / counts[i]


async def _exact(
    conn: Connection, workspace_id: UUID, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """The exact percentiles of the runs started in [since, until), per hour."""
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
    rows = dicts(await conn.execute(query))
    for row in rows:
        row["runs"] = int(row["runs"])
        for p in PERCENTILES:
            row[_name(p)] = float(row[_name(p)])
    return rows


def _name(p: float) -> str:
    return f"p{round(p * 100)}_ms"


_NAMES = {p: _name(p) for p in PERCENTILES}


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
