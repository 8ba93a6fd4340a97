"""The rollups (migration 0021) answer what the raw rows do, on every backend.

`cost_days`: the ledger's totals per group and UTC day from the rollup (whole days) and the
ledger (the parts of a day a range cuts) equal the old aggregation of every ledger row, on
random rows written as the ledger writes them, for random ranges, groupings and `only` sets;
and still after retention deleted the oldest rows and an agent with calls was deleted.
`ttft_hours`: runs ended through the queue's own end give percentiles within the histogram's
documented error of the exact ones. Days and hours read before (on SQLite kept in the rollups'
memo) answer every later write of them, and a write that rolls back leaves nothing there.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import uuid
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from bullpen.store import agents as agent_store
from bullpen.store import costs, gateway, identity, latency, retention, rollups
from bullpen.store.base import Connection, Store
from bullpen.store.rollups import GROWTH, NO_ID, cost_sums
from bullpen.store.tables import cost_days, cost_events, ttft_hours
from tests.support.seed import NOW, finished_run, workspace_with_agent

_C = cost_events.c
DAYS = 6


async def _raw_totals(
    conn: Connection,
    workspace_id: uuid.UUID,
    *,
    since: datetime,
    until: datetime,
    group_by: str | None,
    by_day: bool,
    only: Collection[str | None] | None = None,
) -> list[dict[str, Any]]:
    """The aggregation `costs.totals` did before the rollup: every ledger row of the range."""
    keys: list[Any] = []
    if by_day:
        if conn.dialect.name == "postgresql":
            day = sa.func.to_char(sa.func.timezone("UTC", _C.created_at), "YYYY-MM-DD")
        else:
            day = sa.func.strftime("%Y-%m-%d", _C.created_at)
        keys.append(day.label("day"))
    if group_by is not None:
        keys.append(costs.GROUPS[group_by].label("key"))
    query = sa.select(
        *keys,
        sa.func.count().label("calls"),
        sa.func.coalesce(sa.func.sum(_C.input_tokens), 0).label("input_tokens"),
        sa.func.coalesce(sa.func.sum(_C.cached_input_tokens), 0).label("cached_input_tokens"),
        sa.func.coalesce(sa.func.sum(_C.output_tokens), 0).label("output_tokens"),
        sa.func.coalesce(sa.func.sum(_C.cost_usd), 0.0).label("cost_usd"),
    ).where(_C.workspace_id == workspace_id, _C.created_at >= since, _C.created_at < until)
    if only is not None and group_by is not None:
        column = costs.GROUPS[group_by]
        named: list[Any] = [key for key in only if key is not None]
        if group_by in ("agent", "api_key"):
            named = [uuid.UUID(key) for key in named]
        picked = column.in_(named)
        query = query.where(sa.or_(picked, column.is_(None)) if None in only else picked)
    if keys:
        query = query.group_by(*keys).order_by(*keys)
    rows = [dict(row._mapping) for row in await conn.execute(query)]
    for row in rows:
        if "key" in row and row["key"] is not None:
            row["key"] = str(row["key"])
        for name in ("calls", "input_tokens", "cached_input_tokens", "output_tokens"):
            row[name] = int(row[name])
        row["cost_usd"] = pytest.approx(float(row["cost_usd"]), rel=1e-9, abs=1e-12)
    return rows


class Ledger:
    """A workspace with agents, API keys and random ledger rows over `DAYS` UTC days."""

    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        self.ws = uuid.UUID(int=0)
        self.agents: list[uuid.UUID] = []
        self.keys: list[uuid.UUID] = []

    async def setup(self) -> None:
        self.ws, first = await workspace_with_agent(self.store)
        async with self.store.write() as conn:
            for name in ("b", "gone"):
                self.agents.append(
                    await agent_store.create_agent(
                        conn,
                        workspace_id=self.ws,
                        name=name,
                        title="",
                        adapter="llm",
                        config={"provider": "simulated", "model": "sim-1"},
                        now=NOW,
                    )
                )
            self.agents.insert(0, first)
            for i, agent in enumerate(self.agents[1:]):  # a key of each of the two
                self.keys.append(
                    await identity.create_api_key(
                        conn,
                        workspace_id=self.ws,
                        user_id=None,
                        name=f"k{i}",
                        prefix=f"bp_{i}",
                        digest=bytes([i]) * 32,
                        scopes=["*"],
                        now=NOW,
                        agent_id=agent,
                    )
                )

    def row(self) -> dict[str, Any]:
        rng = self.rng
        agent = rng.choice([*self.agents, None])
        relay = agent is None or rng.random() < 0.4
        return {
            "workspace_id": self.ws,
            "run_id": None,
            "agent_id": agent,
            "user_id": None,
            "api_key_id": rng.choice([*self.keys, None]) if relay else None,
            "provider": rng.choice(["openai", "anthropic"]),
            "model": rng.choice(["m-small", "m-large", "m-mini"]),
            "input_tokens": rng.randint(0, 5000),
            "cached_input_tokens": rng.randint(0, 100),
            "output_tokens": rng.randint(0, 900),
            "cost_usd": rng.random() / 100,
            "created_at": NOW + timedelta(microseconds=rng.randint(0, DAYS * 86_400_000_000)),
            "source": "relay" if relay else "run",
            "estimated": rng.random() < 0.1,
        }

    async def write(self, count: int) -> None:
        """Rows in batches of random sizes, as the ledger (autocommit) and a run's end do."""
        left = count
        while left:
            batch = [self.row() for _ in range(min(left, self.rng.randint(1, 60)))]
            left -= len(batch)
            opened = self.store.autocommit() if self.rng.random() < 0.5 else self.store.write()
            async with opened as conn:
                await gateway.record_costs(conn, batch)

    def instant(self) -> datetime:
        """A random instant of the ledger's days, or a midnight, or just past one."""
        day = NOW + timedelta(days=self.rng.randint(0, DAYS))
        kind = self.rng.random()
        if kind < 0.4:
            return day
        if kind < 0.5:
            return day + timedelta(microseconds=1)
        return day + timedelta(microseconds=self.rng.randint(0, 86_399_999_999))

    async def compare(self, rounds: int) -> None:
        """`costs.totals` equals the raw aggregation for random questions."""
        groups = [None, *costs.GROUPS]
        for _ in range(rounds):
            since, until = sorted((self.instant(), self.instant()))
            if self.rng.random() < 0.1:
                since, until = NOW - timedelta(days=1), NOW + timedelta(days=DAYS + 1)
            group_by = self.rng.choice(groups)
            by_day = self.rng.random() < 0.5
            only: list[str | None] | None = None
            async with self.store.read() as conn:
                if group_by is not None and self.rng.random() < 0.5:
                    every = await _raw_totals(
                        conn, self.ws, since=since, until=until, group_by=group_by, by_day=False
                    )
                    keys = [row["key"] for row in every]
                    only = self.rng.sample(keys, k=self.rng.randint(0, len(keys)))
                    if self.rng.random() < 0.3:
                        only.append(
                            "00000000-0000-0000-0000-00000000beef"
                            if group_by
                            in (
                                "agent",
                                "api_key",
                            )
                            else "nothing"
                        )
                question: dict[str, Any] = {
                    "since": since,
                    "until": until,
                    "group_by": group_by,
                    "by_day": by_day,
                    "only": only,
                }
                want = await _raw_totals(conn, self.ws, **question)
                got = await costs.totals(conn, self.ws, **question)
            assert got == want, question


