"""Rollups kept by the writes of the rows they sum, so the dashboard reads a few thousand rows
instead of every ledger row and run of a month (migration 0021).

- `cost_days`: the cost ledger's calls, tokens and USD per workspace, UTC day and every key
  `/api/v1/costs` groups by (agent, API key, provider, model, source); a grouping sums its rows.
  Every write of `cost_events` keeps it in step in the same transaction: the ledger's inserts
  (`gateway.record_costs`; outside a write transaction, one statement with the insert on
  PostgreSQL), retention's deletes
  (`subtract_costs`), an agent's delete (`forget_agent`, as the ledger's `SET NULL`) and the
  demo seed. Ledger rows are never updated. A call without an agent or an API key is under
  `NO_ID` there (a NULL would never conflict in the upsert's key).
- `ttft_hours`: per workspace and UTC hour of the run's start, how many runs' time to first
  token fell in each bucket. Bucket 0 holds [0, 1) ms; bucket i ≥ 1 holds
  [GROWTH^(i-1), GROWTH^i) ms. A percentile read from it is within the bucket of the exact
  one (see `bullpen/store/latency.py`): off by less than GROWTH - 1 (5 %) of it, or 1 ms
  below 1 ms. Written where a run's end records its `ttft_ms` (`runs.finish`; a run ends once).

Inside a write transaction the additions are gathered and made just before it commits, after
everything else it did (`_Additions`): `ttft_hours` first, then `cost_days`, each in key order,
one upsert each however many runs ended in it (the event log ends many in one). Every writer
therefore locks these shared rows in one order, and only for the moment before its commit; on
PostgreSQL, transactions that ended runs and recorded their costs in opposite orders used to
deadlock on them (one waited `deadlock_timeout`, 1 s, then was retried).

On SQLite the writers also mark the days and hours they wrote, after their commit, in the
database's `Memo` of what the dashboard read of them (see `Memo`).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.store.base import (
    WRITE_OPTION,
    Connection,
    InlineConnection,
    after_commit,
    deferred,
    upsert_insert,
)
from bullpen.store.tables import api_keys, cost_days, cost_events, runs, ttft_hours

NO_ID = UUID(int=0)  # the agent or API key of a call without one
GROWTH = 1.05  # each bucket's upper bound over its lower one
_LN_GROWTH = math.log(GROWTH)

COST_KEY = ("workspace_id", "day", "agent_id", "api_key_id", "provider", "model", "source")
COST_SUMS = ("calls", "input_tokens", "cached_input_tokens", "output_tokens", "cost_usd")
_TTFT_KEY = ("workspace_id", "hour", "bucket")


def bucket_of(ttft_ms: float) -> int:
    """The histogram bucket of a time to first token."""
    if not ttft_ms >= 1.0:  # below 1 ms (or not a number)
        return 0
    return 1 + math.floor(math.log(ttft_ms) / _LN_GROWTH)


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """A bucket's lower (inclusive) and upper (exclusive) bound, in ms."""
    if bucket <= 0:
        return 0.0, 1.0
    return GROWTH ** (bucket - 1), GROWTH**bucket


