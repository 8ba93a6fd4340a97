"""`bullpen bench --scenario streams` at a tiny scale: Bullpen's streams and the direct baseline
both deliver every stream's tokens, and the report carries both."""

from __future__ import annotations

import pytest

from tests.support.processes import bench_report


@pytest.mark.timeout(240)
def test_the_streams_scenario_times_bullpens_streams_against_the_simulator_read_directly() -> None:
    args = ["--scenario", "streams", "--backend", "sqlite", "--streams", "3", "--duration", "1"]
    report = bench_report([*args, "--json"], timeout=230)
    (level,) = report["levels"]
    direct = level["direct"]
    for side in (level, direct):
        assert side["streams"] == 3 and side["live"] == 3, side
        assert side["errors"] == {}, side
        # 3 streams at 20 tokens/s for 1 s, give or take the edges of the window.
        assert 40 <= side["tokens_per_s"] <= 80, side
        assert 0 <= side["delivery_p50_ms"] <= side["delivery_p99_ms"] < 5000, side
    assert direct["direct"] is None
    assert level["cpu_cores"]["api"] > 0 and level["bullpen_rss_mb"] > 0