@pytest.mark.parametrize("seed", [1, 2])
async def test_totals_from_the_rollup_equal_the_raw_aggregation(store: Store, seed: int) -> None:
    ledger = Ledger(store, random.Random(seed))
    await ledger.setup()
    other = Ledger(store, random.Random(seed + 100))
    other.ws, agent = await workspace_with_agent(store, "w2")
    other.agents, other.keys = [agent, agent, agent], []
    await other.write(50)  # another workspace's calls, never counted
    await ledger.write(700)
    async with store.read() as conn:
        raw = (await conn.execute(sa.select(sa.func.count()).select_from(cost_events))).scalar()
        rolled = (await conn.execute(sa.select(sa.func.count()).select_from(cost_days))).scalar()
    assert raw == 750 and rolled is not None and rolled < 750
    await ledger.compare(40)

    # Retention takes the oldest rows (up to a cut inside a day) out of the rollup too.
    cutoff = NOW + timedelta(days=2, hours=7, minutes=13)
    async with store.write() as conn:
        while await retention.delete_old_usage(conn, cutoff, 37):
            pass
    async with store.read() as conn:
        left = await conn.execute(sa.select(cost_days.c.calls).where(cost_days.c.calls <= 0))
        assert left.first() is None  # emptied keys went
    await ledger.compare(30)

    # An agent with relay calls (through its own key) goes: its rows lose it, as the ledger's.
    async with store.write() as conn:
        assert await agent_store.delete_agent(conn, ledger.ws, ledger.agents[2])
        kept = await conn.execute(
            sa.select(cost_days.c.agent_id).where(
                sa.or_(
                    cost_days.c.agent_id == ledger.agents[2],
                    cost_days.c.api_key_id == ledger.keys[1],
                )
            )
        )
        assert kept.first() is None
        gone = await conn.execute(
            sa.select(sa.func.count()).where(
                cost_days.c.workspace_id == ledger.ws, cost_days.c.agent_id == NO_ID
            )
        )
        assert gone.scalar_one() > 0
    ledger.agents.pop()
    ledger.keys.pop()
    await ledger.write(100)
    await ledger.compare(30)

    # Computed again from the ledger, the rollup is what the writes kept.
    kept = await _rolled(store, ledger.ws)
    async with store.write() as conn:
        await rollups.rebuild(conn, ledger.ws)
    assert await _rolled(store, ledger.ws) == kept


