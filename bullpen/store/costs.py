"""The cost ledger's totals and series, aggregated by the database (`GROUP BY`, never in Python).

Days are UTC days. `group_by` is one of `GROUPS`; rows of calls without that dimension (a relay
call has no agent, a run's call no API key) are grouped under null.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.errors import InvalidInput
from bullpen.store import rollups
from bullpen.store.base import Connection, dicts
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
# Up to this many days, a read of a few groups names each day (see `_days`).
_DAYS_NAMED = 400


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


def _days(
    first: datetime, last: datetime, group_by: str | None, only: Collection[str | None] | None
) -> sa.ColumnElement[bool]:
    """`cost_days`' rows of the whole days in [first, last). A few agents' rows are found
    through the primary key (workspace, day, agent, …) when each day is named: a range of
    days would read every row of those days and keep the agents' (the costs page's chart
    of its ten largest spenders read 12,700 rows of a month for 300)."""
    count = (last - first).days
    if only is not None and group_by == "agent" and count <= _DAYS_NAMED:
        return _D.day.in_([(first + timedelta(days=n)).date() for n in range(count)])
    return sa.and_(_D.day >= first.date(), _D.day < last.date())


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
    rounding of adding in another order). On SQLite a range of whole days grouped by one
    dimension sums the days' groups kept in the rollups' memo (`_whole_days`)."""
    dialect = conn.dialect.name
    first, last = _midnight(since, up=True), _midnight(until, up=False)
    await rollups.settle(conn)  # a write transaction reads what it added
    memo = rollups.memo_of(conn)
    whole_days = first < last and (first, last) == (since, until)
    if memo is not None and group_by is not None and whole_days:
        found = await _whole_days(conn, memo, workspace_id, first, last, group_by, by_day, only)
        return _answer(found)
    parts: list[sa.Select[Any]] = []
    if first < last:
        keys = [_rolled_day(dialect).label("day")] if by_day else []
        if group_by is not None:  # grouped on the column itself, NO_ID as NULL once grouped
            keys.append(_D[GROUPS[group_by].name].label("key"))
        rolled = sa.select(*keys, *(_D[name].label(name) for name in _SUMS)).where(
            _D.workspace_id == workspace_id, _days(first, last, group_by, only)
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
    return _answer(dicts(await conn.execute(query)))


def _answer(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as `totals` answers them: keys as strings, sums as int and float."""
    if len(rows) > MAX_ROWS:
        raise InvalidInput(f"more than {MAX_ROWS} groups: narrow the date range or group by less")
    for row in rows:
        if "key" in row and row["key"] is not None:
            row["key"] = str(row["key"])
        for name in _SUMS[:-1]:
            row[name] = int(row[name])
        row["cost_usd"] = float(row["cost_usd"])
    return rows


async def _whole_days(
    conn: Connection,
    memo: rollups.Memo,
    workspace_id: UUID,
    first: datetime,
    last: datetime,
    group_by: str,
    by_day: bool,
    only: Collection[str | None] | None,
) -> list[dict[str, Any]]:
    """`totals` of the whole days in [first, last) from each day's sums per group, kept in
    the memo until the day is written; the days it lacks are read in one statement (from the
    first to the last of them), in the same order and with the same keys as the SQL path."""
    days = [first.date() + timedelta(days=n) for n in range((last - first).days)]
    column = _D[GROUPS[group_by].name]

    async def read(start: date, end: date) -> dict[date, dict[Any, tuple[Any, ...]]]:
        query = (
            sa.select(_D.day, column.label("key"), *(sa.func.sum(_D[name]) for name in _SUMS))
            .where(_D.workspace_id == workspace_id, _D.day >= start, _D.day <= end)
            .group_by(_D.day, column)
        )
        by_day: dict[date, dict[Any, tuple[Any, ...]]] = {}
        got: Any
        for got in await conn.execute(query):
            day, key, *day_sums = got
            by_day.setdefault(day, {})[key] = tuple(day_sums)
        return by_day

    stamp, found = await memo.recall(("cost", group_by), workspace_id, days, read, {})
    wanted = None if only is None else _raw_keys(group_by, only)
    sums: dict[tuple[Any, ...], list[Any]] = {}
    adding = days
    if not by_day and wanted is None and len(days) > 1:
        # The days before the last, summed, are kept too: while agents run, only the last
        # day (today) is written, and a month's page adds its groups to the rest's.
        span_kind, span = ("costs", group_by), (days[0], days[-2])
        before = memo.get(span_kind, workspace_id, span, covering=days[:-1])
        if before is rollups.MISSING:
            before = _summed(found, days[:-1], group_by, wanted, by_day)
            memo.put(span_kind, workspace_id, span, stamp, before)
        sums = {at: list(total) for at, total in before.items()}
        adding = days[-1:]
    for at, total in _summed(found, adding, group_by, wanted, by_day).items():
        kept = sums.get(at)
        sums[at] = total if kept is None else [a + b for a, b in zip(kept, total, strict=True)]
    names = ("day", "key") if by_day else ("key",)
    ordered = sorted(sums.items(), key=lambda item: tuple(_in_order(k) for k in item[0]))
    return [
        dict(zip(names, at, strict=True)) | dict(zip(_SUMS, total, strict=True))
        for at, total in ordered
    ]


def _summed(
    found: dict[date, Any],
    days: list[date],
    group_by: str,
    wanted: set[Any] | None,
    by_day: bool,
) -> dict[tuple[Any, ...], list[Any]]:
    """The days' sums per group (and day, `by_day`), of the `wanted` groups alone."""
    sums: dict[tuple[Any, ...], list[Any]] = {}
    for day in days:
        for key, day_sums in found[day].items():
            if wanted is not None and key not in wanted:
                continue
            shown = None if group_by in _ID_GROUPS and key == NO_ID else key
            at = (day.isoformat(), shown) if by_day else (shown,)
            total = sums.get(at)
            if total is None:
                sums[at] = list(day_sums)
            else:
                for i, value in enumerate(day_sums):
                    total[i] += value
    return sums


def _raw_keys(group_by: str, only: Collection[str | None]) -> set[Any]:
    """The `cost_days` keys of the groups in `only` (None: `NO_ID`, or no row at all)."""
    if group_by in _ID_GROUPS:
        return {UUID(key) if key is not None else NO_ID for key in only}
    return {key for key in only if key is not None}


def _in_order(key: Any) -> tuple[bool, str]:
    """How the SQL path orders a day or a key on SQLite: NULL first, then by its text."""
    return (key is not None, "" if key is None else str(key))


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