def hour_of(at: datetime) -> datetime:
    """The UTC hour an instant falls in."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def day_of(at: datetime) -> date:
    """The UTC day an instant falls in."""
    return at.astimezone(UTC).date()


MISSING = object()  # what `Memo.get` answers for a value it does not hold (None is a value)
# What a memo holds at most, counted in values and their groups (a day's sums of 200 agents
# count 201, about 40 KB): past it, it starts over empty. A month of one workspace grouped
# by agent is about 6,500.
MEMO_ITEMS = 200_000


class Memo:
    """Values the dashboard computed from one period of a rollup (a UTC day of `cost_days`,
    an hour of `ttft_hours`) of a workspace, kept until this process writes that period: a
    month's page then reads today's rows and the hours whose runs ended since, not 13,000
    day rows and 23,000 buckets.

    Only on SQLite, whose file one process holds (`Store.lock_sqlite`): every write of the
    rollups passes through this module's writers, which mark what they wrote (`wrote`,
    `wrote_all`) once their transaction commits. On PostgreSQL other processes write too,
    and each read goes to the database.

    Stamps order reads and writes: a reader takes a stamp before its read begins and files
    its values under it; a writer stamps the periods it wrote after its commit. A value is
    current while its stamp is later than its period's and its workspace's last writes, so
    a value read before a write committed is never used after it.
    """

    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self._written: dict[tuple[UUID, Any], int] = {}
        self._cleared: dict[UUID, int] = {}
        self._values: dict[tuple[Any, UUID, Any], tuple[int, Any]] = {}
        self._items = 0  # filed since it last started over (a value filed again counts again)

    def stamp(self) -> int:
        """The stamp of a read about to begin."""
        return next(self._clock)

    def get(self, kind: Any, workspace_id: UUID, period: Any, covering: Sequence[Any] = ()) -> Any:
        """The current value of `kind` for the period, or MISSING. A value computed from
        several periods (`covering`) is current while none of them was written."""
        entry = self._values.get((kind, workspace_id, period))
        if entry is None:
            return MISSING
        stamp, value = entry
        if stamp < self._cleared.get(workspace_id, 0):
            return MISSING
        for one in covering or (period,):
            if stamp < self._written.get((workspace_id, one), 0):
                return MISSING
        return value

    def put(self, kind: Any, workspace_id: UUID, period: Any, stamp: int, value: Any) -> None:
        """File a value read under `stamp`."""
        self._items += 1 + (len(value) if isinstance(value, dict) else 0)
        if self._items > MEMO_ITEMS:
            self._values.clear()
            self._items = 0
        self._values[(kind, workspace_id, period)] = (stamp, value)

    async def recall(
        self,
        kind: Any,
        workspace_id: UUID,
        periods: Sequence[Any],
        read: Callable[[Any, Any], Awaitable[Mapping[Any, Any]]],
        absent: Any,
    ) -> tuple[int, dict[Any, Any]]:
        """Each period's value of `kind`, and the stamp they were read under: the current
        ones kept here, the others read at once by `read(first, last)` (the span from the
        first period lacking to the last, both included) and filed. A period `read` gives
        nothing for is `absent`."""
        stamp = self.stamp()  # before the read begins
        found = {period: self.get(kind, workspace_id, period) for period in periods}
        lacking = [period for period, value in found.items() if value is MISSING]
        if lacking:
            got = await read(lacking[0], lacking[-1])
            span = periods[periods.index(lacking[0]) : periods.index(lacking[-1]) + 1]
            for period in span:
                found[period] = got.get(period, absent)
                self.put(kind, workspace_id, period, stamp, found[period])
        return stamp, found

    def wrote(self, workspace_id: UUID, periods: Iterable[Any]) -> None:
        """These periods of the workspace changed (called after the commit)."""
        if len(self._written) >= MEMO_ITEMS:  # forgetting writes would revive old values
            self._values.clear()
            self._written.clear()
        now = next(self._clock)
        for period in periods:
            self._written[(workspace_id, period)] = now

    def wrote_all(self, workspace_id: UUID) -> None:
        """Any period of the workspace may have changed (called after the commit)."""
        self._cleared[workspace_id] = next(self._clock)


_MEMOS: weakref.WeakKeyDictionary[sa.Engine, Memo] = weakref.WeakKeyDictionary()


def memo_of(conn: Connection) -> Memo | None:
    """The memo a read through `conn` may use: None on PostgreSQL, and inside a write
    transaction (which may read rows of its own that it then rolls back)."""
    if not isinstance(conn, InlineConnection):
        return None
    if conn.sync_connection.get_execution_options().get(WRITE_OPTION):
        return None
    return _memo(conn)


def _memo(conn: InlineConnection) -> Memo:
    """The memo of the SQLite database of `conn`."""
    engine = conn.sync_connection.engine
    memo = _MEMOS.get(engine)
    if memo is None:  # first use, maybe on two threads at once: one memo wins for both
        memo = _MEMOS.setdefault(engine, Memo())
    return memo


def _wrote(conn: Connection, periods: Iterable[tuple[UUID, Any]]) -> None:
    """Mark (workspace, period) pairs written once the open transaction commits."""
    if not isinstance(conn, InlineConnection):
        return
    memo = _memo(conn)
    by_workspace: dict[UUID, set[Any]] = {}
    for workspace_id, period in periods:
        by_workspace.setdefault(workspace_id, set()).add(period)

    def mark() -> None:
        for workspace_id, written in by_workspace.items():
            memo.wrote(workspace_id, written)

    after_commit(mark)


def _wrote_all(conn: Connection, workspace_id: UUID) -> None:
    if isinstance(conn, InlineConnection):
        memo = _memo(conn)
        after_commit(lambda: memo.wrote_all(workspace_id))


def wrote_hours(conn: Connection, hours: Iterable[tuple[UUID, datetime]]) -> None:
    """`ttft_hours` rows of these (workspace, hour) pairs were written in this transaction."""
    _wrote(conn, ((workspace_id, hour_of(hour)) for workspace_id, hour in hours))


def _upsert(conn: Connection, table: sa.Table, key: Sequence[str], sums: Sequence[str]) -> Any:
    """`INSERT … ON CONFLICT (key) DO UPDATE SET s = s + excluded.s` for each sum, with one
    bind parameter per column (run with many rows: one statement, one round trip)."""
    insert = upsert_insert(conn.dialect.name)
    columns = [*key, *sums]
    statement = insert(table).values(
        {name: sa.bindparam(name, type_=table.c[name].type) for name in columns}
    )
    return statement.on_conflict_do_update(
        index_elements=list(key),
        set_={name: table.c[name] + statement.excluded[name] for name in sums},
    )


def cost_sums(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Ledger rows (every `cost_events` column) summed per `cost_days` key."""
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (
            row["workspace_id"],
            day_of(row["created_at"]),
            row["agent_id"] or NO_ID,
            row["api_key_id"] or NO_ID,
            row["provider"],
            row["model"],
            row["source"],
        )
        total = sums.get(key)
        if total is None:
            total = sums[key] = dict(zip(COST_KEY, key, strict=True)) | dict.fromkeys(COST_SUMS, 0)
        total["calls"] += 1
        total["input_tokens"] += row["input_tokens"]
        total["cached_input_tokens"] += row["cached_input_tokens"]
        total["output_tokens"] += row["output_tokens"]
        total["cost_usd"] += row["cost_usd"]
    return list(sums.values())


