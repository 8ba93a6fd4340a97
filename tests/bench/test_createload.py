"""The create-task bench scenario against real server processes.

A short real run: every create the client counted must be a task the server stored (read back
through the API), with no errors and runs left queued (the worker is off). `--baseline-ref HEAD`
runs the whole `bullpen bench` command with a second server from an extracted revision and the
floor (a bare endpoint, `bullpen.bench.floor`), which is also checked on its own.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys

import aiohttp
import pytest
from typer.testing import CliRunner

from bullpen.bench.createload import SERVER_ENV, CreateComparison, ServerInfo, run_create_load
from bullpen.bench.spawn import SpawnedServer, project_root, spawn_floor, spawn_server
from bullpen.cli import cli
from bullpen.settings import Settings
from tests.support.postgres import PG_ADMIN_URL

ROUND_KEYS = {
    "round",
    "server",
    "concurrency",
    "warmup_s",
    "duration_s",
    "created",
    "created_per_s",
    "created_total",
    "duplicate_ids",
    "latency_ms",
    "errors",
    "errors_total",
    "error_examples",
    "wall_s",
    "client_cpu_pct",
    "server_cpu_ms_per_create",
}
REPORT_KEYS = {
    "version",
    "scenario",
    "backend",
    "concurrency",
    "idempotency_key",
    "duration_s",
    "warmup_s",
    "rounds",
    "server_env",
    "servers",
    "results",
    "median",
    "ratio",
    "throughput_cost_pct",
    "goal",
    "floor_ratio",
    "floor_goal",
    "errors_total",
    "machine",
}
MEDIAN_KEYS = {"created_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_create", "errors_total"}


async def _stored_tasks(server: SpawnedServer) -> tuple[set[str], set[str]]:
    """Every task id in the workspace and the statuses of their runs, paging the list API."""
    ids: set[str] = set()
    run_statuses: set[str] = set()
    url: str | None = f"{server.base_url}/api/v1/tasks?limit=100"
    headers = {"Authorization": f"Bearer {server.api_key}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        while url is not None:
            async with http.get(url) as resp:
                assert resp.status == 200, await resp.text()
                page = await resp.json()
            for item in page["items"]:
                ids.add(item["id"])
                run_statuses.add(item["run"]["status"])
            cursor = page["next_cursor"]
            url = f"{server.base_url}/api/v1/tasks?limit=100&cursor={cursor}" if cursor else None
    return ids, run_statuses


async def test_every_counted_create_is_a_stored_task() -> None:
    async with spawn_server("sqlite", env=SERVER_ENV, sim="none") as server:
        result = await run_create_load(
            server.base_url,
            server.api_key,
            server.agent_id,
            concurrency=4,
            duration_s=2.0,
            warmup_s=0.5,
            server_pid=server.pid,
        )
        ids, run_statuses = await _stored_tasks(server)
    assert result.errors == {}, result.error_examples
    assert result.errors_total == 0
    assert result.duplicate_ids == 0
    assert 0 < result.created <= result.created_total == len(ids)
    assert result.latency_ms.count == result.created
    assert result.created_per_s == result.created / 2.0
    assert result.server_cpu_ms_per_create is not None and result.server_cpu_ms_per_create > 0
    assert run_statuses == {"queued"}  # the worker is off: only the create path ran

    row = result.as_dict()
    assert set(row) == ROUND_KEYS
    assert set(row["latency_ms"]) == {"count", "mean", "p50", "p95", "p99", "max"}
    assert row["latency_ms"]["p50"] <= row["latency_ms"]["p99"]
    report = CreateComparison(
        backend="sqlite",
        concurrency=4,
        duration_s=2.0,
        warmup_s=0.5,
        rounds=1,
        servers=[ServerInfo("current", "working tree", None)],
        results=[result],
    ).as_dict()
    assert set(report) == REPORT_KEYS
    assert set(report["median"]) == {"current"} and set(report["median"]["current"]) == (
        MEDIAN_KEYS
    )
    assert report["ratio"] is None and report["goal"]["met"] is None
    assert report["floor_ratio"] is None and report["floor_goal"]["met"] is None
    json.dumps(report)  # plain JSON


def _stored_keys(server: SpawnedServer) -> int:
    path = Settings(data_dir=server.data_dir).resolved_database_url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])


async def test_each_create_carries_a_fresh_key_unless_told_not_to() -> None:
    async with spawn_server("sqlite", env=SERVER_ENV, sim="none") as server:
        seen = []
        for keyed in (True, False):
            result = await run_create_load(
                server.base_url,
                server.api_key,
                server.agent_id,
                concurrency=2,
                duration_s=0.5,
                warmup_s=0.1,
                keyed=keyed,
            )
            assert result.errors == {}, result.error_examples
            seen.append((result.created_total, _stored_keys(server)))
    (keyed_total, after_keyed), (plain_total, after_plain) = seen
    assert after_keyed == keyed_total > 0  # one stored outcome per create: each key was new
    assert plain_total > 0 and after_plain == after_keyed


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_floor_stores_one_row_a_create_and_checks_the_bearer(backend: str) -> None:
    async with spawn_floor(backend, pg_admin_url=PG_ADMIN_URL) as floor:  # type: ignore[arg-type]
        url = f"{floor.base_url}/api/v1/tasks"
        body = {"prompt": "Summarise the numbers", "agent_id": "a1"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body) as resp:
                assert resp.status == 401
            auth = {"Authorization": "Bearer anything"}
            async with http.post(url, json={"prompt": 3}, headers=auth) as resp:
                assert resp.status == 422
            ids = set()
            for _ in range(3):
                async with http.post(url, json=body, headers=auth) as resp:
                    assert resp.status == 201
                    created = await resp.json()
                assert created["agent_id"] == "a1" and created["status"] == "queued"
                ids.add(created["id"])
        result = await run_create_load(
            floor.base_url,
            "any-token",
            "a1",
            concurrency=4,
            duration_s=1.0,
            warmup_s=0.2,
            server="floor",
            server_pid=floor.pid,
        )
    assert len(ids) == 3
    assert result.errors == {}, result.error_examples
    assert result.created > 0 and result.duplicate_ids == 0
    assert result.server_cpu_ms_per_create is not None and result.server_cpu_ms_per_create > 0


@pytest.mark.timeout(240)
def test_baseline_ref_head_runs_both_servers_alternately() -> None:
    head = subprocess.run(
        ["git", "-C", str(project_root()), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    args = ["--scenario", "create", "--backend", "sqlite", "--baseline-ref", "HEAD", "--json"]
    args += ["--concurrency", "4", "--duration", "0.5", "--warmup", "0.2", "--rounds", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "bullpen", "bench", *args],
        capture_output=True,
        text=True,
        timeout=220,  # three servers start at once on a shared 2-core machine
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == REPORT_KEYS
    assert report["scenario"] == "create" and report["backend"] == "sqlite"
    assert report["servers"][1]["ref"] == "HEAD" and report["servers"][1]["commit"] == head
    assert [s["name"] for s in report["servers"]] == ["current", "baseline", "floor"]
    order = [(r["round"], r["server"]) for r in report["results"]]
    assert order == [
        *((1, name) for name in ("current", "baseline", "floor")),
        *((2, name) for name in ("current", "baseline", "floor")),
    ]
    for row in report["results"]:
        assert set(row) == ROUND_KEYS
        assert row["created"] > 0 and row["errors_total"] == 0, row["error_examples"]
    assert set(report["median"]) == {"current", "baseline", "floor"}
    assert set(report["ratio"]) == {"created_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_create"}
    assert report["ratio"]["created_per_s"] > 0
    assert isinstance(report["goal"]["met"], bool)
    assert set(report["floor_ratio"]) == set(report["ratio"])
    assert report["floor_ratio"]["created_per_s"] > 0
    assert isinstance(report["floor_goal"]["met"], bool)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "create", "--think", "2"], "--think applies to --scenario reference"),
        (["--scenario", "create", "--url", "http://x"], "--url applies to --scenario reference"),
        (["--rounds", "2"], "--rounds applies to the reference scenario with --baseline-ref"),
        (
            ["--baseline-ref", "HEAD", "--url", "http://x", "--api-key", "k", "--agent-id", "a"],
            "--baseline-ref starts both servers: it cannot use --url",
        ),
        (["--scenario", "queue", "--baseline-ref", "HEAD"], "applies to --scenario reference or"),
        (["--tracing", "--baseline-ref", "HEAD"], "--tracing compares this code with itself"),
        (["--scenario", "relay", "--tracing"], "--tracing applies to --scenario reference only"),
        (["--floor"], "--floor applies to --scenario create only"),
        (["--no-idempotency-key"], "--idempotency-key applies to --scenario create only"),
        (["--scenario", "queue", "--wake-runs", "1"], "--wake-runs must be 0"),
        (["--wake-runs", "5"], "--wake-runs applies to --scenario queue only"),
        (
            ["--scenario", "nope"],
            "--scenario must be reference, create, queue, relay, streams, workflow or ui",
        ),
        (["--workflows", "10"], "--workflows applies to --scenario workflow"),
        (["--api-processes", "2"], "--api-processes applies to --scenario relay"),
        (["--scenario", "relay", "--api-processes", "2"], "and 1 on SQLite"),
        (["--scenario", "relay", "--api-processes", "0"], "--api-processes must be >= 1"),
        (["--scenario", "workflow", "--workflows", "0"], "--workflows counts must be >= 1"),
        (["--runs", "10"], "--runs applies to --scenario queue"),
        (
            ["--scenario", "queue", "--rounds", "2"],
            "--rounds applies to --scenario reference, create or relay only",
        ),
        (["--scenario", "queue", "--workers", "x"], "--workers must be a comma-separated"),
        (["--scenario", "create", "--concurrency", "0"], "--concurrency and --rounds"),
    ],
)
def test_options_of_the_other_scenario_are_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["bench", *args])
    assert result.exit_code == 2
    # The message is in a box that may wrap: compare the words, without the box's edges.
    assert message in " ".join(result.output.replace("│", " ").split())
