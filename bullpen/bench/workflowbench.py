"""`bullpen bench --scenario workflow`: three-level agent workflows per second, and how soon a
waiting parent resumes once its last child has ended.

One server (SQLite: one process; PostgreSQL: the same, on a scratch database) with the
simulator in its own process at its default latency. A team is made through the API: `lead`
delegates to `analyst` and `writer` and waits; `analyst` delegates to `researcher` and waits;
`writer` answers at once; `researcher` streams the simulator's usual answer. Each woken agent
finishes with a result built from its reports'. `--workflows` of them are kept in flight for
`--duration` seconds (a new one starts as one ends); each is followed on its task's event
stream until it closes.

Reported: workflows/s (completed lead tasks per second of the measured window), the end-to-end
time of a workflow, and the wake latency: for each parent, from its last child's run ending to
its own next run starting, both stamped by the worker's clock in the database.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp

from bullpen.bench.report import percentile
from bullpen.bench.spawn import NO_RUN_RATE_BREAKER, Backend, spawn_server

TEAM_SCRIPTS: dict[str, list[dict[str, Any]] | None] = {
    "lead": [
        {
            "tool_calls": [
                {"name": "delegate", "arguments": {"agent": "analyst", "prompt": "Analyse it"}},
                {"name": "delegate", "arguments": {"agent": "writer", "prompt": "Draft it"}},
            ]
        },
        {"tool_calls": [{"name": "finish", "arguments": {"result": "Report: {{context}}"}}]},
    ],
    "analyst": [
        {
            "tool_calls": [
                {"name": "delegate", "arguments": {"agent": "researcher", "prompt": "Dig in"}}
            ]
        },
        {"tool_calls": [{"name": "finish", "arguments": {"result": "Analysis: {{context}}"}}]},
    ],
    "writer": [{"text": "A first draft of the report."}],
    "researcher": None,  # the simulator's usual answer
}
MANAGERS = {"analyst": "lead", "writer": "lead", "researcher": "analyst"}
# One API key drives every workflow: its rate limit is not what is measured.
_UNLIMITED = {
    "BULLPEN_RATE_LIMIT_KEY_RPS": "1000000",
    "BULLPEN_RATE_LIMIT_KEY_BURST": "1000000",
    "BULLPEN_RATE_LIMIT_WORKSPACE_RPS": "1000000",
    "BULLPEN_RATE_LIMIT_WORKSPACE_BURST": "1000000",
}


@dataclass(slots=True)
class WorkflowResult:
    """What one measurement found."""

    backend: str
    in_flight: int
    duration_s: float
    completed: int = 0
    failed: int = 0
    total_s: list[float] = field(default_factory=list)
    wake_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The figures, rounded, as JSON."""
        total, wake = sorted(self.total_s), sorted(self.wake_ms)

        def r(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "backend": self.backend,
            "in_flight": self.in_flight,
            "duration_s": self.duration_s,
            "completed": self.completed,
            "failed": self.failed,
            "workflows_per_s": round(self.completed / self.duration_s, 2),
            "workflow_p50_s": r(percentile(total, 50), 2),
            "workflow_p99_s": r(percentile(total, 99), 2),
            "wakes": len(wake),
            "wake_p50_ms": r(percentile(wake, 50)),
            "wake_p99_ms": r(percentile(wake, 99)),
            "wake_max_ms": r(wake[-1] if wake else None),
        }


class _Api:
    def __init__(self, http: aiohttp.ClientSession, base_url: str, key: str) -> None:
        self._http, self._base = http, base_url
        self._auth = {"Authorization": f"Bearer {key}"}

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        while True:
            async with self._http.request(
                method, self._base + path, json=body, headers=self._auth
            ) as resp:
                payload = await resp.json()
                if resp.status == 429:  # the key's rate limit: wait as told, then again
                    await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
                    continue
                if resp.status >= 300:
                    raise RuntimeError(f"{method} {path}: {resp.status} {payload}")
                return payload

    async def until_closed(self, task_id: str) -> None:
        """Follow the task's event stream until its `close` event (the task has ended)."""
        headers = {**self._auth, "Accept": "text/event-stream"}
        url = f"{self._base}/api/v1/tasks/{task_id}/events"
        async with self._http.get(url, headers=headers) as resp:
            async for line in resp.content:
                if line.startswith(b"event: close"):
                    return
        raise RuntimeError(f"the stream of task {task_id} ended without a close event")