class _Additions:
    """What a write transaction adds to the rollups, made just before it commits."""

    __slots__ = ("costs", "ttfts")

    def __init__(self) -> None:
        self.costs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.ttfts: dict[tuple[UUID, datetime, int], int] = {}

    def add_costs(self, sums: Iterable[dict[str, Any]]) -> None:
        for total in sums:
            key = tuple(total[name] for name in COST_KEY)
            held = self.costs.get(key)
            if held is None:
                self.costs[key] = total
            else:
                for name in COST_SUMS:
                    held[name] += total[name]

    def add_ttfts(self, counts: Mapping[tuple[UUID, datetime, int], int]) -> None:
        for key, n in counts.items():
            self.ttfts[key] = self.ttfts.get(key, 0) + n

    async def flush(self, conn: Connection) -> None:
        """Both upserts, in the order every writer takes these rows' locks."""
        if self.ttfts:
            await conn.execute(
                ttft_upsert(conn),
                [
                    {"workspace_id": ws, "hour": hour, "bucket": bucket, "runs": n}
                    for (ws, hour, bucket), n in sorted(self.ttfts.items())
                ],
            )
        if self.costs:
            await conn.execute(
                _upsert(conn, cost_days, COST_KEY, COST_SUMS),
                [self.costs[key] for key in sorted(self.costs, key=cost_order)],
            )
        self.costs, self.ttfts = {}, {}


def cost_order(key: Sequence[Any]) -> tuple[Any, ...]:
    """A `cost_days` key's place in the order its rows are locked in: as PostgreSQL sorts
    (uuid, date, uuid, uuid, text COLLATE "C" ×3), which `gateway.record_costs` uses too."""
    ws, day, agent, api_key, provider, model, source = key
    return (ws, day, agent, api_key, provider.encode(), model.encode(), source.encode())


async def settle(conn: Connection) -> None:
    """Make what `conn`'s write transaction added so far, for a read of the rollups in it."""
    pending = deferred(conn, "rollups", _Additions)
    if pending is not None and (pending.costs or pending.ttfts):
        await pending.flush(conn)


def gathers(conn: Connection) -> bool:
    """Whether `conn` is a write transaction, whose additions are made as it commits."""
    return deferred(conn, "rollups", _Additions) is not None


async def _gather(conn: Connection, add: Callable[[_Additions], None]) -> None:
    """Add to what the write transaction of `conn` adds as it commits; outside one, now."""
    pending = deferred(conn, "rollups", _Additions)
    if pending is not None:
        add(pending)
        return
    now = _Additions()
    add(now)
    await now.flush(conn)


