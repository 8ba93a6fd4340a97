"""`bullpen bench --scenario queue` at a tiny scale: it runs end to end and reports sane figures.

The freed-slot wake's gaps are computed from the runs' own timestamps (`wake_gaps`): checked
here on hand-made rows too, so a gap is never taken across an overlap or before a run queued.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bullpen.bench.queueapi import RunTimes
from bullpen.bench.runqueue import wake_gaps
from tests.support.postgres import PG_ADMIN_URL
from tests.support.processes import bench_report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_queue_scenario_reports_throughput_latency_and_fairness(backend: str) -> None:
    args = ["--backend", backend, "--runs", "200", "--samples", "5", "--wake-runs", "4", "--json"]
    if backend == "postgres":
        args += ["--workers", "2", "--pg-url", PG_ADMIN_URL]
    report = bench_report(["--scenario", "queue", *args], timeout=230)
    assert report["scenario"] == "queue" and report["backend"] == backend
    counts = [t["workers"] for t in report["throughput"]]
    assert counts == ([1] if backend == "sqlite" else [2])
    for t in report["throughput"]:
        assert t["runs"] == 200 and t["not_done"] == 0 and t["runs_per_s"] > 0
    idle = report["claim_to_start_ms"]["idle"]
    assert idle["count"] == 5 and 0 <= idle["p50_ms"] <= idle["p99_ms"]
    wake = report["freed_slot_wake"]
    layouts = ["one process"] + (["API + 2 workers"] if backend == "postgres" else [])
    assert [w["layout"] for w in wake] == layouts
    for w in wake:
        assert w["runs"] == 4 and w["overlaps"] == 0  # capped at one run at a time
        # Every task was queued before a worker ran: each later run waited for the slot.
        assert w["not_waiting"] == 0 and w["gaps_ms"]["count"] == 3
        assert 0 <= w["gaps_ms"]["p50_ms"] <= w["gaps_ms"]["p95_ms"] <= w["gaps_ms"]["max_ms"]
    noisy = report["noisy_neighbour"]
    if backend == "postgres":
        assert noisy["b_alone"]["count"] > 0 and noisy["b_crowded"]["count"] > 0
        assert noisy["a_submitted"] > noisy["b_crowded"]["count"]
    else:
        assert noisy == {}


def test_wake_gaps_skip_runs_not_yet_queued_and_count_overlaps() -> None:
    t0 = datetime(2026, 12, 5, tzinfo=UTC)

    def run(name: str, queued: float, started: float, finished: float) -> RunTimes:
        at = [t0 + timedelta(seconds=s) for s in (queued, started, finished)]
        return RunTimes(name, "done", at[0], at[1], at[2])

    rows = [
        run("d", 0.0, 3.5, 4.0),  # waited, started 0.5 s after c finished
        run("a", 0.0, 0.1, 1.0),
        run("b", 0.0, 1.25, 2.0),  # waited, started 0.25 s after a finished
        run("c", 2.5, 2.6, 3.0),  # queued after b finished: no wait to measure
        run("e", 0.0, 3.9, 5.0),  # started before d finished: the cap did not hold
    ]
    gaps, not_waiting, overlaps = wake_gaps(rows)
    assert sorted(gaps) == [0.25, 0.5]
    assert not_waiting == 1 and overlaps == 1