async def _rolled(store: Store, ws: uuid.UUID) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    d = cost_days.c
    async with store.read() as conn:
        found = await conn.execute(sa.select(cost_days).where(d.workspace_id == ws))
        return {
            tuple(row[:7]): (*row[7:11], pytest.approx(row[11], rel=1e-9, abs=1e-12))
            for row in found
        }


def _inclusive(values: list[float], p: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(p * 100) - 1]


async def test_ttft_percentiles_from_the_histogram_are_within_its_error(store: Store) -> None:
    rng = random.Random(7)
    ws, agent = await workspace_with_agent(store)
    hours: dict[str, list[float]] = {}
    for i in range(45):
        started = NOW + timedelta(seconds=rng.randint(0, 3 * 3600 - 1))
        ttft = rng.choice([0.0, rng.uniform(0, 1), rng.lognormvariate(6, 1.2)])
        await finished_run(store, ws, agent, started, ttft, cost_usd=0.001 * i)
        hours.setdefault(started.strftime("%Y-%m-%dT%H:00"), []).append(ttft)
    async with store.read() as conn:
        got = await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW + timedelta(hours=3))
        counted = await conn.execute(sa.select(sa.func.sum(ttft_hours.c.runs)))
        assert counted.scalar_one() == 45
        # The runs' ends wrote their ledger rows, and the rollup has them.
        rolled = await costs.totals(
            conn, ws, since=NOW, until=NOW + timedelta(days=1), group_by=None, by_day=False
        )
    assert rolled[0]["calls"] == 45
    assert rolled[0]["cost_usd"] == pytest.approx(sum(0.001 * i for i in range(45)))
    assert [row["hour"] for row in got] == sorted(hours)
    for row in got:
        values = hours[row["hour"]]
        assert row["runs"] == len(values)
        for p in (0.5, 0.95):
            exact = _inclusive(values, p)
            bound = max((GROWTH - 1) * exact, 1.0 if exact < 1.0 else 0.0)
            assert abs(row[f"p{round(p * 100)}_ms"] - exact) <= bound + 1e-9, (row, exact)


def test_the_rollup_days_are_utc() -> None:
    """A call just before a UTC midnight, given in another offset, is on its UTC day."""
    at = datetime(2026, 1, 1, 23, 30, tzinfo=UTC).astimezone(timezone(timedelta(hours=5)))
    row = {
        "workspace_id": NO_ID,
        "created_at": at,
        "agent_id": None,
        "api_key_id": None,
        "provider": "p",
        "model": "m",
        "source": "relay",
        "input_tokens": 1,
        "cached_input_tokens": 0,
        "output_tokens": 2,
        "cost_usd": 0.5,
    }
    (summed,) = cost_sums([row, row])
    assert summed["day"].isoformat() == "2026-01-01" and summed["calls"] == 2


async def _ledger_of(store: Store, seed: int, rows: int) -> Ledger:
    """A workspace with `rows` random ledger rows over the ledger's days."""
    ledger = Ledger(store, random.Random(seed))
    await ledger.setup()
    await ledger.write(rows)
    return ledger


def _every_day(**question: Any) -> dict[str, Any]:
    """A question about the whole days of the ledger's range."""
    return {"since": NOW, "until": NOW + timedelta(days=DAYS), **question}


