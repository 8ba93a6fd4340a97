"""`bullpen bench --baseline-ref REV` (the reference scenario against a revision) and
`bullpen bench --tracing` (against itself with tracing on), tiny scale.

The whole command runs as a process with `HEAD` as the baseline: two servers from two source
trees, one round each, the figures per stage for both and the ratios, in the JSON.
"""

from __future__ import annotations

import subprocess

import aiohttp
import pytest

from bullpen.bench.otlpsink import otlp_sink
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
    keys = {*FIGURES, "errors_total", "pool_saturation_max_pct", "rss_max_mb", "cpu_ms_per_task"}
    for server in ("current", "baseline"):
        assert set(total[server]) == keys
        assert total[server]["cpu_ms_per_task"] > 0
        assert report["stages"][0][server]["cpu_ms_per_task"] is None  # whole rounds only
        assert total[server]["errors_total"] == 0, report["results"]
        assert total[server]["created_per_s"] > 0 and total[server]["rss_max_mb"] > 0
        assert total[server]["added_ttft_p50_ms"] is not None
        assert total[server]["pool_saturation_max_pct"] is None  # SQLite has no pool gauge
    assert set(total["ratio"]) == keys - {"errors_total"}
    assert total["ratio"]["created_per_s"] > 0
    assert total["ratio"]["cpu_ms_per_task"] == pytest.approx(  # current / baseline
        total["current"]["cpu_ms_per_task"] / total["baseline"]["cpu_ms_per_task"], rel=0.01
    )
    assert report["errors_total"] == 0
    assert report["exported"] is None


@pytest.mark.timeout(200)
def test_tracing_runs_this_code_untraced_and_traced_and_the_spans_arrive() -> None:
    """`--tracing`: the same code twice, the second exporting every span to the bench's own
    OTLP receiver; the report says how many spans arrived and what tracing cost per task."""
    args = ["--tracing", "--scale", "0.04", "--peak", "3", "--hold", "2", "--json"]
    report = bench_report(args, timeout=190)
    assert [s["name"] for s in report["servers"]] == ["current", "traced"]
    assert report["servers"][0]["commit"] == report["servers"][1]["commit"]
    total = report["stages"][-1]
    done = sum(
        r["report"]["total"]["completed"] for r in report["results"] if r["server"] == "traced"
    )
    exported = report["exported"]
    # A task is at least an HTTP request's span, a run's and an LLM call's with its attempt.
    assert exported["refused"] == 0 and exported["spans"] >= 4 * done > 0, exported
    assert total["traced"]["cpu_ms_per_task"] > 0 and total["current"]["cpu_ms_per_task"] > 0
    assert total["ratio"]["cpu_ms_per_task"] == pytest.approx(
        total["traced"]["cpu_ms_per_task"] / total["current"]["cpu_ms_per_task"], rel=0.01
    )
    assert report["errors_total"] == 0


async def test_the_otlp_sink_counts_spans_and_refuses_what_is_not_an_export() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    export = ExportTraceServiceRequest()
    scope = export.resource_spans.add().scope_spans.add()
    for name in ("a", "b", "c"):
        scope.spans.add().name = name
    body = export.SerializeToString()
    async with otlp_sink() as sink, aiohttp.ClientSession() as http:
        url = sink.url + "/v1/traces"
        protobuf = {"Content-Type": "application/x-protobuf"}
        async with http.post(url, data=body, headers=protobuf) as resp:
            assert resp.status == 200
        async with http.post(url, data=b"\xff\xff not protobuf", headers=protobuf) as resp:
            assert resp.status == 400
        async with http.post(url, json={"resourceSpans": []}) as resp:
            assert resp.status == 400
    assert (sink.requests, sink.spans, sink.bytes, sink.refused) == (1, 3, len(body), 2)