async def _make_team(api: _Api) -> str:
    ids: dict[str, str] = {}
    for name in ("lead", "analyst", "writer", "researcher"):
        script = TEAM_SCRIPTS[name]
        prompt = f"You are the {name}."
        if script is not None:
            prompt += f"\n<sim-script>{json.dumps(script)}</sim-script>"
        body = {
            "name": name,
            "config": {"provider": "simulated", "model": "sim-1", "system_prompt": prompt},
            "max_concurrent_runs": 1000,
            "reports_to": ids.get(MANAGERS.get(name, "")),
            **NO_RUN_RATE_BREAKER,
        }
        ids[name] = (await api.call("POST", "/api/v1/agents", body))["id"]
    return ids["lead"]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def _wakes(api: _Api, task_id: str, out: list[float]) -> None:
    """Wake latencies of this task and of every waiting task below it."""
    runs = (await api.call("GET", f"/api/v1/tasks/{task_id}/runs"))["items"]
    children = (await api.call("GET", f"/api/v1/tasks/{task_id}/dependencies"))["children"]
    if not children:
        return
    ends: list[datetime] = []
    for child in children:
        await _wakes(api, child["id"], out)
        child_runs = (await api.call("GET", f"/api/v1/tasks/{child['id']}/runs"))["items"]
        ends.append(max(_at(run["finished_at"]) for run in child_runs))
    woken = [run for run in runs if run["started_at"] and _at(run["queued_at"]) >= max(ends)]
    if woken:
        out.append((_at(woken[0]["started_at"]) - max(ends)).total_seconds() * 1000)


async def measure(
    base_url: str, key: str, *, backend: str, in_flight: int, duration_s: float, warmup_s: float
) -> WorkflowResult:
    """Keep `in_flight` workflows going; count those that end inside the measured window."""
    result = WorkflowResult(backend, in_flight, duration_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        api = _Api(http, base_url, key)
        lead = await _make_team(api)
        start = time.monotonic() + warmup_s
        stop = start + duration_s
        measured: list[str] = []

        async def one_after_another() -> None:
            while time.monotonic() < stop:
                began = time.monotonic()
                task = await api.call(
                    "POST",
                    "/api/v1/tasks",
                    {"prompt": "Write the report, please", "agent_id": lead},
                )
                await api.until_closed(task["id"])
                ended = time.monotonic()
                if start <= ended <= stop:
                    final = await api.call("GET", f"/api/v1/tasks/{task['id']}")
                    if final["status"] == "done":
                        result.completed += 1
                        result.total_s.append(ended - began)
                        measured.append(task["id"])
                    else:
                        result.failed += 1

        await asyncio.gather(*(one_after_another() for _ in range(in_flight)))
        for task_id in measured:
            await _wakes(api, task_id, result.wake_ms)
    return result


async def run_workflow_bench(
    backend: Backend,
    *,
    pg_admin_url: str,
    in_flight: list[int],
    duration_s: float,
    warmup_s: float,
    on_step: Callable[[str], None],
) -> list[WorkflowResult]:
    """Measure each in-flight level on its own fresh server."""
    out = []
    for level in in_flight:
        on_step(f"{backend}: {level} workflows in flight for {duration_s:g} s")
        async with spawn_server(
            backend, pg_admin_url=pg_admin_url, sim="process", env=_UNLIMITED
        ) as server:
            out.append(
                await measure(
                    server.base_url,
                    server.api_key,
                    backend=backend,
                    in_flight=level,
                    duration_s=duration_s,
                    warmup_s=warmup_s,
                )
            )
    return out