async def test_days_read_before_answer_every_later_write_of_them(store: Store) -> None:
    """Whole days read once (on SQLite then kept in the rollups' memo) answer what every
    later write did to them: a ledger row in a past day, retention, an agent's delete, and a
    rebuild after a change behind the store's back."""
    ledger = await _ledger_of(store, 3, 200)
    whole = _every_day(group_by="agent")

    async def answers_as_raw() -> None:
        async with store.read() as conn:
            for by_day in (False, True):
                want = await _raw_totals(conn, ledger.ws, by_day=by_day, **whole)
                got = await costs.totals(conn, ledger.ws, by_day=by_day, **whole)
                assert got == want, by_day
            top = [row["key"] for row in want[:2]]
            want = await _raw_totals(conn, ledger.ws, by_day=True, only=top, **whole)
            assert await costs.totals(conn, ledger.ws, by_day=True, only=top, **whole) == want

    await answers_as_raw()
    row = ledger.row() | {"created_at": NOW + timedelta(days=2, hours=1), "cost_usd": 0.5}
    async with store.write() as conn:
        await gateway.record_costs(conn, [row])
    await answers_as_raw()
    async with store.write() as conn:
        await retention.delete_old_usage(conn, NOW + timedelta(days=1, hours=3), 1_000)
    await answers_as_raw()
    async with store.write() as conn:
        assert await agent_store.delete_agent(conn, ledger.ws, ledger.agents[2])
    await answers_as_raw()
    async with store.write() as conn:  # behind the store's back: no rollup write of it
        await conn.execute(cost_days.update().values(calls=cost_days.c.calls + 1))
        await rollups.rebuild(conn, ledger.ws)
    await answers_as_raw()


async def test_hours_read_before_answer_the_runs_that_end_in_them(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    span = {"since": NOW, "until": NOW + timedelta(hours=3)}

    async def counted() -> list[tuple[str, int]]:
        async with store.read() as conn:
            rows = await latency.ttft_per_hour(conn, ws, **span)
        return [(row["hour"], row["runs"]) for row in rows]

    await finished_run(store, ws, agent, NOW + timedelta(minutes=10), 100.0)
    assert await counted() == [("2026-01-01T00:00", 1)]
    await finished_run(store, ws, agent, NOW + timedelta(minutes=20), 300.0)
    await finished_run(store, ws, agent, NOW + timedelta(hours=2, minutes=5), 50.0)
    assert await counted() == [("2026-01-01T00:00", 2), ("2026-01-01T02:00", 1)]
    async with store.write() as conn:
        assert await retention.delete_old_ttft(conn, NOW + timedelta(hours=2), 100) == 2
    assert await counted() == [("2026-01-01T02:00", 1)]


async def test_sqlite_reads_a_month_again_only_where_it_was_written(store: Store) -> None:
    """The memo's point: a page read again reads the rollups only for what changed."""
    if not store.is_sqlite:
        pytest.skip("PostgreSQL reads the rollups each time (other processes write them)")
    ledger = await _ledger_of(store, 4, 100)
    await finished_run(store, ws := ledger.ws, ledger.agents[0], NOW, 10.0)
    days, hours = _every_day(group_by="model"), _every_day()
    read: list[str] = []  # the parameters of each read of a rollup

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "FROM cost_days" in statement or "FROM ttft_hours" in statement:
            read.append(str(parameters))

    assert isinstance(store.engine, sa.Engine)
    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        async with store.read() as conn:
            first = await costs.totals(conn, ws, by_day=False, **days)
            first_hours = await latency.ttft_per_hour(conn, ws, **hours)
        assert len(read) == 2
        async with store.read() as conn:
            assert await costs.totals(conn, ws, by_day=False, **days) == first
            assert await latency.ttft_per_hour(conn, ws, **hours) == first_hours
        assert len(read) == 2  # nothing was read again
        row = ledger.row() | {"created_at": NOW + timedelta(days=3, hours=1), "model": "m-new"}
        async with store.write() as conn:
            await gateway.record_costs(conn, [row])
        async with store.read() as conn:
            again = await costs.totals(conn, ws, by_day=False, **days)
        assert len(read) == 3 and "m-new" in {r["key"] for r in again}
        assert read[-1].count("2026-01-04") == 2, read[-1]  # from that day to that day
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)


