"""`bullpen bench --scenario queue` at a tiny scale: it runs end to end and reports sane figures."""

from __future__ import annotations

import pytest

from tests.support.postgres import PG_ADMIN_URL
from tests.support.processes import bench_report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_queue_scenario_reports_throughput_latency_and_fairness(backend: str) -> None:
    args = ["--backend", backend, "--runs", "200", "--samples", "5", "--json"]
    if backend == "postgres":
        args += ["--workers", "1,2", "--pg-url", PG_ADMIN_URL]
    report = bench_report(["--scenario", "queue", *args], timeout=230)
    assert report["scenario"] == "queue" and report["backend"] == backend
    counts = [t["workers"] for t in report["throughput"]]
    assert counts == ([1] if backend == "sqlite" else [1, 2])
    for t in report["throughput"]:
        assert t["runs"] == 200 and t["not_done"] == 0 and t["runs_per_s"] > 0
    idle = report["claim_to_start_ms"]["idle"]
    assert idle["count"] == 5 and 0 <= idle["p50_ms"] <= idle["p99_ms"]
    noisy = report["noisy_neighbour"]
    if backend == "postgres":
        assert noisy["b_alone"]["count"] > 0 and noisy["b_crowded"]["count"] > 0
        assert noisy["a_submitted"] > noisy["b_crowded"]["count"]
    else:
        assert noisy == {}
