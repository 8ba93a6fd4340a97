"""The workflow benchmark against a real server: it counts workflows and measures wake-ups."""

from __future__ import annotations

import pytest

from bullpen.bench.workflowbench import WorkflowResult, measure
from tests.support.servers import RunningServer


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.with_settings(rate_limit_key_rps=10_000.0, rate_limit_key_burst=10_000)
async def test_the_workflow_bench_completes_workflows_and_times_each_wake(
    server: RunningServer,
) -> None:
    key = server.auth["Authorization"].removeprefix("Bearer ")
    result = await measure(
        server.base_url, key, backend="sqlite", in_flight=3, duration_s=2.0, warmup_s=0.2
    )
    summary = result.summary()
    assert result.completed >= 3 and result.failed == 0
    # Two parents wake per workflow: the lead and the analyst.
    assert len(result.wake_ms) == 2 * result.completed
    assert all(0 <= ms < 5000 for ms in result.wake_ms)
    assert summary["workflows_per_s"] == round(result.completed / 2.0, 2)
    assert summary["wake_p99_ms"] is not None and summary["wake_p50_ms"] <= summary["wake_p99_ms"]


def test_an_empty_measurement_reports_no_percentiles() -> None:
    summary = WorkflowResult("sqlite", 1, 1.0).summary()
    assert summary["workflows_per_s"] == 0 and summary["wake_p99_ms"] is None
