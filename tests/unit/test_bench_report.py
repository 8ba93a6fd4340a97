"""Bench report: percentiles, summaries of empty stages, the table and the JSON shape."""

import io
import json
import time
from collections import Counter

import pytest
from rich.console import Console

from bullpen.bench.loadgen import machine_cpu
from bullpen.bench.relaybench import Level, Side
from bullpen.bench.report import (
    Distribution,
    Snapshot,
    StageSamples,
    live_progress,
    percentile,
    render_table,
    summarize,
    to_json,
)
from bullpen.bench.stages import Stage

HUNDRED = [float(i) for i in range(1, 101)]


@pytest.mark.parametrize(("p", "expected"), [(1, 1), (50, 50), (95, 95), (99, 99), (100, 100)])
def test_nearest_rank_on_one_to_hundred(p: float, expected: float) -> None:
    assert percentile(HUNDRED, p) == expected


def test_percentiles_on_small_samples() -> None:
    assert percentile([7.0], 99) == 7.0
    assert percentile([7.0], 50) == 7.0
    ten = [float(i) for i in range(1, 11)]
    assert percentile(ten, 50) == 5.0
    assert percentile(ten, 90) == 9.0
    assert percentile(ten, 95) == 10.0
    assert percentile(ten, 99) == 10.0
    assert percentile([1.0, 2.0], 50) == 1.0
    assert percentile([], 95) is None


@pytest.mark.parametrize("p", [0, -1, 101])
def test_percentile_range(p: float) -> None:
    with pytest.raises(ValueError):
        percentile([1.0], p)


def test_distribution_converts_seconds_to_ms_and_sorts() -> None:
    d = Distribution.of_seconds([0.003, 0.001, 0.002, 0.010])
    assert d.count == 4
    assert d.mean == pytest.approx(4.0)
    assert d.p50 == pytest.approx(2.0)
    assert d.p95 == pytest.approx(10.0)
    assert d.max == pytest.approx(10.0)
    empty = Distribution.of_seconds([])
    assert (empty.count, empty.mean, empty.p95, empty.p99, empty.max) == (0, None, None, None, None)


STAGES = [Stage(2.0, 4, "ramp-4"), Stage(4.0, 4, "hold-4"), Stage(1.0, 0, "ramp-down")]


def _result(*, pool: bool):
    busy = StageSamples(
        created=8,
        completed=6,
        create_s=[0.001 * i for i in range(1, 9)],
        ttft_s=[0.010, 0.020, 0.030, 0.040, 0.050, 0.060],
        completion_s=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
        errors=Counter({"end_failed": 1, "seq_gap": 1}),
        rss_bytes=[100 * 1024 * 1024, 120 * 1024 * 1024],
        machine_busy=[0.5, 0.75, 1.0],
        vus_max=4,
    )
    if pool:
        busy.pool_in_use = [2.0, 5.0]
        busy.pool_size = [10.0, 10.0]
        busy.pool_saturation = [0.2, 0.5]
    ramp = StageSamples(
        created=2,
        completed=2,
        create_s=[0.5, 0.5],
        ttft_s=[1.0, 1.0],
        completion_s=[2.0, 2.0],
        errors=Counter({"create_http_503": 3}),
        rss_bytes=[90 * 1024 * 1024],
        vus_max=4,
    )
    return summarize(
        "http://127.0.0.1:1",
        0.5,
        STAGES,
        [ramp, busy, StageSamples()],
        wall_s=7.5,
        client_cpu_s=0.75,
        loop_lag_max_ms=3.0,
        metrics_errors=1,
        texts=None,
        error_examples={"seq_gap": "expected 3 got 4"},
    )


def test_rows_rates_and_total() -> None:
    result = _result(pool=True)
    ramp, hold, down = result.rows
    assert (ramp.vus_from, ramp.vus_target, hold.vus_from, down.vus_target) == (0, 4, 4, 0)
    assert ramp.created_per_s == pytest.approx(1.0)
    assert hold.created_per_s == pytest.approx(2.0)
    assert hold.completed_per_s == pytest.approx(1.5)
    assert hold.ttft_ms.p95 == pytest.approx(60.0)
    assert hold.pool_saturation_max == pytest.approx(0.5)
    total = result.total
    assert total.created == 10
    assert total.completed == 8
    assert total.duration_s == pytest.approx(7.0)
    assert total.errors == {"create_http_503": 3, "end_failed": 1, "seq_gap": 1}
    assert total.errors_total == 5
    assert total.completion_ms.max == pytest.approx(2000.0)
    assert total.rss_max_bytes == 120 * 1024 * 1024
    assert result.error_kinds == ["create_http_503", "end_failed", "seq_gap"]


def test_empty_stage_has_none_values_and_dashes() -> None:
    result = _result(pool=False)
    down = result.rows[2]
    assert down.created == 0
    assert down.create_ms.mean is None
    assert down.ttft_ms.p99 is None
    assert down.rss_max_bytes is None
    assert down.pool_saturation_max is None
    console = Console(record=True, width=220, file=io.StringIO())
    console.print(render_table(result))
    text = console.export_text()
    lines = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    assert "–" in lines["ramp-down"]
    assert "n/a" in lines["hold-4"]  # SQLite exposes no pool gauges
    assert "0→4" in lines["ramp-4"]
    assert "create_http_503=3" in text


