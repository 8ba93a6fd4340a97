"""`bullpen bench --baseline-ref REV` (the reference scenario against a revision), tiny scale.

The whole command runs as a process with `HEAD` as the baseline: two servers from two source
trees, one round each, the figures per stage for both and the ratios, in the JSON.
"""

from __future__ import annotations

import subprocess

import pytest

from bullpen.bench.refcompare import FIGURES
from bullpen.bench.spawn import project_root
from tests.support.processes import bench_report


@pytest.mark.timeout(200)
def test_the_reference_scenario_against_head_reports_both_servers_per_stage() -> None:
    head = subprocess.run(
        ["git", "-C", str(project_root()), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = ["--baseline-ref", "HEAD", "--scale", "0.04", "--peak", "3", "--hold", "2", "--json"]
    report = bench_report(args, timeout=190)
    assert report["scenario"] == "reference" and report["rounds"] == 1  # the default
    assert [s["name"] for s in report["servers"]] == ["current", "baseline"]
    assert report["servers"][1]["commit"] == head
    assert [(r["round"], r["server"]) for r in report["results"]] == [
        (1, "current"),
        (1, "baseline"),
    ]
    names = ["ramp-2", "hold-2", "ramp-3", "hold-3", "ramp-down", "total"]
    assert [s["stage"] for s in report["stages"]] == names
    total = report["stages"][-1]
    keys = {*FIGURES, "errors_total", "pool_saturation_max_pct", "rss_max_mb"}
    for server in ("current", "baseline"):
        assert set(total[server]) == keys
        assert total[server]["errors_total"] == 0, report["results"]
        assert total[server]["created_per_s"] > 0 and total[server]["rss_max_mb"] > 0
        assert total[server]["added_ttft_p50_ms"] is not None
        assert total[server]["pool_saturation_max_pct"] is None  # SQLite has no pool gauge
    assert set(total["ratio"]) == keys - {"errors_total"}
    assert total["ratio"]["created_per_s"] > 0
    assert report["errors_total"] == 0