def test_a_value_read_before_a_write_commits_is_not_used_after_it() -> None:
    memo = rollups.Memo()
    ws = uuid.uuid4()
    before = memo.stamp()  # a read begins
    memo.wrote(ws, ["d"])  # a write of its period commits meanwhile
    memo.put("k", ws, "d", before, "old")
    assert memo.get("k", ws, "d") is rollups.MISSING
    memo.put("k", ws, "d", memo.stamp(), "new")
    assert memo.get("k", ws, "d") == "new"
    memo.wrote(ws, ["e"])  # another period
    assert memo.get("k", ws, "d") == "new"
    memo.put("span", ws, ("d", "e"), memo.stamp(), 7)
    assert memo.get("span", ws, ("d", "e"), covering=["d", "e"]) == 7
    memo.wrote(ws, ["e"])
    assert memo.get("span", ws, ("d", "e"), covering=["d", "e"]) is rollups.MISSING
    memo.wrote_all(ws)
    assert memo.get("k", ws, "d") is rollups.MISSING
    assert memo.get("k", uuid.uuid4(), "d") is rollups.MISSING


def test_a_memo_past_its_bound_starts_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollups, "MEMO_ITEMS", 10)
    memo = rollups.Memo()
    ws = uuid.uuid4()
    memo.put("k", ws, "a", memo.stamp(), {n: n for n in range(5)})  # 6 items
    memo.put("k", ws, "b", memo.stamp(), {n: n for n in range(3)})  # 10
    assert memo.get("k", ws, "a") is not rollups.MISSING
    memo.put("k", ws, "c", memo.stamp(), 1)  # 11: over, so only this one is kept
    assert memo.get("k", ws, "a") is rollups.MISSING and memo.get("k", ws, "c") == 1


class _Undone(Exception):
    pass


async def test_a_read_inside_a_write_sees_its_rows_and_nothing_of_them_stays(
    store: Store,
) -> None:
    ledger = await _ledger_of(store, 5, 80)
    whole = _every_day(group_by="model", by_day=False)
    async with store.read() as conn:
        before = await costs.totals(conn, ledger.ws, **whole)
    row = ledger.row() | {"created_at": NOW + timedelta(days=2, hours=1), "model": "m-new"}
    with pytest.raises(_Undone):
        async with store.write() as conn:
            await gateway.record_costs(conn, [row])
            inside = await costs.totals(conn, ledger.ws, **whole)
            assert "m-new" in {r["key"] for r in inside}
            raise _Undone  # rolled back
    async with store.read() as conn:
        assert await costs.totals(conn, ledger.ws, **whole) == before


# SQLite runs one write transaction at a time: the two could not interleave there.
@pytest.mark.parametrize("backend", ["postgres", "pgbouncer"])
async def test_writers_adding_to_the_same_rollup_rows_in_opposite_orders_do_not_deadlock(
    store: Store,
) -> None:
    """Two transactions each end a run (its TTFT) and record a call (its cost), in opposite
    orders, each making its first addition before the other makes its second: the shape of
    two worker processes' group commits of run ends. Were the rollup rows locked as each
    addition came, each would wait for the other (PostgreSQL: `deadlock detected` after its
    `deadlock_timeout`); made in one order as each commits, both commit and both count."""
    ledger = await _ledger_of(store, 6, 0)
    row = ledger.row() | {"created_at": NOW + timedelta(hours=1), "model": "m-both"}
    started = [asyncio.Event(), asyncio.Event()]

    async def ttft(conn: Connection) -> None:
        await rollups.add_ttfts(conn, [(ledger.ws, NOW, 123.0)])

    async def cost(conn: Connection) -> None:
        await gateway.record_costs(conn, [dict(row)])

    async def both(me: int, steps: list[Callable[[Connection], Awaitable[None]]]) -> None:
        async with store.write() as conn:
            await steps[0](conn)
            started[me].set()
            await started[1 - me].wait()
            await steps[1](conn)

    await asyncio.wait_for(asyncio.gather(both(0, [ttft, cost]), both(1, [cost, ttft])), 20)
    async with store.read() as conn:
        runs_counted = (await conn.execute(sa.select(sa.func.sum(ttft_hours.c.runs)))).scalar()
        calls = (
            await conn.execute(sa.select(cost_days.c.calls).where(cost_days.c.model == "m-both"))
        ).scalar_one()
    assert (runs_counted, calls) == (2, 2)