async def add_costs(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
    """Add ledger rows just inserted (in this transaction) to `cost_days` as it commits."""
    sums = cost_sums(rows)
    if sums:
        _wrote(conn, ((s["workspace_id"], s["day"]) for s in sums))
        await _gather(conn, lambda additions: additions.add_costs(sums))


async def subtract_costs(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> None:
    """Take ledger rows just deleted (in this transaction) out of `cost_days`; a key left
    without calls goes."""
    sums = cost_sums(rows)
    if not sums:
        return
    for total in sums:
        for name in COST_SUMS:
            total[name] = -total[name]
    sums.sort(key=lambda total: cost_order([total[name] for name in COST_KEY]))
    await conn.execute(_upsert(conn, cost_days, COST_KEY, COST_SUMS), sums)
    c = cost_days.c
    days = sorted({(s["workspace_id"], s["day"]) for s in sums})
    _wrote(conn, days)
    await conn.execute(
        cost_days.delete().where(
            c.workspace_id == sa.bindparam("ws", type_=c.workspace_id.type),
            c.day == sa.bindparam("d", type_=c.day.type),
            c.calls <= 0,
        ),
        [{"ws": ws, "d": day} for ws, day in days],
    )


def agent_keys(agent_id: UUID) -> sa.Select[tuple[UUID]]:
    """The agent's API keys (its delete takes them along)."""
    return sa.select(api_keys.c.id).where(api_keys.c.agent_id == agent_id)


async def forget_agent(
    conn: Connection, workspace_id: UUID, agent_id: UUID, key_ids: Sequence[UUID]
) -> None:
    """After an agent and its API keys were deleted: their rows in `cost_days` move to
    `NO_ID`, as the ledger's rows lost them (`ON DELETE SET NULL`)."""
    c = cost_days.c
    gone = [agent_id, *key_ids]
    where = sa.and_(
        c.workspace_id == workspace_id, sa.or_(c.agent_id.in_(gone), c.api_key_id.in_(gone))
    )
    moved = [dict(row._mapping) for row in await conn.execute(sa.select(cost_days).where(where))]
    if not moved:
        return
    _wrote(conn, ((workspace_id, row["day"]) for row in moved))
    await conn.execute(cost_days.delete().where(where))
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in moved:
        row["agent_id"] = NO_ID if row["agent_id"] in gone else row["agent_id"]
        row["api_key_id"] = NO_ID if row["api_key_id"] in gone else row["api_key_id"]
        key = tuple(row[name] for name in COST_KEY)
        if key in merged:
            for name in COST_SUMS:
                merged[key][name] += row[name]
        else:
            merged[key] = row
    await conn.execute(_upsert(conn, cost_days, COST_KEY, COST_SUMS), list(merged.values()))


def ttft_upsert(conn: Connection) -> Any:
    """The upsert adding `runs` to one bucket of one hour."""
    return _upsert(conn, ttft_hours, _TTFT_KEY, ("runs",))


async def add_ttfts(conn: Connection, runs: Iterable[tuple[UUID, datetime, float]]) -> None:
    """Count runs, each (workspace, start, ttft_ms), in `ttft_hours`, one upsert."""
    counts: dict[tuple[UUID, datetime, int], int] = {}
    for workspace_id, started_at, ttft_ms in runs:
        key = (workspace_id, hour_of(started_at), bucket_of(ttft_ms))
        counts[key] = counts.get(key, 0) + 1
    if counts:
        _wrote(conn, ((ws, hour) for ws, hour, _bucket in counts))
        await _gather(conn, lambda additions: additions.add_ttfts(counts))


async def rebuild(conn: Connection, workspace_id: UUID) -> None:
    """Compute a workspace's rollups again from its ledger rows and runs, for rows changed
    behind the store's back (a restore, a manual fix): what retention took from the runs is
    then no longer counted in `ttft_hours`."""
    await settle(conn)  # what this transaction added is in the rows counted below
    await conn.execute(cost_days.delete().where(cost_days.c.workspace_id == workspace_id))
    await conn.execute(ttft_hours.delete().where(ttft_hours.c.workspace_id == workspace_id))
    _wrote_all(conn, workspace_id)
    c = cost_events.c
    ledger = await conn.execute(
        sa.select(
            c.workspace_id,
            c.created_at,
            c.agent_id,
            c.api_key_id,
            c.provider,
            c.model,
            c.source,
            c.input_tokens,
            c.cached_input_tokens,
            c.output_tokens,
            c.cost_usd,
        ).where(c.workspace_id == workspace_id)
    )
    await add_costs(conn, [dict(row._mapping) for row in ledger])
    r = runs.c
    timed = await conn.execute(
        sa.select(r.workspace_id, r.started_at, r.ttft_ms).where(
            r.workspace_id == workspace_id, r.ttft_ms.is_not(None), r.started_at.is_not(None)
        )
    )
    await add_ttfts(conn, [(row.workspace_id, row.started_at, row.ttft_ms) for row in timed])