def test_table_shows_pool_saturation_on_postgres() -> None:
    console = Console(record=True, width=220, file=io.StringIO())
    console.print(render_table(_result(pool=True)))
    hold = next(line for line in console.export_text().splitlines() if "hold-4" in line)
    assert "50%" in hold


def test_to_json_shape() -> None:
    data = to_json(_result(pool=True))
    json.dumps(data)  # plain JSON-able
    assert list(data) == [
        "version",
        "base_url",
        "think_s",
        "duration_s",
        "wall_s",
        "stages",
        "results",
        "total",
        "error_kinds",
        "error_examples",
        "client",
    ]
    assert data["stages"][1] == {
        "index": 1,
        "name": "hold-4",
        "duration_s": 4.0,
        "from": 4,
        "target": 4,
    }
    row_keys = {
        "name",
        "vus_from",
        "vus_target",
        "vus_max",
        "duration_s",
        "created",
        "completed",
        "created_per_s",
        "completed_per_s",
        "create_ms",
        "ttft_ms",
        "provider_ttft_ms",
        "ttft_overhead_ms",
        "completion_ms",
        "rss_max_mb",
        "rss_mean_mb",
        "pool_in_use_max",
        "pool_in_use_mean",
        "pool_size_max",
        "pool_saturation_max_pct",
        "pool_saturation_mean_pct",
        "errors",
        "errors_total",
        "machine_busy_mean_pct",
    }
    assert all(set(row) == row_keys for row in data["results"])
    assert data["results"][1]["machine_busy_mean_pct"] == 75.0
    assert data["results"][0]["machine_busy_mean_pct"] is None
    assert set(data["total"]) == row_keys
    assert set(data["results"][0]["ttft_ms"]) == {"count", "mean", "p50", "p95", "p99", "max"}
    assert data["results"][1]["pool_saturation_max_pct"] == 50.0
    assert data["results"][1]["rss_max_mb"] == 120.0
    assert data["results"][2]["completion_ms"]["p99"] is None
    assert data["error_kinds"] == ["create_http_503", "end_failed", "seq_gap"]
    assert data["client"] == {
        "cpu_s": 0.75,
        "cpu_pct": 10.0,
        "loop_lag_max_ms": 3.0,
        "metrics_errors": 1,
    }


def test_summarize_needs_one_sample_per_stage() -> None:
    with pytest.raises(ValueError):
        summarize(
            "x",
            1.0,
            STAGES,
            [StageSamples()],
            wall_s=1,
            client_cpu_s=0,
            loop_lag_max_ms=0,
            metrics_errors=0,
            texts=None,
        )


def test_live_progress_shows_snapshots() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    with live_progress(10.0, console=console) as progress:
        progress.update(Snapshot(5.0, 10.0, 1, "hold-4", 4, 4, 12, 10, 1))
        progress(Snapshot(10.0, 10.0, 2, "ramp-down", 0, 0, 20, 19, 1, finished=True))
    text = out.getvalue()
    assert "ramp-down" in text
    assert "created 20" in text
    assert "done 19" in text
    assert "errors 1" in text


def test_relay_levels_report_the_median_and_99th_percentile_differences() -> None:
    direct = Side(ttft_ms=[float(v) for v in range(1, 101)], total_ms=[100.0] * 100)
    # The relay adds 2 ms to most streams and 40 ms to the slowest two.
    relay = Side(ttft_ms=[v + 2.0 for v in range(1, 99)] + [139.0, 140.0], total_ms=[102.0] * 100)
    level = Level(200, direct=[direct], relay=[relay])
    summary = level.summary()
    assert summary["ttft_p50_direct_ms"] == 50.0
    assert summary["ttft_p50_added_ms"] == 2.0
    assert summary["ttft_p99_added_ms"] == 40.0  # 139 against 99
    assert summary["total_p99_added_ms"] == 2.0


def test_relay_levels_report_the_hop_as_its_own_difference_from_direct() -> None:
    direct = Side(ttft_ms=[float(v) for v in range(1, 101)], total_ms=[100.0] * 100)
    hop = Side(ttft_ms=[v + 0.5 for v in range(1, 101)], total_ms=[101.0] * 100)
    relay = Side(ttft_ms=[v + 2.0 for v in range(1, 101)], total_ms=[103.0] * 100)
    level = Level(50, direct=[direct], relay=[relay], hop=[hop], hop_cpu_ms_per_request=[1.5])
    summary = level.summary()
    assert summary["ttft_p50_added_ms"] == 2.0
    assert summary["ttft_p50_hop_added_ms"] == 0.5
    assert summary["total_p99_hop_added_ms"] == 1.0
    assert summary["ttft_p50_hop_ms"] == 50.5
    assert summary["requests_hop"] == 100
    assert summary["hop_cpu_ms_per_request"] == 1.5
    # Without hop rounds, no hop figures (rather than figures of nothing).
    assert "ttft_p50_hop_added_ms" not in Level(50, direct=[direct], relay=[relay]).summary()


def test_the_machines_cpu_time_grows_and_busy_stays_within_it() -> None:
    first = machine_cpu()
    assert first is not None  # Linux: /proc/stat
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # busy for a while
        pass
    second = machine_cpu()
    assert second is not None
    assert 0 <= first[0] <= first[1] and 0 <= second[0] <= second[1]
    assert second[0] > first[0] and second[1] > first[1]
    assert second[0] - first[0] <= second[1] - first[1]
