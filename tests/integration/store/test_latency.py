"""Time to first token per hour, on both backends: of whole hours, read from the histogram
the runs' ends keep, p50 and p95 are within its documented error (5 %) of Python's inclusive
quantiles; of hours the range cuts, equal to them (PostgreSQL's `percentile_cont`, SQLite's
ranks and interpolation); runs without a first token, outside the range or of another
workspace are left out."""

from __future__ import annotations

import statistics
import uuid
from datetime import datetime, timedelta

import pytest

from bullpen.errors import InvalidInput
from bullpen.store import latency
from bullpen.store.base import Store
from bullpen.store.rollups import GROWTH
from tests.support.seed import NOW, finished_run, workspace_with_agent

# Two busy hours (an odd and an even count, so both interpolate), one with a single run.
HOURS = {
    NOW + timedelta(hours=1, minutes=5): [120.0, 80.0, 300.0, 95.5, 410.0, 101.0, 99.0],
    NOW + timedelta(hours=2, minutes=59): [250.0, 10.0, 40.0, 1000.0],
    NOW + timedelta(hours=5): [33.0],
}


async def run_at(
    store: Store, ws: uuid.UUID, agent: uuid.UUID, started: datetime, ttft_ms: float | None
) -> None:
    await finished_run(store, ws, agent, started, ttft_ms)


def within(exact: float) -> object:
    """The histogram's bound: less than GROWTH - 1 of the exact value (1 ms below 1 ms)."""
    return pytest.approx(exact, rel=GROWTH - 1, abs=1.0 if exact < 1.0 else 0.0)


def inclusive(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (`percentile_cont`)."""
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(p * 100) - 1]


async def _seed(store: Store) -> uuid.UUID:
    ws, agent = await workspace_with_agent(store)
    other, other_agent = await workspace_with_agent(store, "w2")
    for start, values in HOURS.items():
        for i, value in enumerate(values):
            await run_at(store, ws, agent, start + timedelta(seconds=i), value)
    await run_at(store, ws, agent, NOW + timedelta(hours=1), None)  # no first token
    await run_at(store, ws, agent, NOW - timedelta(seconds=1), 5.0)  # before the range
    await run_at(store, ws, agent, NOW + timedelta(hours=6), 5.0)  # at its end (exclusive)
    await run_at(store, other, other_agent, NOW + timedelta(hours=1), 9999.0)

    return ws


async def test_percentiles_of_whole_hours_are_within_the_histograms_error(store: Store) -> None:
    ws = await _seed(store)
    async with store.read() as conn:
        got = await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW + timedelta(hours=6))
    want = [
        {
            "hour": start.strftime("%Y-%m-%dT%H:00"),
            "runs": len(values),
            "p50_ms": within(inclusive(values, 0.5)),
            "p95_ms": within(inclusive(values, 0.95)),
        }
        for start, values in HOURS.items()
    ]
    assert got == want
    # Spot checks that do not lean on statistics: the median of an even count is the mean
    # of the middle two; p95 of 4 values sits 85% of the way from the 3rd to the 4th.
    assert got[1]["p50_ms"] == within((40.0 + 250.0) / 2)
    assert got[1]["p95_ms"] == within(250.0 + 0.85 * (1000.0 - 250.0))
    # Not the exact figure: the test would pass without the histogram otherwise.
    assert got[0]["p50_ms"] != pytest.approx(
        inclusive(HOURS[NOW + timedelta(hours=1, minutes=5)], 0.5)
    )


async def test_hours_the_range_cuts_are_exact(store: Store) -> None:
    ws = await _seed(store)
    # From inside hour 1 (all its runs are later) to inside hour 2, whose runs start at
    # 2:59:00, :01, :02, :03: the first two are in; the hour between is whole (histogram).
    since, until = (
        NOW + timedelta(hours=1, minutes=1),
        NOW + timedelta(hours=2, minutes=59, seconds=2),
    )
    async with store.read() as conn:
        got = await latency.ttft_per_hour(conn, ws, since=since, until=until)
    one, two = HOURS[NOW + timedelta(hours=1, minutes=5)], [250.0, 10.0]
    assert got == [
        {
            "hour": "2026-01-01T01:00",
            "runs": len(one),
            "p50_ms": pytest.approx(inclusive(one, 0.5)),
            "p95_ms": pytest.approx(inclusive(one, 0.95)),
        },
        {
            "hour": "2026-01-01T02:00",
            "runs": 2,
            "p50_ms": pytest.approx(inclusive(two, 0.5)),
            "p95_ms": pytest.approx(inclusive(two, 0.95)),
        },
    ]


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
