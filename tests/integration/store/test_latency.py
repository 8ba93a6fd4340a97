"""Time to first token per hour, on both backends: the database's p50 and p95 equal Python's
inclusive quantiles (PostgreSQL's `percentile_cont`, SQLite's ranks and interpolation), runs
without a first token, outside the range or of another workspace are left out."""

from __future__ import annotations

import statistics
import uuid
from datetime import datetime, timedelta

import pytest

from bullpen.errors import InvalidInput
from bullpen.store import latency
from bullpen.store.base import Store
from bullpen.store.tables import runs
from tests.support.seed import NOW, new_task, workspace_with_agent

# Two busy hours (an odd and an even count, so both interpolate), one with a single run.
HOURS = {
    NOW + timedelta(hours=1, minutes=5): [120.0, 80.0, 300.0, 95.5, 410.0, 101.0, 99.0],
    NOW + timedelta(hours=2, minutes=59): [250.0, 10.0, 40.0, 1000.0],
    NOW + timedelta(hours=5): [33.0],
}


async def run_at(
    store: Store, ws: uuid.UUID, agent: uuid.UUID, started: datetime, ttft_ms: float | None
) -> None:
    _, run_id = await new_task(store, ws, agent, started)
    async with store.write() as conn:
        await conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(status="done", started_at=started, ttft_ms=ttft_ms)
        )


def inclusive(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (`percentile_cont`)."""
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(p * 100) - 1]


async def test_percentiles_per_hour_match_linear_interpolation(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    other, other_agent = await workspace_with_agent(store, "w2")
    for start, values in HOURS.items():
        for i, value in enumerate(values):
            await run_at(store, ws, agent, start + timedelta(seconds=i), value)
    await run_at(store, ws, agent, NOW + timedelta(hours=1), None)  # no first token
    await run_at(store, ws, agent, NOW - timedelta(seconds=1), 5.0)  # before the range
    await run_at(store, ws, agent, NOW + timedelta(hours=6), 5.0)  # at its end (exclusive)
    await run_at(store, other, other_agent, NOW + timedelta(hours=1), 9999.0)

    async with store.read() as conn:
        got = await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW + timedelta(hours=6))

    want = [
        {
            "hour": start.strftime("%Y-%m-%dT%H:00"),
            "runs": len(values),
            "p50_ms": pytest.approx(inclusive(values, 0.5)),
            "p95_ms": pytest.approx(inclusive(values, 0.95)),
        }
        for start, values in HOURS.items()
    ]
    assert got == want
    # Spot checks that do not lean on statistics: the median of an even count is the mean
    # of the middle two; p95 of 4 values sits 85% of the way from the 3rd to the 4th.
    assert got[1]["p50_ms"] == pytest.approx((40.0 + 250.0) / 2)
    assert got[1]["p95_ms"] == pytest.approx(250.0 + 0.85 * (1000.0 - 250.0))


async def test_an_empty_range_has_no_rows_and_too_many_hours_are_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, agent = await workspace_with_agent(store)
    async with store.read() as conn:
        assert await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW) == []
    for hour in range(3):
        await run_at(store, ws, agent, NOW + timedelta(hours=hour), 10.0)
    monkeypatch.setattr(latency, "MAX_HOURS", 2)
    async with store.read() as conn:
        with pytest.raises(InvalidInput, match="more than 2 hours"):
            await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW + timedelta(days=1))
